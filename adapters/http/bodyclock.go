package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
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
)

// ErrBodyTooSlow is the error a handler's body read returns past the bound.
var ErrBodyTooSlow = errors.New("request body arrived too slowly")

// clockBody arms a read deadline on the connection for r's body and moves
// it as bytes arrive. The deadline is lifted once the body is read to its
// end, so it never touches the response: net/http reads the connection in
// the background after the body ends (to notice a client leaving), and a
// deadline firing then would cancel a long SSE stream.
func clockBody(w http.ResponseWriter, r *http.Request, timeout time.Duration, rate int) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 || timeout <= 0 {
		return
	}
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(timeout)
	if rc.SetReadDeadline(deadline) != nil {
		return // not supported by this connection: nothing to bound
	}
	r.Body = &clockedBody{ReadCloser: r.Body, rc: rc, deadline: deadline, timeout: timeout, perByte: time.Second / time.Duration(max(rate, 1))}
}

type clockedBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	deadline time.Time
	timeout  time.Duration
	perByte  time.Duration
	credit   time.Duration // earned but not yet applied (below a millisecond)
	done     bool
}

func (b *clockedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.done {
		return n, err
	}
	if n > 0 {
		if b.credit += time.Duration(n) * b.perByte; b.credit >= time.Millisecond {
			b.deadline = b.deadline.Add(b.credit)
			b.credit = 0
			_ = b.rc.SetReadDeadline(b.deadline)
		}
	}
	switch {
	case errors.Is(err, io.EOF):
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("%w (minimum %d bytes/s after the first %v)", ErrBodyTooSlow, time.Second/b.perByte, b.timeout)
	}
	return n, err
}
