package lossreport_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/lossreport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type lines struct {
	mu      sync.Mutex
	firsts  int
	counts  []int
	changed chan struct{}
}

func newReporter(every time.Duration) (*lossreport.Reporter, *lines) {
	l := &lines{changed: make(chan struct{}, 100)}
	r := lossreport.New(every, func(error, []any) {
		l.mu.Lock()
		l.firsts++
		l.mu.Unlock()
		l.changed <- struct{}{}
	}, func(n int, _ error) {
		l.mu.Lock()
		l.counts = append(l.counts, n)
		l.mu.Unlock()
		l.changed <- struct{}{}
	})
	return r, l
}

// A burst is one line for its first loss and one for the rest, at Close
// at the latest: every loss is reported, none twice.
func TestBurstIsTwoLinesAndCloseReportsTheRest(t *testing.T) {
	r, l := newReporter(time.Hour)
	for range 30 {
		r.Lost(1, errors.New("disk full"), "run", "x")
	}
	r.Lost(5, errors.New("disk full"))
	if l.firsts != 1 || len(l.counts) != 0 {
		t.Fatalf("during the burst: %d first lines, summaries %v; want 1 and none", l.firsts, l.counts)
	}
	r.Close()
	r.Close()
	if len(l.counts) != 1 || l.counts[0] != 34 {
		t.Fatalf("summaries %v, want one of 34", l.counts)
	}
	r.Lost(1, errors.New("after close"))
	if l.firsts != 2 {
		t.Fatalf("a loss after Close is not logged at once")
	}
}

// What is counted after a line is reported by the timer once the interval
// has passed, with no loss or Close after it.
func TestTimerReportsPendingLosses(t *testing.T) {
	r, l := newReporter(50 * time.Millisecond)
	defer r.Close()
	r.Lost(1, errors.New("a"))
	<-l.changed
	r.Lost(2, errors.New("b")) // counted: no line until the timer
	<-l.changed
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.firsts != 1 || len(l.counts) != 1 || l.counts[0] != 2 {
		t.Fatalf("first lines %d, summaries %v; want 1 and [2]", l.firsts, l.counts)
	}
}
