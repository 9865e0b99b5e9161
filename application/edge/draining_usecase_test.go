package edge_test

import (
	"context"
	"fmt"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

// ucStarted is how many runs node has been sent.
func ucStarted(e *ucEdge, node string) int {
	started, _, _, _, _, _ := e.links[node].snapshot()
	return len(started)
}

// A node that says it is stopping gets no new run while it drains: not one
// the edge places, nor a turn of a session bound to it, and one that names
// it is refused with shutting_down before anything is sent. Its run in
// flight still delivers its events to the end. It used to be chosen all
// through the drain (here it wins every tie, by id), and each run it was
// sent failed with shutting_down.
func TestDrainingNodeGetsNoNewRuns(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	ctx := context.Background()
	nodes := edge.NewRegisterHandler(ucRegisterDir(), e.reg, e.bus, &edge.ConfigVersions{}, nil)

	inFlight, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || inFlight.Node != "a" {
		t.Fatalf("first run: %v on %q, want a (tie, lower id)", err, inFlight.Node)
	}
	ucBusy(t, e, "b", "chat", 1) // a tie again: one run each

	nodes.Draining("b", &ucLink{id: "stale"}) // a link b no longer has
	nodes.Draining("a", e.links["a"])
	nodes.Draining("a", e.links["a"]) // said once per link
	if v, _ := e.reg.Get("a"); !v.Draining {
		t.Fatal("a is not listed draining")
	}
	if v, _ := e.reg.Get("b"); v.Draining {
		t.Fatal("b is listed draining after a stale link's word")
	}
	if evs := e.bus.ofType(domain.BusNodeDraining); len(evs) != 1 || evs[0].Node != "a" {
		t.Fatalf("node.draining events %+v, want one for a", evs)
	}

	for _, cmd := range []edge.SubmitRun{
		{Adapter: "chat"},
		{Adapter: "chat", SessionID: "s1"}, // bound to a
		{Adapter: "chat", Background: true},
	} {
		rh, err := e.submit.Handle(ctx, cmd)
		if err != nil {
			t.Fatalf("%+v: %v", cmd, err)
		}
		if rh.Node != "b" {
			t.Fatalf("%+v went to %s, which is draining; want b", cmd, rh.Node)
		}
	}
	_, err = e.submit.Handle(ctx, edge.SubmitRun{Node: "a", Adapter: "chat"})
	if ucCode(err) != domain.CodeShuttingDown || err.Error() != `shutting_down: node "a" is shutting down: it takes no new runs` {
		t.Fatalf("run naming a: %v, want shutting_down saying a is shutting down", err)
	}
	if n := ucStarted(e, "a"); n != 1 {
		t.Fatalf("a was sent %d runs, want only the one before it drained", n)
	}
	ucFinish(t, e, inFlight) // its events still come through
}

// With every node draining, a run the edge places has nowhere to go.
func TestEveryNodeDraining(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}})
	if !e.reg.MarkDraining("a", e.links["a"]) {
		t.Fatal("MarkDraining said a was draining already")
	}
	_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"})
	if ucCode(err) != domain.CodeNoNodeAvailable || err.Error() != "no_node_available: every connected node is shutting down" {
		t.Fatalf("run: %v, want no_node_available: every connected node is shutting down", err)
	}
	if n := ucStarted(e, "a"); n != 0 {
		t.Fatalf("a was sent %d runs", n)
	}
}

