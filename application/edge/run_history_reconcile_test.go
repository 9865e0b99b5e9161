package edge_test

import (
	"context"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
)

// reconcileSetup is an edge that restarted: its history holds run r1 as
// running on node n1, its tracker knows nothing, and n1's store says how
// the run ended.
func reconcileSetup(t *testing.T, nodeRuns map[string]string, connected bool) (*edge.RunHistoryHandler, *ucObserver, *qrLink) {
	t.Helper()
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	obs := &ucObserver{history: map[string]domain.RunRecord{
		"r1": {ID: "r1", Node: "n1", Adapter: "exec", Key: "alice", Status: domain.RunRunning, CreatedAt: created},
	}}
	link := &qrLink{id: "n1", runs: nodeRuns}
	var reg *edge.Registry
	if connected {
		reg = qrRegistry(t, link)
	} else {
		reg = qrRegistry(t)
	}
	nodes := edge.NewGetRunHandler(reg, edge.NewRunTracker(0), edge.NewNodeCommandHandler(reg))
	h := edge.NewRunHistoryHandler(obs)
	h.Nodes, h.Record = nodes, obs
	return h, obs, link
}

const reconcileCancelled = `{"run_id":"r1","adapter":"exec","status":"cancelled","created_at":"2026-01-02T03:04:05Z",` +
	`"finished_at":"2026-01-02T03:05:00Z","background":false,"error":{"code":"cancelled","message":"edge went away"},` +
	`"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`

// A record left running, not followed live, is answered with the node's
// final state, and that state is recorded so the row is fixed for good.
func TestHistoryGetReconcilesWithNode(t *testing.T) {
	h, obs, link := reconcileSetup(t, map[string]string{"r1": reconcileCancelled}, true)
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	r, err := h.Get(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)
	if r.Status != domain.RunCancelled || !r.FinishedAt.Equal(want) || r.ErrorCode != "cancelled" || r.Key != "alice" ||
		r.Usage == nil || r.Usage.Total() != 5 {
		t.Fatalf("Get = %+v, want cancelled at %s with the node's error and usage, key kept", r, want)
	}
	obs.mu.Lock()
	recorded := append([]domain.RunRecord(nil), obs.runs...)
	obs.mu.Unlock()
	if len(recorded) != 1 || recorded[0].ID != "r1" || recorded[0].Status != domain.RunCancelled || recorded[0].Node != "n1" {
		t.Fatalf("recorded %+v, want r1 cancelled once", recorded)
	}
	if calls := link.commands(); len(calls) != 1 || calls[0] != `run_get {"run_id":"r1"}` {
		t.Fatalf("node commands = %q, want one run_get for r1", calls)
	}
}

// Without a final answer from the node (not connected, run unknown there,
// or still running there) the history's record stands and nothing is written.
func TestHistoryGetKeepsRecordWithoutNodeAnswer(t *testing.T) {
	admin := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	for _, tc := range []struct {
		name      string
		runs      map[string]string
		connected bool
		ctx       context.Context
	}{
		{"node disconnected", map[string]string{"r1": reconcileCancelled}, false, admin},
		{"node does not know the run", map[string]string{}, true, admin},
		{"node says running", map[string]string{"r1": qrRun("r1", "running", "2026-01-02T03:04:05Z")}, true, admin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, obs, link := reconcileSetup(t, tc.runs, tc.connected)
			r, err := h.Get(tc.ctx, "r1")
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != domain.RunRunning || !r.FinishedAt.IsZero() {
				t.Fatalf("Get = %+v, want the history's running record", r)
			}
			obs.mu.Lock()
			n := len(obs.runs)
			obs.mu.Unlock()
			if n != 0 {
				t.Fatalf("recorded %d runs, want none", n)
			}
			if !tc.connected && len(link.commands()) != 0 {
				t.Fatalf("asked a disconnected node: %q", link.commands())
			}
		})
	}
}

// rcHistory is a history whose ListRuns answers the running rows of a node
// and whose RecordRun reports each write on a channel.
type rcHistory struct {
	rows     []domain.RunRecord
	recorded chan domain.RunRecord
}

func (h *rcHistory) GetRun(_ context.Context, id string) (domain.RunRecord, error) {
	for _, r := range h.rows {
		if r.ID == id {
			return r, nil
		}
	}
	return domain.RunRecord{}, domain.ErrRunNotFound
}
func (h *rcHistory) ListRuns(_ context.Context, q domain.RunQuery) (domain.RunPage, error) {
	var out []domain.RunRecord
	for _, r := range h.rows {
		if (q.Node == "" || r.Node == q.Node) && (q.Status == "" || r.Status == q.Status) {
			out = append(out, r)
		}
	}
	return domain.RunPage{Runs: out}, nil
}
func (h *rcHistory) Usage(context.Context, domain.UsageQuery) ([]domain.UsageTotal, error) {
	return nil, nil
}
func (h *rcHistory) RecordRun(r domain.RunRecord)     { h.recorded <- r }
func (h *rcHistory) RecordTunnel(domain.TunnelRecord) {}

// A registering node gets its running rows repaired: the run it reports
// cancelled is recorded so, the run it still runs is left alone.
func TestReconcilerRepairsRowsOfRegisteringNode(t *testing.T) {
	ucNoLeaks(t)
	hist := &rcHistory{recorded: make(chan domain.RunRecord, 4), rows: []domain.RunRecord{
		{ID: "r1", Node: "n1", Adapter: "exec", Status: domain.RunRunning},
		{ID: "r2", Node: "n1", Adapter: "exec", Status: domain.RunRunning},
	}}
	link := &qrLink{id: "n1", runs: map[string]string{
		"r1": reconcileCancelled,
		"r2": qrRun("r2", "running", "2026-01-02T03:04:05Z"),
	}}
	reg := qrRegistry(t, link)
	h := edge.NewRunHistoryHandler(hist)
	h.Nodes, h.Record = edge.NewGetRunHandler(reg, edge.NewRunTracker(0), edge.NewNodeCommandHandler(reg)), hist
	rc := edge.NewHistoryReconciler(h)
	defer rc.Close()
	rc.NodeRegistered("n1")
	select {
	case r := <-hist.recorded:
		if r.ID != "r1" || r.Status != domain.RunCancelled {
			t.Fatalf("recorded %+v, want r1 cancelled", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the registering node's cancelled run was not recorded")
	}
	ucEventually(t, "both runs asked of the node", func() bool { return len(link.commands()) == 2 })
	rc.Close()
	select {
	case r := <-hist.recorded:
		t.Fatalf("recorded %+v, want only r1", r)
	default:
	}
}
