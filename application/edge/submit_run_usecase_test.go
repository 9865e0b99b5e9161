package edge_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
)

// ucEdge is the edge's run path over fake nodes.
type ucEdge struct {
	reg    *edge.Registry
	runs   *edge.RunTracker
	bus    *ucBus
	submit *edge.SubmitRunHandler
	links  map[string]*ucLink
}

// ucNodeSpec is one connected node: its id and the adapters it offers.
type ucNodeSpec struct {
	id       string
	adapters []string
}

func newUCEdge(t *testing.T, nodes ...ucNodeSpec) *ucEdge {
	t.Helper()
	e := &ucEdge{reg: edge.NewRegistry(), runs: edge.NewRunTracker(0), bus: newUCBus(), links: map[string]*ucLink{}}
	for _, n := range nodes {
		e.links[n.id] = ucAdmit(t, e.reg, n.id, n.adapters...)
	}
	e.submit = edge.NewSubmitRunHandler(e.reg, e.runs, e.bus, nil)
	t.Cleanup(func() { ucWithin(t, "SubmitRunHandler.Stop", e.submit.Stop) })
	return e
}

func (e *ucEdge) inFlight(t *testing.T, node string) int {
	t.Helper()
	n, ok := e.reg.Get(node)
	if !ok {
		t.Fatalf("node %s is not registered", node)
	}
	return n.RunsInFlight
}

// ucNext calls Next with a deadline.
func ucNext(t *testing.T, rh *edge.RunHandle) (domain.RunEvent, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ucWait)
	defer cancel()
	ev, err := rh.Next(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Next did not answer within %s", ucWait)
	}
	return ev, err
}

func ucEv(seq uint64, typ domain.EventType, text string) domain.RunEvent {
	ev := domain.RunEvent{Seq: seq, Type: typ, Text: text}
	if typ == domain.EventError {
		ev.Error = &domain.ErrorInfo{Code: "boom", Message: text}
	}
	return ev
}

