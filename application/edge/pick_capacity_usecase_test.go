package edge_test

import (
	"context"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
)

// newUCEdgeCfg is newUCEdge with each node's adapters given in full.
func newUCEdgeCfg(t *testing.T, nodes map[string][]domain.AdapterConfig) *ucEdge {
	t.Helper()
	e := &ucEdge{reg: edge.NewRegistry(), runs: edge.NewRunTracker(0), bus: newUCBus(), links: map[string]*ucLink{}}
	for id, adapters := range nodes {
		l := &ucLink{id: id}
		cfg := domain.NodeConfig{NodeID: id, Version: 1, Adapters: adapters}
		if err := e.reg.Admit(&edge.LiveNode{ID: id, Link: l, Config: cfg, ConnectedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		e.links[id] = l
	}
	e.submit = edge.NewSubmitRunHandler(e.reg, e.runs, e.bus, nil)
	t.Cleanup(func() { ucWithin(t, "SubmitRunHandler.Stop", e.submit.Stop) })
	return e
}

// TestPickSkipsANodeWhoseAdapterIsFull: a node with fewer runs in flight
// overall but no free slot of the requested adapter would answer
// at_capacity; a node with a free slot gets the run.
func TestPickSkipsANodeWhoseAdapterIsFull(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdgeCfg(t, map[string][]domain.AdapterConfig{
		"a": {ucExecAdapter("chat", 1, "t"), ucExecAdapter("exec", 4, "t")},
		"b": {ucExecAdapter("chat", 4, "t"), ucExecAdapter("exec", 4, "t")},
	})
	ucBusy(t, e, "a", "chat", 1) // a's chat is full
	ucBusy(t, e, "b", "exec", 3) // b is busier overall
	rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if rh.Node != "b" {
		t.Fatalf("run went to %s, whose chat is full; want b", rh.Node)
	}
}

// TestPickWithEveryNodeFullLetsTheNodeAnswer: when every node's adapter is
// full the run still goes to one (fewest in flight), and its at_capacity
// reaches the caller.
func TestPickWithEveryNodeFullLetsTheNodeAnswer(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdgeCfg(t, map[string][]domain.AdapterConfig{
		"a": {ucExecAdapter("chat", 1, "t"), ucExecAdapter("exec", 4, "t")},
		"b": {ucExecAdapter("chat", 1, "t")},
	})
	ucBusy(t, e, "a", "chat", 1)
	ucBusy(t, e, "a", "exec", 1)
	ucBusy(t, e, "b", "chat", 1)
	e.links["b"].mu.Lock()
	e.links["b"].refuse = &domain.ErrorInfo{Code: domain.CodeAtCapacity, Message: `adapter "chat" is running 1 of 1 runs`}
	e.links["b"].mu.Unlock()
	_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"})
	if ucCode(err) != domain.CodeAtCapacity {
		t.Fatalf("run with every chat full: %v, want at_capacity from b", err)
	}
	if started, _, _, _, _, _ := e.links["b"].snapshot(); len(started) != 2 {
		t.Fatalf("b started %d runs, want 2 (the preload and the refused one)", len(started))
	}
}

// TestPickPrefersANodeServingTheExecTarget: exec targets are each node's
// own, so a run of a target only one node declares goes to that node, not
// to a freer node that would answer target_not_found. A target no node
// declares still goes to the freest node, whose refusal names its targets.
func TestPickPrefersANodeServingTheExecTarget(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdgeCfg(t, map[string][]domain.AdapterConfig{
		"a": {ucExecAdapter("exec", 2, "cat")},
		"b": {ucExecAdapter("exec", 8, "upper")},
	})
	ucBusy(t, e, "a", "exec", 1) // b is the freer
	for target, want := range map[string]string{"cat": "a", "upper": "b", "nope": "b"} {
		rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Target: target})
		if err != nil {
			t.Fatalf("run of %s: %v", target, err)
		}
		if rh.Node != want {
			t.Errorf("run of %s went to %s, want %s", target, rh.Node, want)
		}
	}
}

// TestRetryAfterAtCapacityKeepsToNodesServingTheTarget: a run its target's
// node refuses at_capacity (full by the node's own count) is tried again
// only on another node declaring the target: one without it answered
// target_not_found, which told the caller the target did not exist when
// it was only busy.
func TestRetryAfterAtCapacityKeepsToNodesServingTheTarget(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdgeCfg(t, map[string][]domain.AdapterConfig{
		"a": {ucExecAdapter("exec", 2, "cat")},
		"b": {ucExecAdapter("exec", 8, "upper")},
	})
	e.links["a"].mu.Lock()
	e.links["a"].refuse = &domain.ErrorInfo{Code: domain.CodeAtCapacity, Message: `adapter "exec" is running 2 of 2 runs`}
	e.links["a"].mu.Unlock()
	_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Target: "cat"})
	if ucCode(err) != domain.CodeAtCapacity {
		t.Fatalf("run of cat with a full: %v, want a's at_capacity", err)
	}
	if started, _, _, _, _, _ := e.links["b"].snapshot(); len(started) != 0 {
		t.Fatalf("b, which has no target cat, was sent %d runs", len(started))
	}
}
