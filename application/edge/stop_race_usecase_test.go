package edge_test

import (
	"context"
	"sync"
	"testing"

	"iop/application/edge"
)

// Handlers still finishing while the edge stops (an HTTP stream cut off
// after the server gave up waiting) may close their run handles, or submit
// background runs, concurrently with Stop. That must be safe, and whatever
// the handler starts after Stop must not outlive it: the slot is released.
func TestSubmitRunStopRacesWithClose(t *testing.T) {
	for range 50 {
		e := newUCEdge(t, ucNodeSpec{"n1", []string{"exec"}})
		ctx, cancel := context.WithTimeout(context.Background(), ucWait)
		var handles []*edge.RunHandle
		for range 8 {
			rh, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "exec"})
			if err != nil {
				t.Fatal(err)
			}
			handles = append(handles, rh)
		}
		var wg sync.WaitGroup
		for _, rh := range handles {
			wg.Add(1)
			go func() { defer wg.Done(); rh.Close() }()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = e.submit.Handle(ctx, edge.SubmitRun{Adapter: "exec", Background: true})
		}()
		ucWithin(t, "Stop", e.submit.Stop)
		wg.Wait()
		ucWithin(t, "a second Stop", e.submit.Stop)
		ucEventually(t, "every slot released", func() bool { return e.inFlight(t, "n1") == 0 })
		cancel()
	}
}
