package transport

import (
	"context"
	"sync"
	"testing"
	"time"

	"iop/ports"
)

// The edge publishes a link while Register runs, before the handshake has
// recorded the node's id on it: the history reconciler may send it a
// command at once. That read and the handshake's write are ordered (the
// race detector fails this test without it), and the command goes out.
func TestCommandDuringRegistration(t *testing.T) {
	var wg sync.WaitGroup
	defer wg.Wait()
	p := newPair(t, pairOptions{}, func(e *fakeEdge, _ *fakeNode) {
		e.onRegister = func(link ports.NodeLink) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if st, err := link.Command(ctx, "run_get", []byte(`{"run_id":"r1"}`)); err == nil {
					st.Close()
				}
			}()
			time.Sleep(time.Millisecond) // let the command run into the handshake
		}
	})
	if node, version := p.link.registered(); node != testNodeConfig().NodeID || version != testNodeConfig().Version {
		t.Fatalf("link registered as %q v%d", node, version)
	}
}