// A node that refuses a run with shutting_down before the edge knew it
// drains (its word was still on the way, or it is a version that never
// says it) is taken for draining, and the run, whose node no one named,
// is tried once more on another node; a run that named the node, or that
// has no other node to go to, gets the node's refusal.
func TestRunRefusedByStoppingNodeIsTriedElsewhere(t *testing.T) {
	refusal := &domain.ErrorInfo{Code: domain.CodeShuttingDown, Message: "the node is shutting down"}
	t.Run("placed by the edge", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
		e.links["a"].refuse = refusal
		rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"})
		if err != nil || rh.Node != "b" {
			t.Fatalf("run: %v, on %v; want it admitted on b", err, rh)
		}
		if a, b := ucStarted(e, "a"), ucStarted(e, "b"); a != 1 || b != 1 {
			t.Fatalf("a was sent %d runs and b %d, want one each (a refused, b took it)", a, b)
		}
		if v, _ := e.reg.Get("a"); !v.Draining {
			t.Fatal("a, which refused with shutting_down, is not taken for draining")
		}
		if evs := e.bus.ofType(domain.BusNodeDraining); len(evs) != 1 || evs[0].Node != "a" || evs[0].Reason != "it refused a run: shutting_down" {
			t.Fatalf("node.draining events %+v", evs)
		}
		// The next run goes to b straight away.
		if rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"}); err != nil || rh.Node != "b" || ucStarted(e, "a") != 1 {
			t.Fatalf("next run: %v on %v, a sent %d runs; want b, a not tried", err, rh, ucStarted(e, "a"))
		}
	})
	t.Run("named", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
		e.links["a"].refuse = refusal
		_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Node: "a", Adapter: "chat"})
		if ucCode(err) != domain.CodeShuttingDown || ucStarted(e, "b") != 0 {
			t.Fatalf("run naming a: %v, b sent %d runs; want a's shutting_down and nothing on b", err, ucStarted(e, "b"))
		}
		if v, _ := e.reg.Get("a"); !v.Draining {
			t.Fatal("a, which refused with shutting_down, is not taken for draining")
		}
	})
	t.Run("both refuse", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
		e.links["a"].refuse = refusal
		e.links["b"].refuse = refusal
		_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"})
		if ucCode(err) != domain.CodeShuttingDown || ucStarted(e, "a") != 1 || ucStarted(e, "b") != 1 {
			t.Fatalf("run: %v, a sent %d runs and b %d; want shutting_down after one try on each", err, ucStarted(e, "a"), ucStarted(e, "b"))
		}
		// The second refusal counts too: the next run is not sent to b.
		for _, id := range []string{"a", "b"} {
			if v, _ := e.reg.Get(id); !v.Draining {
				t.Fatalf("%s, which refused with shutting_down, is not taken for draining", id)
			}
		}
	})
	t.Run("no other node", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}})
		e.links["a"].refuse = refusal
		_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"})
		if ucCode(err) != domain.CodeShuttingDown || err.Error() != "shutting_down: the node is shutting down" || ucStarted(e, "a") != 1 {
			t.Fatalf("run: %v, a sent %d runs; want a's own shutting_down after one try", err, ucStarted(e, "a"))
		}
	})
}

// With one node left that is not draining, the spec's one-node fallback
// does not apply: during a rolling restart the run for an adapter only the
// draining node offers is no_node_available (503, try again), not the
// other node's adapter_not_found (404, which reads as permanent).
func TestOnlyOfferingNodeDraining(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"other"}})
	if !e.reg.MarkDraining("a", e.links["a"]) {
		t.Fatal("MarkDraining said a was draining already")
	}
	_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"})
	if ucCode(err) != domain.CodeNoNodeAvailable || err.Error() != `no_node_available: every connected node offering adapter "chat" is shutting down` {
		t.Fatalf("run: %v, want no_node_available: every connected node offering adapter \"chat\" is shutting down", err)
	}
	if a, b := ucStarted(e, "a"), ucStarted(e, "b"); a != 0 || b != 0 {
		t.Fatalf("a was sent %d runs and b %d, want none", a, b)
	}
	// b still takes what it offers.
	if rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "other"}); err != nil || rh.Node != "b" {
		t.Fatalf("run of other: %v on %v, want b", err, rh)
	}
}

// A refusal with shutting_down that is tried again on another node is not
// the caller's run: no history row (its id never reached the caller) and
// no failed run in iop_runs_total — only the retry is. A refusal that is
// the caller's answer (no other node, or the other refuses too) is
// recorded and counted as a failed run, once.
func TestRunRefusedByStoppingNodeAndTriedElsewhereIsNotCounted(t *testing.T) {
	refusal := &domain.ErrorInfo{Code: domain.CodeShuttingDown, Message: "the node is shutting down"}
	t.Run("tried elsewhere", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
		obs := &ucObserver{}
		e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
		e.links["a"].refuse = refusal
		rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"})
		if err != nil || rh.Node != "b" {
			t.Fatalf("run: %v, on %v; want it admitted on b", err, rh)
		}
		defer rh.Close()
		rows, done := ucObserved(obs)
		if fmt.Sprint(rows) != "[b:running]" || len(done) != 0 {
			t.Fatalf("history %v, metrics %v; want only b's run, running", rows, done)
		}
	})
	t.Run("both refuse", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
		obs := &ucObserver{}
		e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
		e.links["a"].refuse = refusal
		e.links["b"].refuse = refusal
		if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"}); ucCode(err) != domain.CodeShuttingDown {
			t.Fatalf("run: %v, want shutting_down", err)
		}
		rows, done := ucObserved(obs)
		if fmt.Sprint(rows) != "[b:running b:failed]" || fmt.Sprint(done) != "[b:failed]" {
			t.Fatalf("history %v, metrics %v; want b's refusal (the caller's answer) only", rows, done)
		}
	})
	t.Run("no other node", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}})
		obs := &ucObserver{}
		e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
		e.links["a"].refuse = refusal
		if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"}); ucCode(err) != domain.CodeShuttingDown {
			t.Fatalf("run: %v, want shutting_down", err)
		}
		rows, done := ucObserved(obs)
		if fmt.Sprint(rows) != "[a:running a:failed]" || fmt.Sprint(done) != "[a:failed]" {
			t.Fatalf("history %v, metrics %v; want a's refusal, recorded and counted once", rows, done)
		}
	})
}
