package client

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// StreamIdleTimeout is how long an event stream may stay silent before the
// CLI gives up on it. The edge sends a keep-alive every 15 s, so silence
// this long means the connection is dead, not that the run is quiet.
var StreamIdleTimeout = time.Minute

// idleBody closes a streaming response body when no byte arrives for d, so
// a stream from an edge that vanished without closing the connection ends
// with a clear error instead of hanging.
type idleBody struct {
	rc    io.ReadCloser
	d     time.Duration
	t     *time.Timer
	fired atomic.Bool
}

func newIdleBody(rc io.ReadCloser, d time.Duration) *idleBody {
	b := &idleBody{rc: rc, d: d}
	b.t = time.AfterFunc(d, func() {
		b.fired.Store(true)
		_ = rc.Close()
	})
	return b
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.t.Reset(b.d)
	}
	if err != nil && b.fired.Load() {
		err = fmt.Errorf("no data from the edge for %v (keep-alives stopped): the connection is presumed dead", b.d)
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.t.Stop()
	return b.rc.Close()
}
