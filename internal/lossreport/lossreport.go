// Package lossreport logs losses that come in bursts (records a full disk
// or a down database cannot take) as a bounded number of lines: the first
// loss at once, the ones after it summed into at most one line per
// interval, and nothing left unreported — what is counted after a line is
// reported an interval later on the reporter's own timer, or at Close.
package lossreport

import (
	"sync"
	"time"
)

// Reporter counts losses and has them logged. Its methods are safe for
// concurrent use.
type Reporter struct {
	every time.Duration
	// first logs one loss at once; summary logs n losses counted since the
	// previous line, err the last one's cause.
	first   func(err error, attrs []any)
	summary func(n int, err error)

	mu      sync.Mutex
	last    time.Time // the previous line; zero before the first
	pending int
	err     error
	timer   *time.Timer
	gen     int // the armed timer's; a stale one's call leaves timer alone
	closed  bool
	wg      sync.WaitGroup // the timer's call under way
}

// New returns a Reporter that logs at most one line per every (after the
// first), through first (one loss, with its own attrs) and summary (the
// losses counted since the previous line).
func New(every time.Duration, first func(err error, attrs []any), summary func(n int, err error)) *Reporter {
	return &Reporter{every: every, first: first, summary: summary}
}

// Lost counts n losses caused by err. The first loss, and one that comes
// an interval or more after the previous line, is logged at once (a single
// loss with attrs, several without); others are counted and reported on a
// timer when the interval since the previous line has passed.
func (r *Reporter) Lost(n int, err error, attrs ...any) {
	if n <= 0 {
		return
	}
	r.mu.Lock()
	now := time.Now()
	if r.closed || r.last.IsZero() || now.Sub(r.last) >= r.every {
		n += r.pending
		r.pending, r.err, r.last = 0, nil, now
		if r.timer != nil && r.timer.Stop() {
			r.wg.Done()
		}
		r.timer = nil
		r.mu.Unlock()
		if n == 1 {
			r.first(err, attrs)
		} else {
			r.summary(n, err)
		}
		return
	}
	r.pending += n
	r.err = err
	if r.timer == nil {
		r.wg.Add(1)
		r.gen++
		gen := r.gen
		r.timer = time.AfterFunc(r.every-now.Sub(r.last), func() { r.fire(gen) })
	}
	r.mu.Unlock()
}

// fire reports what was counted since the previous line.
func (r *Reporter) fire(gen int) {
	defer r.wg.Done()
	r.mu.Lock()
	if r.gen == gen {
		r.timer = nil
	}
	r.report()
}

// report logs what is pending; it is called with mu held and unlocks it.
func (r *Reporter) report() {
	n, err := r.pending, r.err
	r.pending, r.err = 0, nil
	if n > 0 {
		r.last = time.Now()
	}
	r.mu.Unlock()
	if n > 0 {
		r.summary(n, err)
	}
}

// Close reports what is counted and not logged yet and stops the timer;
// losses after it are logged at once. Idempotent.
func (r *Reporter) Close() {
	r.mu.Lock()
	r.closed = true
	if r.timer != nil && r.timer.Stop() {
		r.wg.Done()
	}
	r.timer = nil
	r.report()
	r.wg.Wait()
}
