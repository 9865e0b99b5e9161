package edge_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
)

// ucObserved lists obs's history rows and counted runs as node:status.
func ucObserved(obs *ucObserver) (rows, done []string) {
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for _, r := range obs.runs {
		rows = append(rows, r.Node+":"+string(r.Status))
	}
	for _, d := range obs.done {
		done = append(done, d.Node+":"+string(d.Status))
	}
	return rows, done
}

// A run no one pinned to a node that its first node refuses at_capacity —
// the node's link out of streams (provider tunnels hold them, which the
// edge's count of runs does not see) or its adapter full (a race the
// edge's count lost) — goes to the next node with a free slot, and the
// refused try is neither a history row nor a failed run: only the run
// the caller gets is. Runs used to get the first node's 429 every time
// while another node sat idle.
func TestRunRefusedAtCapacityIsTriedElsewhere(t *testing.T) {
	for name, refuse := range map[string]func(l *ucLink){
		"link out of streams": func(l *ucLink) {
			l.startErr = domain.Errorf(domain.CodeAtCapacity, "the node's link is busy with provider tunnels")
		},
		"adapter full": func(l *ucLink) {
			l.refuse = &domain.ErrorInfo{Code: domain.CodeAtCapacity, Message: "adapter chat is at capacity"}
		},
	} {
		t.Run(name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
			obs := &ucObserver{}
			e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
			refuse(e.links["a"]) // a wins the tie, by id
			for _, bg := range []bool{false, true} {
				rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat", Background: bg})
				if err != nil || rh.Node != "b" {
					t.Fatalf("run (background %v): %v, on %v; want it admitted on b", bg, err, rh)
				}
				if !bg {
					defer rh.Close()
				}
			}
			if a, b := ucStarted(e, "a"), ucStarted(e, "b"); a != 2 || b != 2 {
				t.Fatalf("a was sent %d runs and b %d, want two each (a refused, b took them)", a, b)
			}
			if v, _ := e.reg.Get("a"); v.Draining {
				t.Fatal("a, which refused at_capacity, is taken for draining")
			}
			rows, done := ucObserved(obs)
			if fmt.Sprint(rows) != "[b:running b:running]" || len(done) != 0 {
				t.Fatalf("history %v, metrics %v; want only b's runs, running", rows, done)
			}
		})
	}
}

// A refusal at_capacity stays the caller's answer, recorded and counted
// once, where no other node may take the run: the caller named the node,
// the run's session is bound to it, every other node is full as the edge
// counts (it would refuse alike), or the others refused too.
func TestRunRefusedAtCapacityWithNowhereElse(t *testing.T) {
	refusal := &domain.ErrorInfo{Code: domain.CodeAtCapacity, Message: "adapter chat is at capacity"}
	t.Run("named", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
		obs := &ucObserver{}
		e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
		e.links["a"].refuse = refusal
		if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Node: "a", Adapter: "chat"}); ucCode(err) != domain.CodeAtCapacity || ucStarted(e, "b") != 0 {
			t.Fatalf("run naming a: %v, b sent %d runs; want a's at_capacity and nothing on b", err, ucStarted(e, "b"))
		}
		if rows, done := ucObserved(obs); fmt.Sprint(rows) != "[a:running a:failed]" || fmt.Sprint(done) != "[a:failed]" {
			t.Fatalf("history %v, metrics %v; want a's refusal once", rows, done)
		}
	})
	t.Run("session bound", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
		turn1, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
		if err != nil || turn1.Node != "a" {
			t.Fatalf("turn 1: %v on %v, want a", err, turn1)
		}
		ucFinish(t, e, turn1)
		e.links["a"].refuse = refusal
		if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat", SessionID: "s1"}); ucCode(err) != domain.CodeAtCapacity || ucStarted(e, "b") != 0 {
			t.Fatalf("turn 2: %v, b sent %d runs; want a's at_capacity and nothing on b (the session is a's)", err, ucStarted(e, "b"))
		}
	})
	t.Run("others full", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdgeCfg(t, map[string][]domain.AdapterConfig{
			"a": {ucExecAdapter("chat", 1, "t")},
			"b": {ucExecAdapter("chat", 1, "t")},
		})
		ucBusy(t, e, "a", "chat", 1)
		ucBusy(t, e, "b", "chat", 1)
		e.links["a"].refuse = refusal
		e.links["b"].refuse = refusal
		if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"}); ucCode(err) != domain.CodeAtCapacity {
			t.Fatalf("run: %v, want at_capacity", err)
		}
		if a, b := ucStarted(e, "a"), ucStarted(e, "b"); a+b != 3 {
			t.Fatalf("a was sent %d runs and b %d; want one try past the two preloaded", a, b)
		}
	})
	t.Run("all refuse", func(t *testing.T) {
		ucNoLeaks(t)
		e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}}, ucNodeSpec{"c", []string{"chat"}})
		obs := &ucObserver{}
		e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
		for _, id := range []string{"a", "b", "c"} {
			e.links[id].refuse = refusal
		}
		if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"}); ucCode(err) != domain.CodeAtCapacity {
			t.Fatalf("run: %v, want at_capacity", err)
		}
		for _, id := range []string{"a", "b", "c"} {
			if n := ucStarted(e, id); n != 1 {
				t.Fatalf("%s was sent %d runs, want one try on each node", id, n)
			}
		}
		if rows, done := ucObserved(obs); fmt.Sprint(rows) != "[c:running c:failed]" || fmt.Sprint(done) != "[c:failed]" {
			t.Fatalf("history %v, metrics %v; want the last refusal (the caller's answer) only", rows, done)
		}
	})
}