func TestSubmitRunPicksNode(t *testing.T) {
	tests := []struct {
		name  string
		nodes []ucNodeSpec
		// busy lists runs already in flight, by node (explicitly placed).
		busy     map[string]int
		cmd      edge.SubmitRun
		wantNode string
		wantCode string
	}{
		{name: "explicit node",
			nodes:    []ucNodeSpec{{"a", []string{"exec"}}, {"b", []string{"exec"}}},
			busy:     map[string]int{"a": 0, "b": 3},
			cmd:      edge.SubmitRun{Node: "b", Adapter: "exec", Target: "t"},
			wantNode: "b"},
		{name: "unknown explicit node",
			nodes:    []ucNodeSpec{{"a", []string{"exec"}}},
			cmd:      edge.SubmitRun{Node: "zz", Adapter: "exec"},
			wantCode: domain.CodeNodeNotFound},
		// A node the run would go to without the adapter refuses it as the
		// node would, before dispatch: the caller's adapter string never
		// labels a run metric.
		{name: "single node without the adapter is adapter_not_found",
			nodes:    []ucNodeSpec{{"solo", []string{"exec"}}},
			cmd:      edge.SubmitRun{Adapter: "ollama", Target: "llama3"},
			wantCode: domain.CodeAdapterNotFound},
		{name: "explicit node without the adapter is adapter_not_found",
			nodes:    []ucNodeSpec{{"a", []string{"exec"}}, {"b", []string{"ollama"}}},
			cmd:      edge.SubmitRun{Node: "a", Adapter: "ollama"},
			wantCode: domain.CodeAdapterNotFound},
		{name: "fewest in flight among nodes offering the adapter",
			nodes:    []ucNodeSpec{{"a", []string{"exec"}}, {"b", []string{"exec"}}, {"c", []string{"ollama"}}},
			busy:     map[string]int{"a": 2, "b": 1},
			cmd:      edge.SubmitRun{Adapter: "exec", Target: "t"},
			wantNode: "b"},
		{name: "ties go to the lower id",
			nodes:    []ucNodeSpec{{"b", []string{"exec"}}, {"a", []string{"exec"}}},
			cmd:      edge.SubmitRun{Adapter: "exec"},
			wantNode: "a"},
		{name: "a busier node offering the adapter beats an idle one that does not",
			nodes:    []ucNodeSpec{{"a", []string{"exec"}}, {"b", []string{"exec", "ollama"}}},
			busy:     map[string]int{"b": 3},
			cmd:      edge.SubmitRun{Adapter: "ollama"},
			wantNode: "b"},
		{name: "no node offers the adapter",
			nodes:    []ucNodeSpec{{"a", []string{"exec"}}, {"b", []string{"exec"}}},
			cmd:      edge.SubmitRun{Adapter: "codex"},
			wantCode: domain.CodeNoNodeAvailable},
		{name: "no node connected",
			cmd:      edge.SubmitRun{Adapter: "exec"},
			wantCode: domain.CodeNoNodeAvailable},
		{name: "adapter missing",
			nodes:    []ucNodeSpec{{"a", []string{"exec"}}},
			cmd:      edge.SubmitRun{Target: "t"},
			wantCode: domain.CodeInvalidRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, tc.nodes...)
			for node, n := range tc.busy {
				for range n {
					if _, err := e.submit.Handle(context.Background(), edge.SubmitRun{Node: node, Adapter: "exec"}); err != nil {
						t.Fatalf("preload %s: %v", node, err)
					}
				}
			}
			startedBefore := map[string]int{}
			for id, l := range e.links {
				s, _, _, _, _, _ := l.snapshot()
				startedBefore[id] = len(s)
			}

			cmd := tc.cmd
			cmd.Input, cmd.SessionID, cmd.Options = []byte("hello"), "sess-1", []byte(`{"k":1}`)
			rh, err := e.submit.Handle(context.Background(), cmd)
			if got := ucCode(err); got != tc.wantCode {
				t.Fatalf("Handle error = %v (code %q), want %q", err, got, tc.wantCode)
			}
			for id, l := range e.links {
				started, _, _, _, _, _ := l.snapshot()
				grew := len(started) - startedBefore[id]
				if id == tc.wantNode && tc.wantCode == "" {
					if grew != 1 {
						t.Fatalf("node %s started %d runs, want 1", id, grew)
					}
					req := started[len(started)-1]
					if req.RunID != rh.RunID || req.RunID == "" || req.Adapter != cmd.Adapter || req.Target != cmd.Target ||
						string(req.Input) != "hello" || req.SessionID != "sess-1" || string(req.Options) != `{"k":1}` || req.Background {
						t.Fatalf("node %s got request %+v for handle %s", id, req, rh.RunID)
					}
					if rh.Node != id {
						t.Fatalf("handle names node %s, want %s", rh.Node, id)
					}
					if node, active, known := e.runs.Lookup(rh.RunID); !known || !active || node != id {
						t.Fatalf("tracker has %s: node %q active %v known %v", rh.RunID, node, active, known)
					}
					if got, want := e.inFlight(t, id), tc.busy[id]+1; got != want {
						t.Fatalf("node %s has %d runs in flight, want %d", id, got, want)
					}
				} else if grew != 0 {
					t.Fatalf("node %s started %d runs, want none", id, grew)
				}
			}
		})
	}
}

func TestSubmitRunStartFailureReleasesTheSlot(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	e.links["a"].startErr = domain.Errorf(domain.CodeNodeDisconnected, "link down")
	_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec"})
	if !errors.Is(err, domain.ErrNodeDisconnected) {
		t.Fatalf("err = %v, want node_disconnected", err)
	}
	if got := e.inFlight(t, "a"); got != 0 {
		t.Fatalf("%d runs in flight after a failed start", got)
	}
}

