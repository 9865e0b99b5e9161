package node_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/adapters/store/memory"
	"iop/application/node"
	"iop/domain"
	"iop/ports"
)

func TestCancelRun(t *testing.T) {
	tests := []struct {
		name string
		// state of r1 when cancelled: "active", "completing" (the adapter
		// has emitted complete but not returned), "finished" or "unknown".
		state    string
		wantErr  error
		wantTerm domain.EventType
	}{
		{name: "active run is cancelled", state: "active", wantTerm: domain.EventCancelled},
		{name: "run whose adapter already completed", state: "completing", wantErr: domain.ErrRunFinished, wantTerm: domain.EventComplete},
		// The adapter made its end final (ports.Finisher) to write what
		// only a completed run leaves (a chat turn): the cancel is too late.
		{name: "run whose adapter is finishing", state: "finishing", wantErr: domain.ErrRunFinished, wantTerm: domain.EventComplete},
		{name: "finished run", state: "finished", wantErr: domain.ErrRunFinished, wantTerm: domain.EventComplete},
		{name: "unknown run", state: "unknown", wantErr: domain.ErrRunNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			completed, gate := make(chan struct{}), make(chan struct{})
			a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
				"block": ucBlock(ucDelta("working")),
				"hold": func(_ context.Context, _ domain.RunRequest, sink ports.EventSink) error {
					_ = sink.Emit(ucComplete(nil))
					close(completed)
					<-gate // still cleaning up when the cancel arrives
					return nil
				},
				"finish": func(_ context.Context, _ domain.RunRequest, sink ports.EventSink) error {
					if err := sink.(ports.Finisher).Finish(); err != nil {
						return err
					}
					close(completed)
					<-gate // writing the session's turn when the cancel arrives
					return sink.Emit(ucComplete(nil))
				},
				"": ucEmit(nil, ucDelta("x")),
			})
			n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})

			// What a caller sees the moment the terminal event reaches it.
			var (
				atTerminal   domain.RunStatus
				nextTerminal domain.EventType
			)
			out := newUCOutput()
			out.onTerminal = func(domain.RunEvent) {
				if r, err := n.store.GetRun(context.Background(), "r1"); err == nil {
					atTerminal = r.Status()
				}
				// Not n.run: this runs on the run manager's goroutine, not the test's.
				next := n.start(ucReq("r2", "a", ""))
				select {
				case <-next.closed:
					if evs := next.all(); len(evs) > 0 {
						nextTerminal = evs[len(evs)-1].Type
					}
				case <-time.After(ucWait):
				}
			}
			switch tc.state {
			case "active":
				go n.runs.ExecuteRun(ucReq("r1", "a", "block"), out)
				a.waitStarted(t, "r1")
			case "completing":
				go n.runs.ExecuteRun(ucReq("r1", "a", "hold"), out)
				<-completed
			case "finishing":
				go n.runs.ExecuteRun(ucReq("r1", "a", "finish"), out)
				<-completed
			case "finished":
				go n.runs.ExecuteRun(ucReq("r1", "a", ""), out)
				out.waitClosed(t)
			default:
				out = nil
			}
			err := n.runs.CancelRun(context.Background(), "r1", "")
			if (err == nil) != (tc.wantErr == nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("CancelRun = %v, want %v", err, tc.wantErr)
			}
			close(gate)
			if out == nil {
				return
			}
			evs := out.waitClosed(t)
			term := ucCheckStream(t, "r1", evs) // exactly one terminal, last
			if term.Type != tc.wantTerm {
				t.Fatalf("run ended %s, want %s", ucTypes(evs), tc.wantTerm)
			}
			if tc.wantTerm == domain.EventCancelled && (term.Error == nil || term.Error.Code != domain.CodeCancelled) {
				t.Fatalf("cancelled event error = %+v", term.Error)
			}
			// When the terminal event reaches the caller, the store is final
			// and the slot is free: a new run on this MaxConcurrency-1
			// adapter is admitted at once.
			if want := domain.StatusFor(tc.wantTerm); atTerminal != want {
				t.Fatalf("store said %q when the terminal event arrived, want %s", atTerminal, want)
			}
			if nextTerminal != domain.EventComplete {
				t.Fatalf("run started when the terminal event arrived ended %s, want complete", nextTerminal)
			}
			if s := n.stored(t, "r1"); s.Status != domain.StatusFor(tc.wantTerm) {
				t.Fatalf("stored status = %s, want %s", s.Status, domain.StatusFor(tc.wantTerm))
			}
			if err := n.runs.CancelRun(context.Background(), "r1", ""); !errors.Is(err, domain.ErrRunFinished) {
				t.Fatalf("cancel after the end = %v, want run_finished", err)
			}
		})
	}
}

