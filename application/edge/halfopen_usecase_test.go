package edge_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
)

// A run the edge withdraws before its node admitted it (the node did not
// answer in time, or the caller left) is cancelled on the node. On a
// half-open link that cancel times out, and the heartbeat may declare the
// link dead only after the edge stopped following the run: the node got
// the run, and a background run outlives its link, so it ran to its end
// while its caller had been told it timed out (or was cancelled). Such a
// run is now cancelled when its node registers again, with the reason the
// edge withdrew it for. A foreground run needs no such cancel (its node
// cancels it when its stream or link goes) and gets none.
func TestWithdrawnRunWhoseCancelFailedIsCancelledWhenTheNodeIsBack(t *testing.T) {
	const admitWithin = 20 * time.Millisecond
	tests := []struct {
		name       string
		background bool
		leave      bool // the caller leaves during admission (else the admission wait ends)
		wantCode   string
		wantReason string // "" for no cancel at the node's return
	}{
		{"background, not admitted in time", true, false, domain.CodeTimeout, "node did not admit the run within 20ms"},
		{"background, caller left", true, true, domain.CodeCancelled, edge.CancelCallerLeftUnadmitted},
		{"foreground, not admitted in time", false, false, domain.CodeTimeout, ""},
		{"foreground, caller left", false, true, domain.CodeCancelled, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
			orphans := edge.NewOrphanCancels(e.reg, nil)
			t.Cleanup(orphans.Close)
			e.submit.Orphans = orphans
			if !tc.leave {
				e.submit.AdmitTimeout = admitWithin
			}
			e.submit.DrainTimeout = admitWithin
			// Half-open: the node's answers never arrive, so its start
			// answer is lost and the edge's cancel times out.
			old := e.links["a"]
			old.silent = true
			old.cancelErr = fmt.Errorf("%w: %w", domain.ErrTimeout, context.DeadlineExceeded)

			ctx, leave := context.WithCancel(context.Background())
			defer leave()
			done := make(chan error, 1)
			go func() {
				_, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "exec", Background: tc.background})
				done <- err
			}()
			ucEventually(t, "the run to reach the node", func() bool { return ucStarted(e, "a") == 1 })
			if tc.leave {
				leave()
			}
			select {
			case err := <-done:
				if ucCode(err) != tc.wantCode {
					t.Fatalf("Handle = %v, want %s", err, tc.wantCode)
				}
			case <-time.After(ucWait):
				t.Fatal("Handle did not answer")
			}
			started, _, _, _, _, _ := old.snapshot()
			run := started[0].RunID
			ucEventually(t, "the cancel on the half-open link", func() bool { return slices.Contains(old.cancelCalls(), run) })
			// The edge gives up following the run (its slot is free again)
			// before the heartbeat declares the link dead.
			ucEventually(t, "the edge to let go of the run", func() bool { return e.inFlight(t, "a") == 0 })

			// The link is declared dead; the node registers again.
			if !e.reg.Remove("a", old) {
				t.Fatal("the old link was not registered")
			}
			back := ucAdmit(t, e.reg, "a", "exec")
			orphans.NodeRegistered("a")
			if tc.wantReason == "" {
				orphans.Close() // the cancels in flight, if any, are sent
				if got := back.cancelCalls(); len(got) != 0 {
					t.Fatalf("cancels sent to the node back: %v, want none for a foreground run", got)
				}
				return
			}
			ucEventually(t, "the cancel to reach the node back", func() bool { return slices.Contains(back.cancelCalls(), run) })
			orphans.Close()
			if got := back.cancelReasons(); !slices.Equal(got, []string{tc.wantReason}) {
				t.Fatalf("cancel reasons %q, want [%q]", got, tc.wantReason)
			}
		})
	}
}

// A withdrawn background run whose link is declared dead while the edge
// still follows it is remembered as one lost with its link, and its cancel
// at the node's return gives the reason the edge withdrew it for: its
// caller was told it timed out, not node_disconnected.
func TestWithdrawnRunLostDuringItsDrainIsCancelledForItsReason(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	orphans := edge.NewOrphanCancels(e.reg, nil)
	t.Cleanup(orphans.Close)
	e.submit.Orphans = orphans
	e.submit.AdmitTimeout = 20 * time.Millisecond
	old := e.links["a"]
	old.silent = true
	old.cancelErr = fmt.Errorf("%w: %w", domain.ErrTimeout, context.DeadlineExceeded)
	_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Background: true})
	if ucCode(err) != domain.CodeTimeout {
		t.Fatalf("Handle = %v, want timeout", err)
	}
	started, _, _, _, _, _ := old.snapshot()
	run := started[0].RunID
	ucEventually(t, "the cancel on the half-open link", func() bool { return slices.Contains(old.cancelCalls(), run) })
	old.stream(t, run).fail(domain.Errorf(domain.CodeNodeDisconnected, "connection lost: heartbeat timeout"))
	ucEventually(t, "the run to be remembered", func() bool { return edge.OrphanCount(orphans) == 1 })
	if !e.reg.Remove("a", old) {
		t.Fatal("the old link was not registered")
	}
	back := ucAdmit(t, e.reg, "a", "exec")
	orphans.NodeRegistered("a")
	ucEventually(t, "the cancel to reach the node back", func() bool { return slices.Contains(back.cancelCalls(), run) })
	orphans.Close()
	if got, want := back.cancelReasons(), "node did not admit the run within 20ms"; !slices.Equal(got, []string{want}) {
		t.Fatalf("cancel reasons %q, want [%q]", got, want)
	}
}