func TestSubmitRunRelaysEventsInOrder(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}}, ucNodeSpec{"b", []string{"exec"}})
	rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Node: "a", Adapter: "exec", Target: "t"})
	if err != nil {
		t.Fatal(err)
	}
	usage := &domain.Usage{PromptTokens: 3, CompletionTokens: 4}
	script := []domain.RunEvent{
		ucEv(1, domain.EventStart, ""),
		ucEv(2, domain.EventDelta, "hel"),
		ucEv(3, domain.EventReasoningDelta, "hmm"),
		ucEv(4, domain.EventDelta, "lo"),
		{Seq: 5, Type: domain.EventComplete, Usage: usage},
	}
	e.links["a"].stream(t, rh.RunID).push(script[1:]...) // the fake node sent start

	var got []domain.RunEvent
	for {
		ev, err := ucNext(t, rh)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		got = append(got, ev)
		if len(got) > len(script) {
			t.Fatalf("Next keeps returning events after the terminal one: %+v", got)
		}
	}
	if len(got) != len(script) {
		t.Fatalf("got %d events, want %d", len(got), len(script))
	}
	for i, ev := range got {
		if ev.Seq != script[i].Seq || ev.Type != script[i].Type || ev.Text != script[i].Text || ev.RunID != rh.RunID {
			t.Fatalf("event %d = %+v, want %+v with run id %s", i, ev, script[i], rh.RunID)
		}
	}
	if got[4].Usage == nil || got[4].Usage.CompletionTokens != 4 {
		t.Fatalf("usage lost: %+v", got[4].Usage)
	}
	if _, err := ucNext(t, rh); !errors.Is(err, io.EOF) {
		t.Fatalf("Next after the end = %v, want io.EOF", err)
	}
	onBus := e.bus.runEvents(rh.RunID)
	if len(onBus) != len(script) {
		t.Fatalf("bus has %d run events, want %d: %s", len(onBus), len(script), ucDescribe(e.bus.all()))
	}
	for i, ev := range onBus {
		if ev.Seq != script[i].Seq || ev.Type != script[i].Type {
			t.Fatalf("bus event %d = %+v, want %+v", i, ev, script[i])
		}
	}
	for _, bev := range e.bus.ofType(domain.BusRunEvent) {
		if bev.Node != "a" {
			t.Fatalf("run event published for node %q, want a", bev.Node)
		}
	}
	// The run's slot is given back once the terminal event went by, so the
	// next auto-placed run ties and goes to the lower id again.
	if got := e.inFlight(t, "a"); got != 0 {
		t.Fatalf("%d runs in flight on a after the terminal event", got)
	}
	if _, active, known := e.runs.Lookup(rh.RunID); active || !known {
		t.Fatalf("tracker: active %v known %v, want finished", active, known)
	}
	rh2, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec"})
	if err != nil || rh2.Node != "a" {
		t.Fatalf("next run went to %v (%v), want a", rh2, err)
	}
	rh.Close() // after the end: nothing to cancel
	if c := e.links["a"].cancelCalls(); len(c) != 0 {
		t.Fatalf("Close after the terminal event cancelled %v", c)
	}
}