// TestCancelRaceWithCompletion cancels runs at the moment their adapter
// finishes: whichever wins, the run has exactly one terminal event, and
// CancelRun reports success exactly when that event is cancelled.
func TestCancelRaceWithCompletion(t *testing.T) {
	tests := []struct {
		name   string
		finish func(sink ports.EventSink) error // what the adapter does when released
	}{
		{name: "adapter emits complete", finish: func(sink ports.EventSink) error {
			_ = sink.Emit(ucComplete(&domain.Usage{TotalTokens: 1}))
			return nil
		}},
		{name: "adapter returns without a terminal", finish: func(ports.EventSink) error { return nil }},
		{name: "adapter fails", finish: func(ports.EventSink) error { return errors.New("crashed") }},
		// A chat adapter makes its end final before it writes the turn to
		// its session: a cancel that came first makes Finish fail, and the
		// adapter writes nothing and returns that error.
		{name: "adapter finishes, then completes", finish: func(sink ports.EventSink) error {
			if err := sink.(ports.Finisher).Finish(); err != nil {
				return err
			}
			_ = sink.Emit(ucComplete(&domain.Usage{TotalTokens: 1}))
			return nil
		}},
	}
	const iterations = 200
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			var mu sync.Mutex
			gates := map[string]chan struct{}{}
			a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
				"": func(ctx context.Context, req domain.RunRequest, sink ports.EventSink) error {
					mu.Lock()
					gate := gates[req.RunID]
					mu.Unlock()
					_ = sink.Emit(ucDelta("x"))
					<-gate // deliberately deaf to ctx: completion and cancel race
					return tc.finish(sink)
				},
			})
			n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
			won := map[domain.EventType]int{}
			for i := range iterations {
				id := fmt.Sprintf("race-%d", i)
				gate := make(chan struct{})
				mu.Lock()
				gates[id] = gate
				mu.Unlock()
				out := n.start(ucReq(id, "a", ""))
				a.waitStarted(t, id)

				ready := make(chan struct{})
				var cancelErr error
				var wg sync.WaitGroup
				wg.Add(2)
				go func() { defer wg.Done(); <-ready; close(gate) }()
				go func() { defer wg.Done(); <-ready; cancelErr = n.runs.CancelRun(context.Background(), id, "") }()
				close(ready)
				wg.Wait()

				evs := out.waitClosed(t)
				term := ucCheckStream(t, id, evs)
				switch {
				case term.Type == domain.EventCancelled:
					if cancelErr != nil {
						t.Fatalf("iteration %d: run was cancelled but CancelRun = %v", i, cancelErr)
					}
				case cancelErr == nil:
					t.Fatalf("iteration %d: CancelRun succeeded but the run ended %s", i, ucTypes(evs))
				case !errors.Is(cancelErr, domain.ErrRunFinished):
					t.Fatalf("iteration %d: CancelRun = %v, want run_finished", i, cancelErr)
				}
				if s := n.stored(t, id); s.Status != domain.StatusFor(term.Type) {
					t.Fatalf("iteration %d: stored %s for terminal %s", i, s.Status, term.Type)
				}
				won[term.Type]++
			}
			t.Logf("terminal events over %d races: %v", iterations, won)
		})
	}
}

func TestRecoverMarksUnfinishedRunsFailed(t *testing.T) {
	ucNoLeaks(t)
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, nil)})
	ctx := context.Background()
	now := time.Now()
	tests := []struct {
		id         string
		setup      func(r *domain.Run) // brings a fresh queued run to its state
		wantStatus domain.RunStatus
		wantCode   string
	}{
		{id: "queued", setup: func(*domain.Run) {}, wantStatus: domain.RunFailed, wantCode: domain.CodeRunFailed},
		{id: "running", setup: func(r *domain.Run) { _ = r.Start(now) }, wantStatus: domain.RunFailed, wantCode: domain.CodeRunFailed},
		{id: "succeeded", setup: func(r *domain.Run) { _ = r.Start(now); _ = r.Finish(ucComplete(nil), now) }, wantStatus: domain.RunSucceeded},
		{id: "cancelled", setup: func(r *domain.Run) {
			_ = r.Start(now)
			_ = r.Finish(domain.RunEvent{Type: domain.EventCancelled, Error: &domain.ErrorInfo{Code: domain.CodeCancelled}}, now)
		}, wantStatus: domain.RunCancelled, wantCode: domain.CodeCancelled},
		{id: "failed", setup: func(r *domain.Run) {
			_ = r.Start(now)
			_ = r.Finish(domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "exit_1"}}, now)
		}, wantStatus: domain.RunFailed, wantCode: "exit_1"},
	}
	for _, tc := range tests {
		r, err := domain.NewRun(ucReq(tc.id, "a", "t"), now)
		if err != nil {
			t.Fatal(err)
		}
		tc.setup(r)
		if err := n.store.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.runs.Recover(ctx); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			s := n.stored(t, tc.id)
			if s.Status != tc.wantStatus || s.ErrorCode != tc.wantCode {
				t.Fatalf("after Recover: %s (%q), want %s (%q)", s.Status, s.ErrorCode, tc.wantStatus, tc.wantCode)
			}
			if tc.wantStatus == domain.RunFailed && s.FinishedAt.IsZero() {
				t.Fatal("recovered run has no finish time")
			}
		})
	}
}

