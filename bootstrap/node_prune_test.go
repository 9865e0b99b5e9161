package bootstrap_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/store/sqlite"
	"iop/bootstrap"
	"iop/domain"
	"iop/internal/lockedbuf"
)

// A node prunes its store at start: a run that finished longer ago than
// StoreRetention is gone, a recent one stays, and the pass is logged.
func TestNodePrunesItsStore(t *testing.T) {
	ctx := context.Background()
	dsn := "file:" + filepath.Join(t.TempDir(), "node.db") + "?cache=shared&mode=rwc"
	db, err := sqlite.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	runs := sqlite.NewRunStore(db)
	for id, at := range map[string]time.Time{"old": time.Now().Add(-3 * time.Hour), "new": time.Now()} {
		r, err := domain.NewRun(domain.RunRequest{RunID: id, Adapter: "exec"}, at)
		if err != nil {
			t.Fatal(err)
		}
		if err := runs.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := runs.UpdateRun(ctx, id, func(r *domain.Run) error {
			return r.Finish(domain.RunEvent{Type: domain.EventComplete}, at)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	var logs lockedbuf.Buffer
	node := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{
		// Nothing listens there: the node keeps retrying, which is all
		// this test needs of its link.
		Edge: "127.0.0.1:1", Token: "x", MinBackoff: time.Hour, DB: dsn,
		Logger:         slog.New(slog.NewTextHandler(&logs, nil)),
		StoreRetention: time.Hour,
	}), fx.NopLogger)
	node.RequireStart()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "node store pruned") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	node.RequireStop()
	out := logs.String()
	if !strings.Contains(out, "node store pruned") || !strings.Contains(out, "runs=1 ") || !strings.Contains(out, "store_retention=1h0m0s") {
		t.Fatalf("log %q; want a start line with the retention and a pruned line with runs=1", out)
	}

	db, err = sqlite.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	runs = sqlite.NewRunStore(db)
	if _, err := runs.GetRun(ctx, "old"); !errors.Is(err, domain.ErrRunNotFound) {
		t.Errorf("GetRun(old) after the node ran: %v, want ErrRunNotFound", err)
	}
	if _, err := runs.GetRun(ctx, "new"); err != nil {
		t.Errorf("GetRun(new): %v", err)
	}
}
