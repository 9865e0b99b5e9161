package edge

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"
)

// lineRecorder keeps the records a logger wrote.
type lineRecorder struct {
	mu    sync.Mutex
	lines []slog.Record
}

func (r *lineRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *lineRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.lines = append(r.lines, rec.Clone())
	r.mu.Unlock()
	return nil
}
func (r *lineRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *lineRecorder) WithGroup(string) slog.Handler      { return r }

func (r *lineRecorder) snapshot() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]slog.Record(nil), r.lines...)
}

func attr(rec slog.Record, key string) slog.Value {
	var v slog.Value
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

func TestRejectLogOneLinePerAddressPerInterval(t *testing.T) {
	rec := &lineRecorder{}
	l := newRejectLog(slog.New(rec), 50*time.Millisecond)
	defer l.close()
	logged := 0
	for i := range 1000 {
		if l.note("node rejected", "10.0.0.1:"+itoa(1000+i), "", "unknown_token") {
			logged++
		}
	}
	if !l.note("node rejected", "10.0.0.2:5", "", "unknown_token") {
		t.Error("the first refusal from another address was not logged")
	}
	if logged != 1 {
		t.Fatalf("%d of 1000 refusals from one address logged at once; want 1", logged)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(rec.snapshot()) < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	lines := rec.snapshot()
	if len(lines) != 3 {
		t.Fatalf("%d log lines; want 3 (two firsts, one count)", len(lines))
	}
	sum := lines[2]
	if sum.Message != "connections refused" || attr(sum, "address").String() != "10.0.0.1" || attr(sum, "count").Int64() != 999 {
		t.Fatalf("summary line: %s address=%v count=%v", sum.Message, attr(sum, "address"), attr(sum, "count"))
	}
	// A new interval starts with a line of its own again.
	if !l.note("node rejected", "10.0.0.1:1", "", "unknown_token") {
		t.Error("first refusal of a new interval not logged")
	}
}

func TestRejectLogCloseFlushes(t *testing.T) {
	rec := &lineRecorder{}
	l := newRejectLog(slog.New(rec), time.Hour)
	for range 5 {
		l.note("node handshake failed", "10.0.0.3:1", "", "timeout")
	}
	l.close()
	lines := rec.snapshot()
	if len(lines) != 2 || attr(lines[1], "count").Int64() != 4 {
		t.Fatalf("after close: %d lines", len(lines))
	}
	if l.note("x", "10.0.0.3:1", "", "y") {
		t.Error("logged after close")
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