// A run sent to a node that never answers its admission (unnamed, so a
// refusal could have been tried elsewhere) has its history row: the node
// may still take it, and the row is what lets the history learn its end.
func TestRunWhoseAdmissionNeverComesHasItsRow(t *testing.T) {
	for _, node := range []string{"", "a"} {
		t.Run("node="+node, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}})
			obs := &ucObserver{}
			e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
			e.submit.AdmitTimeout, e.submit.DrainTimeout = 20*time.Millisecond, 20*time.Millisecond
			e.links["a"].silent = true
			if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat", Node: node, Background: true}); domain.CodeOf(err) != domain.CodeTimeout {
				t.Fatalf("run: %v, want timeout", err)
			}
			if rows, _ := ucObserved(obs); len(rows) == 0 || rows[0] != "a:running" {
				t.Fatalf("history %v, want the run's row on a", rows)
			}
		})
	}
}

// A caller that leaves while its run waits for the node's admission hands
// the run to the edge's follower (withdraw), which cancels it on the node
// and records its end: the row and the count are the follower's, once,
// and the dispatcher writes nothing of the run's observation after that.
// (Its noRetry wrote the observation while the follower read it, a data
// race CI caught; under -race this test reports it: each round gives the
// two goroutines another chance to overlap.)
func TestCallerLeavingBeforeAdmissionLeavesTheRunToItsFollower(t *testing.T) {
	for _, node := range []string{"", "a"} {
		t.Run("node="+node, func(t *testing.T) {
			ucNoLeaks(t)
			for round := range 20 {
				e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}})
				obs := &ucObserver{}
				e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
				e.links["a"].silent, e.links["a"].cancelEnds = true, true
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() {
					_, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", Node: node})
					done <- err
				}()
				ucEventually(t, "the run to reach the node", func() bool { return ucStarted(e, "a") == 1 })
				cancel()
				select {
				case err := <-done:
					if ucCode(err) != domain.CodeCancelled {
						t.Fatalf("round %d: run: %v, want cancelled (the caller left)", round, err)
					}
				case <-time.After(ucWait):
					t.Fatalf("round %d: Handle did not answer after its caller left", round)
				}
				ucEventually(t, "the follower to count the run's end", func() bool { _, done := ucObserved(obs); return len(done) > 0 })
				if rows, done := ucObserved(obs); fmt.Sprint(rows) != "[a:running a:cancelled]" || fmt.Sprint(done) != "[a:cancelled]" {
					t.Fatalf("round %d: history %v, metrics %v; want the run's row and its end, cancelled, once", round, rows, done)
				}
			}
		})
	}
}

// The refusal of a node tried first stays the one recorded and counted
// when the next node cannot even be sent the run (its link full or gone):
// the caller's run failed, and it was dropped unrecorded.
func TestHeldRefusalIsRecordedWhenTheNextNodeCannotBeSent(t *testing.T) {
	for _, code := range []string{domain.CodeAtCapacity, domain.CodeNodeDisconnected} {
		t.Run(code, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
			obs := &ucObserver{}
			e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
			e.links["a"].refuse = &domain.ErrorInfo{Code: domain.CodeAtCapacity, Message: "adapter chat is at capacity"} // a wins the tie, by id
			e.links["b"].startErr = domain.Errorf(code, "b cannot take it")
			if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"}); domain.CodeOf(err) != code {
				t.Fatalf("run: %v, want b's %s", err, code)
			}
			rows, done := ucObserved(obs)
			if fmt.Sprint(rows) != "[a:running a:failed]" || fmt.Sprint(done) != "[a:failed]" {
				t.Fatalf("history %v, metrics %v; want a's refusal recorded and counted once", rows, done)
			}
		})
	}
}

// A held refusal is dropped once the next node is sent the run: whatever
// that node answers is the caller's run, with its own row and count, so
// one request is one failed run, not two.
func TestHeldRefusalIsDroppedWhenTheNextNodeRefusesOtherwise(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	obs := &ucObserver{}
	e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
	e.links["a"].refuse = &domain.ErrorInfo{Code: domain.CodeAtCapacity, Message: "adapter chat is at capacity"} // a wins the tie, by id
	e.links["b"].refuse = &domain.ErrorInfo{Code: domain.CodeTargetNotFound, Message: "no such target"}
	if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat"}); domain.CodeOf(err) != domain.CodeTargetNotFound {
		t.Fatalf("run: %v, want b's target_not_found", err)
	}
	rows, done := ucObserved(obs)
	if fmt.Sprint(rows) != "[b:running b:failed]" || fmt.Sprint(done) != "[b:failed]" {
		t.Fatalf("history %v, metrics %v; want b's refusal only, once", rows, done)
	}
}