func TestSubmitRunLinkFailureEndsTheRun(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		{"node disconnected", domain.Errorf(domain.CodeNodeDisconnected, "connection lost: heartbeat timeout")},
		{"stream reset", domain.Errorf(domain.CodeStreamReset, "node reset the stream: flow_control")},
		{"stream ended early", io.EOF},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
			rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec"})
			if err != nil {
				t.Fatal(err)
			}
			s := e.links["a"].stream(t, rh.RunID)
			s.push(ucEv(2, domain.EventDelta, "partial"))
			s.fail(tc.err)
			for want := uint64(1); want <= 2; want++ {
				if ev, err := ucNext(t, rh); err != nil || ev.Seq != want {
					t.Fatalf("event %d = %+v, %v", want, ev, err)
				}
			}
			ev, err := ucNext(t, rh)
			if err != nil {
				t.Fatalf("Next after a link failure = %v, want a synthesized terminal event", err)
			}
			if ev.Type != domain.EventError || ev.Error == nil || ev.Error.Code != domain.CodeNodeDisconnected || ev.Seq != 3 || ev.RunID != rh.RunID || ev.Time.IsZero() {
				t.Fatalf("synthesized event = %+v (error %+v), want error node_disconnected seq 3", ev, ev.Error)
			}
			if _, err := ucNext(t, rh); !errors.Is(err, io.EOF) {
				t.Fatalf("Next after the synthesized terminal = %v, want io.EOF", err)
			}
			onBus := e.bus.runEvents(rh.RunID)
			if len(onBus) != 3 || onBus[2].Error == nil || onBus[2].Error.Code != domain.CodeNodeDisconnected {
				t.Fatalf("bus run events = %+v", onBus)
			}
			if got := e.inFlight(t, "a"); got != 0 {
				t.Fatalf("%d runs in flight after the link failed", got)
			}
		})
	}
}

func TestSubmitRunCallerLeaves(t *testing.T) {
	tests := []struct {
		name string
		// nodeAnswers: the node ends the run with cancelled when asked.
		nodeAnswers  bool
		drainTimeout time.Duration
		wantTerminal domain.EventType // on the bus; "" for none
	}{
		{name: "cancelled on the node and drained to the end", nodeAnswers: true, drainTimeout: ucWait, wantTerminal: domain.EventCancelled},
		{name: "a node that never answers is abandoned after the drain timeout", nodeAnswers: false, drainTimeout: 20 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
			e.submit.DrainTimeout = tc.drainTimeout
			link := e.links["a"]
			link.cancelEnds = tc.nodeAnswers
			rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec"})
			if err != nil {
				t.Fatal(err)
			}
			s := link.stream(t, rh.RunID)
			if ev, err := ucNext(t, rh); err != nil || ev.Type != domain.EventStart {
				t.Fatalf("first event = %+v, %v", ev, err)
			}
			rh.Close()
			select {
			case <-s.closed:
			case <-time.After(ucWait):
				t.Fatal("the run's stream was never let go")
			}
			if got := link.cancelCalls(); !slices.Equal(got, []string{rh.RunID}) {
				t.Fatalf("CancelRun calls = %v, want [%s]", got, rh.RunID)
			}
			if tc.wantTerminal != "" {
				evs := e.bus.waitTerminal(t, rh.RunID)
				if last := evs[len(evs)-1]; last.Type != tc.wantTerminal {
					t.Fatalf("bus terminal = %+v, want %s", last, tc.wantTerminal)
				}
			} else if evs := e.bus.runEvents(rh.RunID); len(evs) != 1 {
				t.Fatalf("bus run events = %+v, want only the start", evs)
			}
			ucEventually(t, "the slot to be released", func() bool { return e.inFlight(t, "a") == 0 })
			// The drain goroutine finishes the run in the tracker just after it
			// releases the slot: wait for that too, rather than race it.
			ucEventually(t, "the tracker to let go of the abandoned run", func() bool {
				_, active, _ := e.runs.Lookup(rh.RunID)
				return !active
			})
		})
	}
}

