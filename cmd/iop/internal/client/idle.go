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

// idleBody closes a streaming response body when a Read waits d for a
// byte, so a stream from an edge that vanished without closing the
// connection ends with a clear error instead of hanging. Only the time
// spent waiting inside Read counts: the timer is armed when a Read starts
// and stopped when it returns. It used to run between reads too, so a CLI
// blocked writing to a slow reader of its stdout (iop run … | slow) was
// told the edge had been silent, and a healthy stream was cut.
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
	b.t.Stop() // armed by each Read
	return b
}

func (b *idleBody) Read(p []byte) (int, error) {
	if b.fired.Load() {
		return 0, b.deadErr()
	}
	b.t.Reset(b.d)
	n, err := b.rc.Read(p)
	b.t.Stop()
	if err != nil && b.fired.Load() {
		err = b.deadErr()
	}
	return n, err
}

func (b *idleBody) deadErr() error {
	return fmt.Errorf("no data from the edge for %v (keep-alives stopped): the connection is presumed dead", b.d)
}

func (b *idleBody) Close() error {
	b.t.Stop()
	return b.rc.Close()
}
