package every_test

import (
	"context"
	"testing"
	"time"

	"iop/internal/every"
)

// The first call is at once, the next ones an interval after the one
// before, and Run returns when its context ends.
func TestRunAtOnceThenEveryInterval(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan time.Time, 16)
	done := make(chan struct{})
	began := time.Now()
	go func() {
		defer close(done)
		every.Run(ctx, 20*time.Millisecond, func(context.Context) { calls <- time.Now() })
	}()
	first := <-calls
	if first.Sub(began) > time.Second {
		t.Fatalf("first call after %v, want at once", first.Sub(began))
	}
	if second := <-calls; second.Sub(first) < 20*time.Millisecond {
		t.Fatalf("second call %v after the first, want at least the interval", second.Sub(first))
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
