package edge_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// ucObserver records what the use cases report (metrics and history).
type ucObserver struct {
	mu      sync.Mutex
	runs    []domain.RunRecord
	tunnels []domain.TunnelRecord
	done    []ports.RunOutcome
	sent    []string // RunDispatched's node/adapter, in order
	regs    []string
	history map[string]domain.RunRecord
}

func (o *ucObserver) RecordRun(r domain.RunRecord) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.runs = append(o.runs, r)
}
func (o *ucObserver) RecordTunnel(t domain.TunnelRecord) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tunnels = append(o.tunnels, t)
}
func (o *ucObserver) NodeRegistration(outcome string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.regs = append(o.regs, outcome)
}
func (o *ucObserver) RunDispatched(node, adapter string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sent = append(o.sent, node+"/"+adapter)
}
func (o *ucObserver) RunFinished(r ports.RunOutcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = append(o.done, r)
}
func (o *ucObserver) TunnelFinished(ports.TunnelOutcome) {}
func (o *ucObserver) HistoryDropped(int)                 {}

func (o *ucObserver) GetRun(_ context.Context, id string) (domain.RunRecord, error) {
	if r, ok := o.history[id]; ok {
		return r, nil
	}
	return domain.RunRecord{}, domain.ErrRunNotFound
}
func (o *ucObserver) ListRuns(context.Context, domain.RunQuery) (domain.RunPage, error) {
	return domain.RunPage{}, errors.New("unused")
}
func (o *ucObserver) Usage(context.Context, domain.UsageQuery) ([]domain.UsageTotal, error) {
	return nil, errors.New("unused")
}

// A dispatched run is recorded when it starts (running, with the caller's
// key) and again with its end, usage and error; metrics hear the outcome.
func TestRunIsRecordedAndCounted(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{id: "n1", adapters: []string{"a"}})
	obs := &ucObserver{}
	e.submit.Observe = edge.Observers{Metrics: obs, History: obs}
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "alice", Scopes: []string{domain.ScopeAdmin}})
	rh, err := e.submit.Handle(ctx, edge.SubmitRun{Node: "n1", Adapter: "a", Target: "t", SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	defer rh.Close()
	e.links["n1"].stream(t, rh.RunID).push(
		domain.RunEvent{Seq: 1, Type: domain.EventStart},
		domain.RunEvent{Seq: 2, Type: domain.EventError, Error: &domain.ErrorInfo{Code: "adapter_error", Message: "boom"},
			Usage: &domain.Usage{PromptTokens: 2, CompletionTokens: 3, CostUSD: 0.1, Model: "m"}})
	for {
		ev, err := ucNext(t, rh)
		if err != nil || ev.Type.Terminal() {
			break
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.runs) != 2 {
		t.Fatalf("records = %+v", obs.runs)
	}
	start, end := obs.runs[0], obs.runs[1]
	if start.Status != domain.RunRunning || start.Key != "alice" || start.Node != "n1" || start.Target != "t" || start.SessionID != "s1" || start.ID != rh.RunID {
		t.Fatalf("start record %+v", start)
	}
	if end.Status != domain.RunFailed || end.ErrorCode != "adapter_error" || end.Usage == nil || end.Usage.CostUSD != 0.1 ||
		end.FinishedAt.IsZero() || !end.CreatedAt.Equal(start.CreatedAt) {
		t.Fatalf("end record %+v", end)
	}
	if len(obs.done) != 1 || obs.done[0].Status != domain.RunFailed || obs.done[0].Adapter != "a" || obs.done[0].FirstEvent <= 0 {
		t.Fatalf("metrics %+v", obs.done)
	}
	// Told at dispatch, so the outcome series exist (at 0) before the
	// first run ends: rate() sees that first failure.
	if len(obs.sent) != 1 || obs.sent[0] != "n1/a" {
		t.Fatalf("dispatches %v, want [n1/a]", obs.sent)
	}
}

// After an edge restart the tracker is empty: the history tells where a
// run still runs, it is cancelled there and recorded as cancelled; a run
// the history has as finished answers run_finished without asking a node.
func TestCancelFindsRunInHistory(t *testing.T) {
	ucNoLeaks(t)
	reg := edge.NewRegistry()
	l1 := ucAdmit(t, reg, "n1", "a")
	l2 := ucAdmit(t, reg, "n2", "a")
	obs := &ucObserver{history: map[string]domain.RunRecord{
		"run_live": {ID: "run_live", Node: "n2", Adapter: "a", Status: domain.RunRunning},
		"run_done": {ID: "run_done", Node: "n2", Adapter: "a", Status: domain.RunSucceeded},
	}}
	h := edge.NewCancelRunHandler(reg, edge.NewRunTracker(0))
	h.History, h.Record = obs, obs
	node, err := h.Handle(context.Background(), "run_live")
	if err != nil || node != "n2" {
		t.Fatalf("cancel = %q, %v", node, err)
	}
	if c := l2.cancelCalls(); len(c) != 1 || c[0] != "run_live" || len(l1.cancelCalls()) != 0 {
		t.Fatalf("cancels: n1 %v, n2 %v", l1.cancelCalls(), c)
	}
	if len(obs.runs) != 1 || obs.runs[0].Status != domain.RunCancelled || obs.runs[0].FinishedAt.IsZero() {
		t.Fatalf("recorded %+v", obs.runs)
	}
	if _, err := h.Handle(context.Background(), "run_done"); ucCode(err) != domain.CodeRunFinished {
		t.Fatalf("finished run: %v", err)
	}
	if len(l2.cancelCalls()) != 1 {
		t.Fatalf("a finished run was cancelled on its node: %v", l2.cancelCalls())
	}
}
