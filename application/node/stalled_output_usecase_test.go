package node_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
)

// ucStalledOutput is a RunOutput whose edge never grants credit: every
// Emit blocks until its context ends, except once release is closed.
type ucStalledOutput struct {
	release chan struct{}
	mu      sync.Mutex
	sent    []domain.RunEvent
	closed  chan struct{}
	once    sync.Once
}

func (o *ucStalledOutput) Emit(ctx context.Context, ev domain.RunEvent) error {
	if ev.Type != domain.EventStart {
		select {
		case <-o.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	o.mu.Lock()
	o.sent = append(o.sent, ev)
	o.mu.Unlock()
	return nil
}
func (o *ucStalledOutput) Done() <-chan struct{} { return nil }
func (o *ucStalledOutput) Close()                { o.once.Do(func() { close(o.closed) }) }

// A cancel must stop a run even while its events cannot be delivered (the
// caller reads slowly): the adapter's blocked Emit returns, the adapter
// stops, the slot is freed, and the terminal event is cancelled with no gap
// in the sequence once the reader catches up.
func TestCancelStopsRunBlockedOnStalledReader(t *testing.T) {
	ucNoLeaks(t)
	n, out := ucStartStalledRun(t)
	if err := n.runs.CancelRun(context.Background(), "r1", ""); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	// The adapter returns and the slot frees while the reader is still stalled.
	deadline := time.Now().Add(ucWait)
	for n.runs.InFlight() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("cancelled run still holds its slot behind a stalled reader")
		}
		time.Sleep(time.Millisecond)
	}
	close(out.release) // the reader catches up
	select {
	case <-out.closed:
	case <-time.After(ucWait):
		t.Fatal("run output never closed")
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if len(out.sent) != 2 || out.sent[0].Type != domain.EventStart || out.sent[1].Type != domain.EventCancelled || out.sent[1].Seq != 2 {
		t.Fatalf("events = %+v, want start(1) then cancelled(2)", out.sent)
	}
	run, err := n.store.GetRun(context.Background(), "r1")
	if err != nil || run.Status() != domain.RunCancelled {
		t.Fatalf("stored run: %v %v", run, err)
	}
}

// A run stopped because the node shuts down ends cancelled with "node
// shutting down", on the link and in the store, even when the stop finds
// its adapter blocked sending an event (the edge grants no credit). Before,
// the send abandoned by the stop counted as the caller having left.
func TestShutdownEndsRunBlockedOnStalledReaderAsShutdown(t *testing.T) {
	ucNoLeaks(t)
	n, out := ucStartStalledRun(t)
	stopped := make(chan struct{})
	go func() { n.runs.Stop(); close(stopped) }()
	// The adapter returns and the slot frees while the reader is still
	// stalled; then the reader catches up and takes the terminal event.
	deadline := time.Now().Add(ucWait)
	for n.runs.InFlight() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("stopped run still holds its slot behind a stalled reader")
		}
		time.Sleep(time.Millisecond)
	}
	close(out.release)
	select {
	case <-stopped:
	case <-time.After(ucWait):
		t.Fatal("Stop did not return")
	}
	out.mu.Lock()
	term := out.sent[len(out.sent)-1]
	out.mu.Unlock()
	if term.Type != domain.EventCancelled || term.Error == nil || term.Error.Message != "node shutting down" {
		t.Fatalf("terminal event = %+v (%+v), want cancelled: node shutting down", term, term.Error)
	}
	if s := n.stored(t, "r1"); s.Status != domain.RunCancelled || s.ErrorMessage != "node shutting down" {
		t.Fatalf("stored run = %s %q, want cancelled: node shutting down", s.Status, s.ErrorMessage)
	}
}

// A node shutting down tells its runs before it closes the link
// (BeginStop), so a run whose stream then ends is recorded as stopped by
// the shutdown, not as left by its caller.
func TestBeginStopClaimsShutdownBeforeTheLinkCloses(t *testing.T) {
	ucNoLeaks(t)
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{"": ucBlock(ucDelta("working"))})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	out := newUCOutput()
	out.failAfterDone = true
	go n.runs.ExecuteRun(ucReq("r1", "a", ""), out)
	a.waitStarted(t, "r1")
	n.runs.BeginStop()
	out.leave() // the link closes: the run's stream is gone
	out.waitClosed(t)
	n.runs.Stop()
	if s := n.stored(t, "r1"); s.Status != domain.RunCancelled || s.ErrorMessage != "node shutting down" {
		t.Fatalf("stored run = %s %q, want cancelled: node shutting down", s.Status, s.ErrorMessage)
	}
	if evs := n.run(t, ucReq("r2", "a", "")); len(evs) != 1 || evs[0].Error == nil || evs[0].Error.Code != domain.CodeShuttingDown {
		t.Fatalf("run after BeginStop = %s, want a single shutting_down error", ucTypes(evs))
	}
}