// The transport hands a run request and a cancel right behind it (the edge
// cancels a run whose caller left during admission) to goroutines of their
// own, so the cancel may reach the run manager first. It must not be lost:
// before, CancelRun answered run_not_found and a background run went on to
// its end (all 200 of these did).
func TestCancelRightBehindItsRunIsNotLost(t *testing.T) {
	ucNoLeaks(t)
	const iterations = 200
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: iterations}, map[string]ucExecFunc{"": ucBlock(ucDelta("working"))})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	outs := make([]*ucOutput, iterations)
	for i := range iterations {
		req := ucReq(fmt.Sprintf("r%d", i), "a", "")
		req.Background = true
		outs[i] = newUCOutput()
		go n.runs.ExecuteRun(req, outs[i])
		// Found (nil), not yet (run_not_found), or already ended by this
		// very cancel (run_finished): every answer is honest, and the run
		// must end cancelled whichever it was.
		err := n.runs.CancelRun(context.Background(), req.RunID, "")
		if err != nil && !errors.Is(err, domain.ErrRunNotFound) && !errors.Is(err, domain.ErrRunFinished) {
			t.Fatalf("CancelRun %s = %v", req.RunID, err)
		}
	}
	early := 0
	for i, out := range outs {
		id := fmt.Sprintf("r%d", i)
		evs := out.waitClosed(t)
		term := ucCheckStream(t, id, evs)
		if term.Type != domain.EventCancelled || term.Error == nil || term.Error.Code != domain.CodeCancelled {
			t.Fatalf("run %s ended %s, want cancelled", id, ucTypes(evs))
		}
		if len(evs) == 1 {
			early++ // refused before it started: the cancel came first
		}
		if s := n.stored(t, id); s.Status != domain.RunCancelled {
			t.Fatalf("run %s stored as %s, want cancelled", id, s.Status)
		}
	}
	t.Logf("%d of %d cancels arrived before their run", early, iterations)
	if n.runs.InFlight() != 0 {
		t.Fatalf("%d runs still in flight", n.runs.InFlight())
	}
}

// Recover finishes every unfinished run, not only the first page the store
// lists (1,000 at most): before, a node that crashed with more left the
// rest running for ever.
func TestRecoverFinishesMoreRunsThanOnePage(t *testing.T) {
	ucNoLeaks(t)
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, nil)})
	ctx := context.Background()
	now := time.Now()
	const running, queued = 2500, 1200
	for i := range running + queued {
		r, err := domain.NewRun(ucReq(fmt.Sprintf("r%d", i), "a", "t"), now.Add(time.Duration(i)*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if i < running {
			_ = r.Start(now)
		}
		if err := n.store.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.runs.Recover(ctx); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	for _, st := range []domain.RunStatus{domain.RunRunning, domain.RunQueued} {
		if left, err := n.store.ListRuns(ctx, domain.RunFilter{Status: st, Limit: 10}); err != nil || len(left) != 0 {
			t.Fatalf("after Recover %d runs still %s (%v)", len(left), st, err)
		}
	}
	if s := n.stored(t, "r0"); s.Status != domain.RunFailed || s.ErrorCode != domain.CodeRunFailed {
		t.Fatalf("oldest run after Recover: %+v", s)
	}
}

// ucStuckStore is a run store whose UpdateRun reports success and changes
// nothing: Recover must not list and "finish" the same runs for ever.
type ucStuckStore struct{ ports.RunStore }

func (ucStuckStore) UpdateRun(context.Context, string, func(*domain.Run) error) error { return nil }

func TestRecoverStopsWhenRunsCannotBeFinished(t *testing.T) {
	ucNoLeaks(t)
	store := memory.NewRunStore()
	ctx := context.Background()
	r, _ := domain.NewRun(ucReq("stuck", "a", "t"), time.Now())
	_ = r.Start(time.Now())
	if err := store.CreateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	m := node.NewRunManager(node.NewRuntime(&ucFactory{}, nil), ucStuckStore{store}, nil)
	defer m.Stop()
	done := make(chan error, 1)
	go func() { done <- m.Recover(ctx) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "stuck") {
			t.Fatalf("Recover over a store that cannot finish runs = %v, want an error naming the run", err)
		}
	case <-time.After(ucWait):
		t.Fatal("Recover did not return over a store that cannot finish runs")
	}
}
