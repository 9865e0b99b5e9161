package edge_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"iop/adapters/store/edgestore"
	"iop/application/edge"
	"iop/domain"
)

// A history read past the store's read timeout is the caller's timeout
// (504), not the database being down (503 history_unavailable); a listing
// of queued runs, which the edge's history never holds (the console asks
// for them on every load), is answered without a read.
func TestHistoryReadTimeoutAndQueuedRuns(t *testing.T) {
	ctx := context.Background()
	db, err := edgestore.Open(ctx, filepath.Join(t.TempDir(), "edge.db"))
	if err != nil {
		t.Fatal(err)
	}
	// Every read runs out of its time before it starts.
	s := edgestore.New(db, edgestore.Options{Retention: -1, ReadTimeout: time.Nanosecond})
	defer s.Close()
	h := edge.NewRunHistoryHandler(s)

	p, err := h.List(ctx, domain.RunQuery{Status: domain.RunQueued})
	if err != nil || p.Runs == nil || len(p.Runs) != 0 || p.Next != "" {
		t.Fatalf("queued runs: %+v, %v; want an empty page", p, err)
	}
	if _, err := h.List(ctx, domain.RunQuery{Status: domain.RunRunning}); domain.CodeOf(err) != domain.CodeTimeout {
		t.Fatalf("List: %v (code %s), want timeout", err, domain.CodeOf(err))
	}
	if _, err := h.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByKey}); domain.CodeOf(err) != domain.CodeTimeout {
		t.Fatalf("Usage: %v (code %s), want timeout", err, domain.CodeOf(err))
	}
	if _, err := h.Get(ctx, "run_x"); domain.CodeOf(err) != domain.CodeTimeout {
		t.Fatalf("Get: %v (code %s), want timeout", err, domain.CodeOf(err))
	}
}
