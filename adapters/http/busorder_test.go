package httpapi_test

import (
	"io"
	"sync"
	"testing"

	"iop/domain"
)

// A run's terminal run.event is published once what it describes is so:
// its node's slot is free again. Published before, a subscriber that
// started the next run on it (an adapter of max_concurrency 1) could be
// answered 429 at_capacity, and GET /v1/nodes still counted the run in
// flight. The bus filter runs inside Publish, so it sees the registry as it
// was when the event went out.
func TestTerminalRunEventPublishedAfterItsSlotIsFree(t *testing.T) {
	e := newEnv(t, testNode{"n1", newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})})
	var (
		mu       sync.Mutex
		inFlight = -1
	)
	sub := e.bus.Subscribe(0, func(ev domain.BusEvent) bool {
		if ev.Type == domain.BusRunEvent && ev.Run.Type.Terminal() {
			n, _ := e.reg.Get("n1")
			mu.Lock()
			inFlight = n.RunsInFlight
			mu.Unlock()
		}
		return false
	})
	defer sub.Close()
	resp := e.do("POST", "/v1/runs", `{"adapter":"llm","node":"n1","input":"x"}`)
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if inFlight != 0 {
		t.Fatalf("runs in flight on n1 when its run's terminal event was published: %d, want 0", inFlight)
	}
}