func TestSubmitRunBackgroundIsDrainedByTheEdge(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rh.Background || rh.RunID == "" || rh.Node != "a" {
		t.Fatalf("handle = %+v", rh)
	}
	started, _, _, _, _, _ := e.links["a"].snapshot()
	if len(started) != 1 || !started[0].Background {
		t.Fatalf("node got %+v, want one background request", started)
	}
	if _, err := ucNext(t, rh); err == nil {
		t.Fatal("Next on a background handle succeeded; the edge owns its stream")
	}
	rh.Close() // the caller leaving must not cancel a background run
	e.links["a"].stream(t, rh.RunID).push(ucEv(2, domain.EventDelta, "x"), ucEv(3, domain.EventComplete, ""))
	evs := e.bus.waitTerminal(t, rh.RunID)
	if len(evs) != 3 || evs[0].Seq != 1 || evs[1].Seq != 2 || evs[2].Type != domain.EventComplete {
		t.Fatalf("bus run events = %+v", evs)
	}
	if c := e.links["a"].cancelCalls(); len(c) != 0 {
		t.Fatalf("background run was cancelled: %v", c)
	}
	ucEventually(t, "the slot to be released", func() bool { return e.inFlight(t, "a") == 0 })

	// A background run that never ends is let go when the edge stops.
	rh2, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	s2 := e.links["a"].stream(t, rh2.RunID)
	ucWithin(t, "Stop with a background run in flight", e.submit.Stop)
	if !s2.isClosed() {
		t.Fatal("Stop left the background run's stream open")
	}
}

// A run request too large for one frame on the node link is refused before
// anything is dispatched or counted, instead of being lost on the wire.
func TestSubmitRunRefusesOversizedRequest(t *testing.T) {
	e := newUCEdge(t, ucNodeSpec{"n1", []string{"exec"}})
	e.submit.MaxRequestBytes = 64 << 10
	ctx, cancel := context.WithTimeout(context.Background(), ucWait)
	defer cancel()
	_, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "exec", Input: make([]byte, 64<<10)})
	if domain.CodeOf(err) != domain.CodeInvalidRequest {
		t.Fatalf("err %v, want invalid_request", err)
	}
	if n := len(e.links["n1"].started); n != 0 || e.inFlight(t, "n1") != 0 {
		t.Fatalf("an oversized run was dispatched (%d) or counted (%d)", n, e.inFlight(t, "n1"))
	}
	rh, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "exec", Input: make([]byte, 32<<10), Background: true})
	if err != nil || rh == nil {
		t.Fatalf("a run that fits was refused: %v", err)
	}
}

// A node cannot publish events under another run's id: whatever run id
// the node puts in an event, the edge relays and publishes it as the run
// whose stream it came on.
func TestSubmitRunEventsKeepTheirStreamsRunID(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Node: "a", Adapter: "exec", Target: "t"})
	if err != nil {
		t.Fatal(err)
	}
	forged := ucEv(2, domain.EventComplete, "")
	forged.RunID = "run_someone_else"
	e.links["a"].stream(t, rh.RunID).push(forged)
	for _, ev := range ucDrain(t, rh) {
		if ev.RunID != rh.RunID {
			t.Fatalf("event relayed with run id %q, want %q", ev.RunID, rh.RunID)
		}
	}
	if other := e.bus.runEvents("run_someone_else"); len(other) != 0 {
		t.Fatalf("the bus holds %d events of a run this node does not run", len(other))
	}
	if onBus := e.bus.runEvents(rh.RunID); len(onBus) != 2 {
		t.Fatalf("bus has %d events of the run, want start and complete", len(onBus))
	}
}

