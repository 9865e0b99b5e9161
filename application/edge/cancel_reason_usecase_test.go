package edge_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
)

// The edge says why it cancels a run nobody asked to cancel, and the run's
// end in its history carries that reason (the node records it as the
// cancelled run's message, which the history takes from the run's
// terminal event). Before, every such cancel went without one, and the
// node, then the history, said "cancelled by request", as for a user's
// cancel.
func TestEdgeCancelsSayWhy(t *testing.T) {
	const admitWithin = 20 * time.Millisecond
	tests := []struct {
		name   string
		silent bool // the node never admits the run
		leave  func(t *testing.T, e *ucEdge, rh *edge.RunHandle, caller context.CancelFunc)
		want   string
	}{
		{name: "the caller leaves a foreground run", want: edge.CancelCallerLeft,
			leave: func(t *testing.T, _ *ucEdge, rh *edge.RunHandle, _ context.CancelFunc) { rh.Close() }},
		{name: "the edge stops a foreground run", want: edge.CancelEdgeStopping,
			leave: func(t *testing.T, _ *ucEdge, rh *edge.RunHandle, _ context.CancelFunc) {
				rh.CloseFor(edge.CancelEdgeStopping)
			}},
		{name: "the caller leaves before admission", silent: true, want: edge.CancelCallerLeftUnadmitted,
			leave: func(t *testing.T, e *ucEdge, _ *edge.RunHandle, caller context.CancelFunc) {
				ucEventually(t, "the run to reach the node", func() bool { return ucStarted(e, "a") == 1 })
				caller()
			}},
		{name: "the node does not admit the run in time", silent: true, want: "node did not admit the run within 20ms"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}})
			obs := &ucObserver{}
			e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
			if tc.silent && tc.leave == nil {
				e.submit.AdmitTimeout = admitWithin
			}
			e.links["a"].silent, e.links["a"].cancelEnds = tc.silent, true
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.silent {
				done := make(chan error, 1)
				go func() {
					_, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat"})
					done <- err
				}()
				if tc.leave != nil {
					tc.leave(t, e, nil, cancel)
				}
				select {
				case err := <-done:
					if err == nil {
						t.Fatal("a run the node never admitted was answered as admitted")
					}
				case <-time.After(ucWait):
					t.Fatal("Handle did not answer")
				}
			} else {
				rh, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat"})
				if err != nil {
					t.Fatal(err)
				}
				if ev, err := rh.Next(ctx); err != nil || ev.Type != domain.EventStart {
					t.Fatalf("first event %+v %v", ev, err)
				}
				tc.leave(t, e, rh, cancel)
			}
			ucEventually(t, "the run's end in the history", func() bool { _, done := ucObserved(obs); return len(done) > 0 })
			if got := e.links["a"].cancelReasons(); !slices.Equal(got, []string{tc.want}) {
				t.Fatalf("cancels sent with reasons %q, want [%q]", got, tc.want)
			}
			obs.mu.Lock()
			last := obs.runs[len(obs.runs)-1]
			obs.mu.Unlock()
			if last.Status != domain.RunCancelled || last.ErrorMsg != tc.want {
				t.Fatalf("history: %s %q, want cancelled %q", last.Status, last.ErrorMsg, tc.want)
			}
		})
	}
}

// A background run lost before its node answered is cancelled when the
// node is back, saying so.
func TestOrphanCancelSaysWhy(t *testing.T) {
	ucNoLeaks(t)
	reg := edge.NewRegistry()
	o := edge.NewOrphanCancels(reg, nil)
	defer o.Close()
	back := ucAdmit(t, reg, "a", "exec")
	edge.OrphanAdd(o, "a", "run_lost", &ucLink{id: "a"})
	ucEventually(t, "the cancel", func() bool { return slices.Contains(back.cancelCalls(), "run_lost") })
	if got := back.cancelReasons(); !slices.Equal(got, []string{edge.CancelLinkBroke}) {
		t.Fatalf("cancel reasons %q, want [%q]", got, edge.CancelLinkBroke)
	}
}
