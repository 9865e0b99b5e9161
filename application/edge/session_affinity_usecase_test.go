package edge_test

import (
	"context"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

// ucFinish ends run rh on its node with complete and reads it to its end.
func ucFinish(t *testing.T, e *ucEdge, rh *edge.RunHandle) {
	t.Helper()
	e.links[rh.Node].stream(t, rh.RunID).push(ucEv(2, domain.EventComplete, ""))
	for {
		ev, err := ucNext(t, rh)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if ev.Type.Terminal() {
			return
		}
	}
}

// ucBusy puts n runs in flight on node, placed explicitly.
func ucBusy(t *testing.T, e *ucEdge, node, adapter string, n int) {
	t.Helper()
	for range n {
		if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Node: node, Adapter: adapter}); err != nil {
			t.Fatalf("preload %s: %v", node, err)
		}
	}
}

func TestSessionNextTurnGoesToItsNode(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	ctx := context.Background()

	turn1, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "chat1", Input: []byte("hi")})
	if err != nil {
		t.Fatalf("turn 1: %v", err)
	}
	if turn1.Node != "a" {
		t.Fatalf("turn 1 went to %s, want a (tie, lower id)", turn1.Node)
	}
	ucFinish(t, e, turn1)
	ucBusy(t, e, "a", "chat", 2) // a is now the busier node

	turn2, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "chat1", Input: []byte("again")})
	if err != nil {
		t.Fatalf("turn 2: %v", err)
	}
	if turn2.Node != "a" {
		t.Fatalf("turn 2 of chat1 went to %s, want a, where turn 1's history is", turn2.Node)
	}
	ucFinish(t, e, turn2)

	// Another session is placed as any run: on the less busy node.
	other, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "chat2"})
	if err != nil {
		t.Fatalf("chat2: %v", err)
	}
	if other.Node != "b" {
		t.Fatalf("chat2 went to %s, want b (fewer runs)", other.Node)
	}
	ucFinish(t, e, other)

	// Ended on its node, the session is bound nowhere any more.
	if err := edge.NewTerminateSessionHandler(e.reg).Handle(ctx, edge.TerminateSession{Node: "a", Adapter: "chat", SessionID: "chat1"}); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	turn3, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "chat1"})
	if err != nil {
		t.Fatalf("turn 3: %v", err)
	}
	if turn3.Node != "b" {
		t.Fatalf("chat1 after its end went to %s, want b (fewer runs)", turn3.Node)
	}
	ucFinish(t, e, turn3)
}

func TestSessionConcurrentRunMeetsSessionBusyOnItsNode(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	ctx := context.Background()

	first, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "chat1"})
	if err != nil || first.Node != "a" {
		t.Fatalf("first run: node %v, err %v; want a", first, err)
	}
	// a now has a run in flight and b none; a node refuses a second run
	// of a session in flight.
	e.links["a"].mu.Lock()
	e.links["a"].refuse = &domain.ErrorInfo{Code: domain.CodeSessionBusy, Message: "session chat1 has a run in flight"}
	e.links["a"].mu.Unlock()

	_, err = e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "chat1"})
	if ucCode(err) != domain.CodeSessionBusy {
		t.Fatalf("second run of chat1: err %v, want session_busy from node a", err)
	}
	if started, _, _, _, _, _ := e.links["b"].snapshot(); len(started) != 0 {
		t.Fatalf("node b started %d runs of a session running on a", len(started))
	}
	ucFinish(t, e, first)
}

func TestSessionOnAGoneNodeIsPlacedAnew(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}}, ucNodeSpec{"c", []string{"chat"}})
	ctx := context.Background()
	turn1, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "chat1"})
	if err != nil || turn1.Node != "a" {
		t.Fatalf("turn 1: %v, %v", turn1, err)
	}
	ucFinish(t, e, turn1)
	e.reg.Remove("a", e.links["a"])
	ucBusy(t, e, "b", "chat", 1)

	turn2, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "chat1"})
	if err != nil {
		t.Fatalf("turn 2: %v", err)
	}
	if turn2.Node != "c" {
		t.Fatalf("turn 2 with its node gone went to %s, want c (fewest runs)", turn2.Node)
	}
	ucFinish(t, e, turn2)
	if n, ok := e.reg.SessionNode("chat", "chat1"); !ok || n != "c" {
		t.Fatalf("chat1 is bound to %q (%v), want c, which admitted its last turn", n, ok)
	}
}

// TestReloadForgetsSessionsOfARemovedNode: a node dropped from the config
// takes its sessions' bindings with it; the others' stay.
func TestReloadForgetsSessionsOfARemovedNode(t *testing.T) {
	dir, reg, bus := &ucDir{recs: ucReloadRecords()}, edge.NewRegistry(), newUCBus()
	versions := &edge.ConfigVersions{}
	reg.RememberSession("exec", "s1", "a") // a is connected
	reg.RememberSession("exec", "s2", "c") // c is not, yet stays configured
	reg.RememberSession("exec", "s3", "b") // b is not connected and leaves
	reg1 := edge.NewRegisterHandler(dir, reg, bus, versions, nil)
	l := &ucLink{id: "a"}
	l.onClose = func(reason string) { reg1.Disconnected("a", l, reason) }
	if _, err := reg1.Register(context.Background(), ucTokA, domain.NodeInfo{}, "r-a", l); err != nil {
		t.Fatal(err)
	}
	next := ucReloadRecords()[2:] // only c stays
	if _, err := edge.NewReloadHandler(&ucSource{recs: next}, dir, reg, bus, versions, nil).Handle(context.Background()); err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]bool{"s1": false, "s2": true, "s3": false} {
		if _, ok := reg.SessionNode("exec", s); ok != want {
			t.Fatalf("session %s bound after the reload: %v, want %v", s, ok, want)
		}
	}
}