// ucDrain returns rh's events up to its end (Next's io.EOF).
func ucDrain(t *testing.T, rh *edge.RunHandle) []domain.RunEvent {
	t.Helper()
	var evs []domain.RunEvent
	for range 1000 {
		ev, err := ucNext(t, rh)
		if errors.Is(err, io.EOF) {
			return evs
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		evs = append(evs, ev)
	}
	t.Fatal("the run never ended")
	return nil
}

// TestBackgroundRunOutlivesItsLinkAtTheEdge: a background run goes on on
// its node when the node's link breaks, so the edge does not end it: no
// made-up terminal event, its history stays running, its slot is freed and
// the tracker forgets it (a cancel then goes by the history to the node
// once it is back, TestCancelFindsRunInHistory). A node that resets the
// stream itself still ends the run.
func TestBackgroundRunOutlivesItsLinkAtTheEdge(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		ended bool
	}{
		{"link lost", domain.Errorf(domain.CodeNodeDisconnected, "connection lost: heartbeat timeout"), false},
		{"the node reset the stream", domain.Errorf(domain.CodeStreamReset, "node reset the stream: internal"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
			obs := &ucObserver{}
			e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
			rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Background: true})
			if err != nil {
				t.Fatal(err)
			}
			s := e.links["a"].stream(t, rh.RunID)
			s.push(ucEv(2, domain.EventDelta, "x"))
			s.fail(tc.err)
			ucEventually(t, "the slot to be released", func() bool { return e.inFlight(t, "a") == 0 })
			if tc.ended {
				if evs := e.bus.waitTerminal(t, rh.RunID); evs[len(evs)-1].Error == nil {
					t.Fatalf("bus run events = %+v", evs)
				}
				return
			}
			ucEventually(t, "the tracker to forget the run", func() bool { _, _, known := e.runs.Lookup(rh.RunID); return !known })
			for _, ev := range e.bus.runEvents(rh.RunID) {
				if ev.Type.Terminal() {
					t.Fatalf("the edge ended a run its node goes on with: %+v", ev)
				}
			}
			obs.mu.Lock()
			defer obs.mu.Unlock()
			for _, r := range obs.runs {
				if r.Status != domain.RunRunning {
					t.Fatalf("history record %+v, want the run still running", r)
				}
			}
		})
	}
}

// TestBackgroundRunLinkLostBeforeAdmission: a background run whose link
// breaks before the node admitted it is not "going on on the node" (the
// edge cannot know the node got it): the caller gets node_disconnected at
// once, not a timeout, and the history records the run failed, not running.
func TestBackgroundRunLinkLostBeforeAdmission(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	e.links["a"].silent = true
	obs := &ucObserver{}
	e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
	if _, err := ucLoseBeforeAdmission(t, e, "a"); ucCode(err) != domain.CodeNodeDisconnected {
		t.Fatalf("Handle = %v, want node_disconnected", err)
	}
	if got := e.inFlight(t, "a"); got != 0 {
		t.Fatalf("%d runs in flight after the loss", got)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if n := len(obs.runs); n == 0 || obs.runs[n-1].Status != domain.RunFailed || obs.runs[n-1].ErrorCode != domain.CodeNodeDisconnected {
		t.Fatalf("history records %+v, want the run failed with node_disconnected", obs.runs)
	}
}

// The node may have got a background run whose link broke before it
// answered: the caller was told node_disconnected and has no run id, so
// the run must not go on there. When the node registers again it gets a
// cancel for it.
func TestBackgroundRunLostBeforeAdmissionIsCancelledWhenTheNodeIsBack(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	orphans := edge.NewOrphanCancels(e.reg, nil)
	t.Cleanup(orphans.Close)
	e.submit.Orphans = orphans
	e.links["a"].silent = true
	run, err := ucLoseBeforeAdmission(t, e, "a")
	if ucCode(err) != domain.CodeNodeDisconnected {
		t.Fatalf("Handle = %v, want node_disconnected", err)
	}
	if !e.reg.Remove("a", e.links["a"]) {
		t.Fatal("the old link was not registered")
	}
	back := ucAdmit(t, e.reg, "a", "exec")
	orphans.NodeRegistered("a")
	ucEventually(t, "the cancel to reach the node", func() bool { return slices.Contains(back.cancelCalls(), run) })
	orphans.NodeRegistered("a") // sent once, not again
	orphans.Close()
	if got := back.cancelCalls(); len(got) != 1 {
		t.Fatalf("cancels sent: %v, want one for %s", got, run)
	}
}

// The remembered runs are bounded, the oldest of the node with the most
// going first.
func TestOrphanCancelsAreBounded(t *testing.T) {
	ucNoLeaks(t)
	reg := edge.NewRegistry()
	o := edge.NewOrphanCancels(reg, nil)
	defer o.Close()
	for i := range 1030 {
		edge.OrphanAdd(o, "a", fmt.Sprintf("run_%04d", i), nil)
	}
	edge.OrphanAdd(o, "b", "run_b", nil)
	a := ucAdmit(t, reg, "a", "exec")
	b := ucAdmit(t, reg, "b", "exec")
	o.NodeRegistered("a")
	o.NodeRegistered("b")
	ucEventually(t, "the cancels", func() bool { return len(a.cancelCalls()) == 1023 && len(b.cancelCalls()) == 1 })
	if first := a.cancelCalls()[0]; first != "run_0007" {
		t.Fatalf("first cancel %s, want the oldest kept, run_0007", first)
	}
}

// A node back on a new link before its lost run was remembered gets the
// cancel at once, not at its next registration.
func TestOrphanOfANodeAlreadyBackIsCancelledAtOnce(t *testing.T) {
	ucNoLeaks(t)
	reg := edge.NewRegistry()
	o := edge.NewOrphanCancels(reg, nil)
	defer o.Close()
	gone := &ucLink{id: "a"}
	back := ucAdmit(t, reg, "a", "exec")
	edge.OrphanAdd(o, "a", "run_lost", gone)
	ucEventually(t, "the cancel", func() bool { return slices.Contains(back.cancelCalls(), "run_lost") })
}

// ucLoseBeforeAdmission submits a background exec run to node (whose link
// must be silent), breaks its stream before the node answers, and returns
// the run's id and what Handle answered.
func ucLoseBeforeAdmission(t *testing.T, e *ucEdge, node string) (string, error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Background: true})
		done <- err
	}()
	ucEventually(t, "the run to reach the node", func() bool { s, _, _, _, _, _ := e.links[node].snapshot(); return len(s) == 1 })
	s, _, _, _, _, _ := e.links[node].snapshot()
	e.links[node].stream(t, s[0].RunID).fail(domain.Errorf(domain.CodeNodeDisconnected, "connection lost: heartbeat timeout"))
	select {
	case err := <-done:
		return s[0].RunID, err
	case <-time.After(ucWait):
		t.Fatal("Handle did not answer after the link broke")
		return "", nil
	}
}

