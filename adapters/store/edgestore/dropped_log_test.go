package edgestore_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"iop/adapters/store/edgestore"
	"iop/domain"
	"iop/internal/lockedbuf"
)

// Rows dropped within the interval after a "history rows dropped" line
// are not left unreported when no drop follows: Close logs them, so the
// lines count every dropped row.
func TestDroppedRowsAllLoggedByClose(t *testing.T) {
	buf := &lockedbuf.Buffer{}
	var metric int
	// One row fills the queue, and the writer sleeps for the interval: the
	// rows after it are dropped as "the write queue is full".
	s := open(t, sqliteDSN(t), edgestore.Options{QueueSize: 1, FlushInterval: time.Hour,
		Logger: slog.New(slog.NewJSONHandler(buf, nil)), Dropped: func(n int) { metric += n }})
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const rows = 6
	for i := range rows {
		s.RecordRun(domain.RunRecord{ID: fmt.Sprintf("run_%d", i), Node: "n1", Adapter: "exec", Status: domain.RunSucceeded, CreatedAt: t0, FinishedAt: t0})
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	logged, lines := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "history rows dropped" {
			logged += int(m["rows"].(float64))
			lines++
		}
	}
	if metric != rows-1 || logged != metric || lines > 2 {
		t.Fatalf("%d rows dropped (metric), %d logged in %d lines; want %d in at most 2:\n%s", metric, logged, lines, rows-1, buf.String())
	}
}
