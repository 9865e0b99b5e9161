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

// Two first runs of a new session sent at once go to one node: the second
// waits until the first is admitted (which binds the session) and then
// follows it. The second used to be placed at once on the other node (the
// first's node being busier by it), splitting the session's history.
func TestSessionFirstRunsAtOnceLandOnOneNode(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	e.links["a"].silent, e.links["b"].silent = true, true // admissions are this test's to give
	ctx := context.Background()
	type result struct {
		rh  *edge.RunHandle
		err error
	}
	submit := func() chan result {
		c := make(chan result, 1)
		go func() {
			rh, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "s1", Input: []byte("hi")})
			c <- result{rh, err}
		}()
		return c
	}
	startedOn := func() (a, b []domain.RunRequest) {
		a, _, _, _, _, _ = e.links["a"].snapshot()
		b, _, _, _, _, _ = e.links["b"].snapshot()
		return a, b
	}

	first := submit()
	ucEventually(t, "the first run sent to a node", func() bool { a, b := startedOn(); return len(a)+len(b) == 1 })
	second := submit()
	ucEventually(t, "the second run waiting, or sent to a node", func() bool {
		a, b := startedOn()
		return len(a)+len(b) == 2 || edge.SessionWaiters(e.reg, "chat", "s1") == 1
	})
	a, b := startedOn()
	if len(b) != 0 || len(a) != 1 {
		t.Fatalf("while the first run of s1 awaits admission on a, runs were sent to a: %d, b: %d; want the second held back", len(a), len(b))
	}
	e.links["a"].stream(t, a[0].RunID).push(ucEv(1, domain.EventStart, ""))
	r1 := <-first
	if r1.err != nil || r1.rh.Node != "a" {
		t.Fatalf("first run: %+v, %v", r1.rh, r1.err)
	}
	ucEventually(t, "the second run sent once the first was admitted", func() bool { a, b := startedOn(); return len(a)+len(b) == 2 })
	a, b = startedOn()
	if len(a) != 2 || len(b) != 0 {
		t.Fatalf("the second run of s1 went to b; want a, the node of its session")
	}
	e.links["a"].stream(t, a[1].RunID).push(ucEv(1, domain.EventStart, ""))
	r2 := <-second
	if r2.err != nil || r2.rh.Node != "a" {
		t.Fatalf("second run: %+v, %v", r2.rh, r2.err)
	}
	ucFinish(t, e, r1.rh)
	ucFinish(t, e, r2.rh)
}

// A first run that is refused hands the placing on: the session's next
// run waiting is placed afresh, and a caller that leaves while it waits
// gets cancelled without holding anything.
func TestSessionFirstRunRefusedLetsTheNextBePlaced(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	e.links["a"].silent, e.links["b"].silent = true, true
	type result struct {
		rh  *edge.RunHandle
		err error
	}
	submit := func(ctx context.Context) chan result {
		c := make(chan result, 1)
		go func() {
			rh, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "s1", Input: []byte("hi")})
			c <- result{rh, err}
		}()
		return c
	}
	first := submit(context.Background())
	ucEventually(t, "the first run sent to a", func() bool { a, _, _, _, _, _ := e.links["a"].snapshot(); return len(a) == 1 })
	leaving, leave := context.WithCancel(context.Background())
	gone := submit(leaving)
	ucEventually(t, "a second run waiting", func() bool { return edge.SessionWaiters(e.reg, "chat", "s1") == 1 })
	leave()
	if r := <-gone; ucCode(r.err) != domain.CodeCancelled {
		t.Fatalf("a caller leaving while it waited: %+v, %v; want cancelled", r.rh, r.err)
	}
	third := submit(context.Background())
	ucEventually(t, "a third run waiting", func() bool { return edge.SessionWaiters(e.reg, "chat", "s1") == 1 })
	a, _, _, _, _, _ := e.links["a"].snapshot()
	e.links["a"].stream(t, a[0].RunID).push(domain.RunEvent{RunID: a[0].RunID, Seq: 1, Type: domain.EventError, Error: &domain.ErrorInfo{Code: domain.CodeInvalidRequest, Message: "no"}})
	if r := <-first; ucCode(r.err) != domain.CodeInvalidRequest {
		t.Fatalf("first run: %+v, %v; want its refusal", r.rh, r.err)
	}
	// Refused, the first bound nothing: the third is placed afresh (a tie:
	// the lower id).
	ucEventually(t, "the third run sent", func() bool { a, _, _, _, _, _ := e.links["a"].snapshot(); return len(a) == 2 })
	a, _, _, _, _, _ = e.links["a"].snapshot()
	e.links["a"].stream(t, a[1].RunID).push(ucEv(1, domain.EventStart, ""))
	r3 := <-third
	if r3.err != nil || r3.rh.Node != "a" {
		t.Fatalf("third run: %+v, %v", r3.rh, r3.err)
	}
	ucFinish(t, e, r3.rh)
}