// A node whose link has no stream free refuses to open a run's stream
// (transport: a too_many_streams reset, at_capacity): the node never saw
// the run, so the caller gets at_capacity (429, try again), not
// node_disconnected, and a background run is not remembered for a cancel.
func TestRunRefusedForStreamsAtAdmissionIsAtCapacity(t *testing.T) {
	for _, background := range []bool{false, true} {
		t.Run(fmt.Sprintf("background=%v", background), func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
			orphans := edge.NewOrphanCancels(e.reg, nil)
			t.Cleanup(orphans.Close)
			e.submit.Orphans = orphans
			e.links["a"].silent = true
			done := make(chan error, 1)
			go func() {
				_, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Background: background})
				done <- err
			}()
			ucEventually(t, "the run to reach the node", func() bool { s, _, _, _, _, _ := e.links["a"].snapshot(); return len(s) == 1 })
			s, _, _, _, _, _ := e.links["a"].snapshot()
			e.links["a"].stream(t, s[0].RunID).fail(domain.Errorf(domain.CodeAtCapacity, "the node has too many open streams on its link"))
			var err error
			select {
			case err = <-done:
			case <-time.After(ucWait):
				t.Fatal("Handle did not answer")
			}
			if ucCode(err) != domain.CodeAtCapacity {
				t.Fatalf("Handle = %v, want at_capacity", err)
			}
			if got := e.inFlight(t, "a"); got != 0 {
				t.Fatalf("%d runs in flight after the refusal", got)
			}
			if n := edge.OrphanCount(orphans); n != 0 {
				t.Fatalf("%d runs remembered for a cancel, though the node never saw the run", n)
			}
		})
	}
}
