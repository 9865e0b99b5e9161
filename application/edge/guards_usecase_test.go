package edge_test

import (
	"context"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// Once the edge is stopping, a run is refused with shutting_down before a
// node is chosen or asked.
func TestSubmitRunRefusedOnceStopping(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	ucWithin(t, "Stop", e.submit.Stop)
	for _, bg := range []bool{false, true} {
		_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Target: "t", Background: bg})
		if ucCode(err) != domain.CodeShuttingDown {
			t.Fatalf("background %v: err %v, want shutting_down", bg, err)
		}
	}
	if started, _, _, _, _, _ := e.links["a"].snapshot(); len(started) != 0 || e.inFlight(t, "a") != 0 {
		t.Fatalf("a run was dispatched (%d) or counted (%d) after Stop", len(started), e.inFlight(t, "a"))
	}
}

// The tracker remembers at most its limit of finished runs, oldest
// forgotten first; a forgotten run is unknown to cancel.
func TestRunTrackerForgetsOldestFinishedRuns(t *testing.T) {
	ucNoLeaks(t)
	reg := edge.NewRegistry()
	link := ucAdmit(t, reg, "a", "exec")
	tracker := edge.NewRunTracker(2)
	submit := edge.NewSubmitRunHandler(reg, tracker, newUCBus(), nil)
	defer ucWithin(t, "Stop", submit.Stop)
	var ids []string
	for range 3 {
		rh, err := submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Target: "t"})
		if err != nil {
			t.Fatal(err)
		}
		link.stream(t, rh.RunID).push(ucEv(2, domain.EventComplete, ""))
		for {
			ev, err := ucNext(t, rh)
			if err != nil || ev.Type.Terminal() {
				break
			}
		}
		ids = append(ids, rh.RunID)
	}
	if _, _, known := tracker.Lookup(ids[0]); known {
		t.Fatalf("the oldest finished run is still remembered beyond the limit of 2")
	}
	for _, id := range ids[1:] {
		if _, active, known := tracker.Lookup(id); !known || active {
			t.Fatalf("run %s: known %v active %v, want remembered as finished", id, known, active)
		}
	}
	cancel := edge.NewCancelRunHandler(reg, tracker)
	link.cancelErr = domain.Errorf(domain.CodeRunNotFound, "not here")
	if _, err := cancel.Handle(context.Background(), ids[0]); ucCode(err) != domain.CodeRunNotFound {
		t.Fatalf("cancel of a forgotten run: %v, want run_not_found from the nodes", err)
	}
	if _, err := cancel.Handle(context.Background(), ids[2]); ucCode(err) != domain.CodeRunFinished {
		t.Fatalf("cancel of a remembered run: %v, want run_finished", err)
	}
}

// A command that reports progress (ollama.pull, or any other: the edge
// knows none by name) outlives the ordinary timeout, up to the long one; a
// command that stays silent ends at the ordinary timeout.
func TestProgressLiftsTheOrdinaryTimeout(t *testing.T) {
	ucNoLeaks(t)
	reg := edge.NewRegistry()
	link := ucAdmit(t, reg, "a", "exec")
	h := edge.NewNodeCommandHandler(reg)
	h.Timeout, h.LongTimeout = 100*time.Millisecond, time.Hour
	progress := ports.CommandReply{Progress: []byte(`{"status":"pulling manifest"}`)}
	link.commands = map[string][]ports.CommandReply{"ollama.pull": {progress}, "x.download": {progress}, "capabilities": nil}

	cs, ctx, cancel, err := h.Handle(context.Background(), "a", "capabilities", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Recv(ctx); err == nil || context.Cause(ctx) != context.DeadlineExceeded {
		t.Fatalf("silent command: %v (cause %v), want the ordinary timeout", err, context.Cause(ctx))
	}
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) < 30*time.Minute {
		t.Fatalf("the long bound is not set: %v %v", dl, ok)
	}
	cs.Close()
	cancel()

	for _, name := range []string{"ollama.pull", "x.download"} {
		cs, ctx, cancel, err := h.Handle(context.Background(), "a", name, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r, err := cs.Recv(ctx); err != nil || r.Progress == nil {
			t.Fatalf("%s: first reply %+v, %v", name, r, err)
		}
		time.Sleep(3 * h.Timeout)
		if ctx.Err() != nil {
			t.Fatalf("%s: ended by the ordinary timeout after reporting progress", name)
		}
		cs.Close()
		cancel()
	}
}
