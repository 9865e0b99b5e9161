package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// DefaultBodyTimeout and DefaultBodyMinRate bound how long reading a request
// body may take: BodyTimeout plus one second per BodyMinRate bytes read so
// far. A client that sends its headers and then trickles the body is cut
// off at the bound instead of holding a connection and a handler forever;
// an honest upload of 8 MiB has over 500 s at the minimum rate.
const (
	DefaultBodyTimeout = 10 * time.Second
	DefaultBodyMinRate = 16 << 10 // bytes per second
	// DefaultBodyIdleTimeout bounds a wait for the body's next bytes, on top
	// of the total: without it a client that sent 8 MiB at once could then
	// idle the ~500 s it had earned, its body's memory held all along.
	DefaultBodyIdleTimeout = 20 * time.Second
)

// ErrBodyTooSlow is the error a handler's body read returns past the bound.
var ErrBodyTooSlow = errors.New("request body arrived too slowly")

// clockBody arms a read deadline on the connection for r's body and moves
// it as bytes arrive: each read waits at most idle (when positive) for the
// client, and the whole body may take timeout plus one second per rate
// bytes read so far. The deadline is lifted once the body is read to its
// end, so it never touches the response: net/http reads the connection in
// the background after the body ends (to notice a client leaving), and a
// deadline firing then would cancel a long SSE stream. Time the handler
// spends between reads (a relay waiting for its node) is not charged to
// the client's idle bound.
//
// A handler that sets a read deadline itself (through the statusWriter,
// e.g. to cut off a body read still in progress on another goroutine as it
// returns) takes the deadline over: the clock never moves it again
// (clockedBody.own). It returns the clocked body, nil when there is none.
func clockBody(w http.ResponseWriter, r *http.Request, timeout time.Duration, rate int, idle time.Duration) *clockedBody {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 || timeout <= 0 {
		return nil
	}
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(timeout)
	if rc.SetReadDeadline(deadline) != nil {
		return nil // not supported by this connection: nothing to bound
	}
	b := &clockedBody{ReadCloser: r.Body, rc: rc, deadline: deadline, armed: deadline, timeout: timeout, idle: idle,
		perByte: time.Second / time.Duration(max(rate, 1))}
	r.Body = b
	return b
}

type clockedBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	deadline time.Time // the total bound
	armed    time.Time // the deadline set on the connection
	timeout  time.Duration
	idle     time.Duration
	perByte  time.Duration
	credit   time.Duration // earned but not yet applied (below a millisecond)
	done     bool
	// mu orders the clock's moves of the deadline against own: a
	// handler's deadline set while a Read is about to arm the clock's is
	// never overwritten by it.
	mu sync.Mutex
	// owned: the handler set the read deadline itself, or returned; the
	// clock leaves the connection alone from then on.
	owned bool
}

// own gives the read deadline to the handler: it is set to t (unless the
// handler has returned, ended) and the clock no longer moves it.
func (b *clockedBody) own(t time.Time, ended bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.owned = true
	if ended {
		return nil
	}
	return b.rc.SetReadDeadline(t)
}

func (b *clockedBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	want := b.deadline
	if b.idle > 0 {
		if t := time.Now().Add(b.idle); t.Before(want) {
			want = t
		}
	}
	b.mu.Lock()
	if !b.owned && !want.Equal(b.armed) {
		b.armed = want
		_ = b.rc.SetReadDeadline(want)
	}
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	owned := b.owned // the handler's deadline may have cut this read off
	b.mu.Unlock()
	if n > 0 {
		if b.credit += time.Duration(n) * b.perByte; b.credit >= time.Millisecond {
			b.deadline = b.deadline.Add(b.credit)
			b.credit = 0
		}
	}
	switch {
	case errors.Is(err, io.EOF):
		b.done = true
		b.mu.Lock()
		if !b.owned {
			_ = b.rc.SetReadDeadline(time.Time{})
		}
		b.mu.Unlock()
	case owned:
		// The handler's deadline, not the clock's: its error as it is.
	case errors.Is(err, os.ErrDeadlineExceeded):
		if b.armed.Before(b.deadline) {
			err = fmt.Errorf("%w (no bytes for %v)", ErrBodyTooSlow, b.idle)
		} else {
			err = fmt.Errorf("%w (minimum %d bytes/s after the first %v)", ErrBodyTooSlow, time.Second/b.perByte, b.timeout)
		}
	}
	return n, err
}