// ucStartStalledRun starts run r1 on a node whose adapter "a" emits deltas
// until a send fails or the run ends, to an output that accepts nothing until its release
// is closed, and returns once the adapter is sending.
func ucStartStalledRun(t *testing.T) (*ucNode, *ucStalledOutput) {
	t.Helper()
	emitting := make(chan struct{})
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
		"": func(ctx context.Context, req domain.RunRequest, sink ports.EventSink) error {
			close(emitting)
			// Once the run is ending a send may be dropped without an
			// error: the context says when to stop.
			for ctx.Err() == nil {
				if err := sink.Emit(ucDelta("x")); err != nil {
					return err
				}
			}
			return ctx.Err()
		},
	})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	out := &ucStalledOutput{release: make(chan struct{}), closed: make(chan struct{})}
	go n.runs.ExecuteRun(domain.RunRequest{RunID: "r1", Adapter: "a"}, out)
	select {
	case <-emitting:
	case <-time.After(ucWait):
		t.Fatal("adapter never started")
	}
	return n, out
}

// Once a run is cancelled its sends fail (ports.EventSink's contract), so
// an adapter that watches only its sends, not its context, stops too.
func TestSendsFailOnceTheRunIsCancelled(t *testing.T) {
	ucNoLeaks(t)
	emitting := make(chan struct{})
	var once sync.Once
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
		"": func(_ context.Context, _ domain.RunRequest, sink ports.EventSink) error {
			for {
				if err := sink.Emit(ucDelta("x")); err != nil {
					return err
				}
				once.Do(func() { close(emitting) })
			}
		},
	})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	out := newUCOutput()
	go n.runs.ExecuteRun(domain.RunRequest{RunID: "r1", Adapter: "a"}, out)
	select {
	case <-emitting:
	case <-time.After(ucWait):
		t.Fatal("adapter never started")
	}
	if err := n.runs.CancelRun(context.Background(), "r1", ""); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	evs := out.waitClosed(t)
	if last := evs[len(evs)-1]; last.Type != domain.EventCancelled {
		t.Fatalf("terminal %s, want cancelled", last.Type)
	}
}

// ucGatedAdapter holds each run in Admit until gate is closed, saying on
// admitting that it got there.
type ucGatedAdapter struct {
	*ucAdapter
	admitting chan struct{}
	gate      chan struct{}
}

func (a *ucGatedAdapter) Admit(domain.RunRequest) error {
	a.admitting <- struct{}{}
	<-a.gate
	return nil
}

// A run that passed the shutdown check before BeginStop, and was still
// being admitted when it came, is refused with shutting_down as every later
// run is, so the edge places it elsewhere. It used to be registered and
// run after the stop: the edge saw start, then complete or cancelled.
func TestRunAdmittedAcrossBeginStopIsRefused(t *testing.T) {
	ucNoLeaks(t)
	a := &ucGatedAdapter{
		ucAdapter: newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{"": ucEmit(nil, ucDelta("ran"))}),
		admitting: make(chan struct{}, 1), gate: make(chan struct{}),
	}
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	out := newUCOutput()
	go n.runs.ExecuteRun(ucReq("r1", "a", ""), out)
	select {
	case <-a.admitting:
	case <-time.After(ucWait):
		t.Fatal("the run never reached Admit")
	}
	n.runs.BeginStop()
	close(a.gate)
	evs := out.waitClosed(t)
	n.runs.Stop()
	if len(evs) != 1 || evs[0].Error == nil || evs[0].Error.Code != domain.CodeShuttingDown {
		t.Fatalf("events = %s, want a single shutting_down error", ucTypes(evs))
	}
	a.mu.Lock()
	ran := len(a.runs)
	a.mu.Unlock()
	if ran != 0 {
		t.Fatalf("the adapter ran %d runs after BeginStop", ran)
	}
}
