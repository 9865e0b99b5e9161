// Package every runs a periodic job: at once, then an interval after each
// run ends (not on a fixed beat, so a slow run never queues the next).
package every

import (
	"context"
	"time"
)

// Run calls fn with ctx now and then interval after each call returns,
// until ctx ends; it returns then, after any call under way.
func Run(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn(ctx)
		t.Reset(interval)
	}
}
