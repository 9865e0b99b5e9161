package edge_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
)

// rmHistory is a history that stores what is recorded and pages its
// lists (Limit, Cursor), in insertion order. Rows whose ids are in foreign
// were written by another edge sharing the history: a query of this edge's
// own rows (RunQuery.Own) leaves them out.
type rmHistory struct {
	mu       sync.Mutex
	ids      []string
	rows     map[string]domain.RunRecord
	foreign  map[string]bool
	recorded int
}

func newRMHistory(rows ...domain.RunRecord) *rmHistory {
	h := &rmHistory{rows: map[string]domain.RunRecord{}}
	for _, r := range rows {
		h.ids = append(h.ids, r.ID)
		h.rows[r.ID] = r
	}
	return h
}

func (h *rmHistory) GetRun(_ context.Context, id string) (domain.RunRecord, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.rows[id]; ok {
		return r, nil
	}
	return domain.RunRecord{}, domain.ErrRunNotFound
}

func (h *rmHistory) ListRuns(_ context.Context, q domain.RunQuery) (domain.RunPage, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	start := 0
	if q.Cursor != "" {
		n, err := strconv.Atoi(q.Cursor)
		if err != nil {
			return domain.RunPage{}, err
		}
		start = n
	}
	var page domain.RunPage
	for i := start; i < len(h.ids); i++ {
		r := h.rows[h.ids[i]]
		if (q.Node != "" && r.Node != q.Node) || (q.Status != "" && r.Status != q.Status) || (q.Own && h.foreign[r.ID]) {
			continue
		}
		if q.Limit > 0 && len(page.Runs) == q.Limit {
			page.Next = strconv.Itoa(i)
			break
		}
		page.Runs = append(page.Runs, r)
	}
	return page, nil
}

func (h *rmHistory) Usage(context.Context, domain.UsageQuery) ([]domain.UsageTotal, error) {
	return nil, nil
}

func (h *rmHistory) RecordRun(r domain.RunRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.rows[r.ID]; !ok {
		h.ids = append(h.ids, r.ID)
	}
	h.rows[r.ID] = r
	h.recorded++
}

func (h *rmHistory) RecordTunnel(domain.TunnelRecord) {}

func (h *rmHistory) get(id string) domain.RunRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rows[id]
}

// A reload that removes a node disconnects it and its registration is
// refused from then on, so no repair would ever settle its running rows:
// they are written failed, node_removed — every one, past a page of the
// history — and a cancel of one answers run_finished. A node whose entry
// only changed (its adapters), or another node's rows, are left alone, and
// so is a node renamed (its token kept under a new id): it registers
// again and goes on with its runs.
func TestReloadEndsTheRunningRowsOfARemovedNode(t *testing.T) {
	ucNoLeaks(t)
	recs := ucReloadRecords()
	dir, reg, bus, versions := &ucDir{recs: recs}, edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}
	rh := edge.NewRegisterHandler(dir, reg, bus, versions, nil)
	for _, tok := range []struct{ id, tok string }{{"a", ucTokA}, {"b", ucTokB}, {"c", ucTokC}} {
		l := &ucLink{id: tok.id}
		l.onClose = func(reason string) { rh.Disconnected(tok.id, l, reason) }
		if _, err := rh.Register(context.Background(), tok.tok, domain.NodeInfo{}, "r-"+tok.id, l); err != nil {
			t.Fatal(err)
		}
	}
	created := time.Now().Add(-time.Hour)
	var rows []domain.RunRecord
	const removedRuns = 205 // more than a page (200)
	for i := range removedRuns {
		rows = append(rows, domain.RunRecord{ID: fmt.Sprintf("ra-%03d", i), Node: "a", Adapter: "exec", Background: true, Status: domain.RunRunning, CreatedAt: created})
	}
	rows = append(rows,
		domain.RunRecord{ID: "ra-done", Node: "a", Adapter: "exec", Status: domain.RunSucceeded, CreatedAt: created, FinishedAt: created},
		domain.RunRecord{ID: "rb", Node: "b", Adapter: "exec", Background: true, Status: domain.RunRunning, CreatedAt: created},
		domain.RunRecord{ID: "rc", Node: "c", Adapter: "exec", Background: true, Status: domain.RunRunning, CreatedAt: created})
	hist := newRMHistory(rows...)
	tracker := edge.NewRunTracker(0)
	h := edge.NewRunHistoryHandler(hist)
	h.Nodes, h.Record = edge.NewGetRunHandler(reg, tracker, edge.NewNodeCommandHandler(reg)), hist
	rc := edge.NewHistoryReconciler(h)
	t.Cleanup(rc.Close)

	// a removed; b's adapters changed; c renamed to c2 (same token).
	next := ucReloadRecords()[1:]
	next[0].Adapters = []domain.AdapterConfig{ucExecAdapter("exec", 2, "upper", "lower")}
	next[1].ID = "c2"
	rl := edge.NewReloadHandler(&ucSource{recs: next}, dir, reg, bus, versions, nil)
	rl.Reconcile = rc
	res, err := rl.Handle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Disconnected, []string{"a", "c"}) {
		t.Fatalf("disconnected %v, want a and c", res.Disconnected)
	}
	for i := range removedRuns {
		r := hist.get(fmt.Sprintf("ra-%03d", i))
		if r.Status != domain.RunFailed || r.ErrorCode != domain.CodeNodeRemoved || r.FinishedAt.IsZero() || r.ErrorMsg == "" ||
			r.Key != "" || !r.CreatedAt.Equal(created) || !r.Background {
			t.Fatalf("row %s = %+v, want failed node_removed, the rest kept", r.ID, r)
		}
	}
	if r := hist.get("ra-done"); r.Status != domain.RunSucceeded || r.ErrorCode != "" {
		t.Fatalf("finished row = %+v, want it untouched", r)
	}
	for _, id := range []string{"rb", "rc"} {
		if r := hist.get(id); r.Status != domain.RunRunning || r.ErrorCode != "" {
			t.Fatalf("row %s = %+v, want still running (its node changed or renamed only)", id, r)
		}
	}
	hist.mu.Lock()
	recorded := hist.recorded
	hist.mu.Unlock()
	if recorded != removedRuns {
		t.Fatalf("recorded %d rows, want %d", recorded, removedRuns)
	}

	cancel := edge.NewCancelRunHandler(reg, tracker)
	cancel.History, cancel.Record = hist, hist
	admin := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	if _, err := cancel.Handle(admin, "ra-000"); domain.CodeOf(err) != domain.CodeRunFinished {
		t.Fatalf("cancel of a removed node's run = %v, want run_finished", err)
	}
}

// A reload that removes a node ends this edge's running rows of it only.
// Another edge sharing the history may list a node of the same id (the
// same node, with the same token) that is connected to it and runs its
// runs: they were written failed node_removed while going on there, and
// stayed so once they ended (a repair lists running rows only).
func TestReloadLeavesAnotherEdgesRowsOfTheRemovedNode(t *testing.T) {
	ucNoLeaks(t)
	recs := ucReloadRecords()
	dir, reg, bus, versions := &ucDir{recs: recs}, edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}
	created := time.Now().Add(-time.Hour)
	hist := newRMHistory(
		domain.RunRecord{ID: "ra-mine", Node: "a", Adapter: "exec", Background: true, Status: domain.RunRunning, CreatedAt: created},
		domain.RunRecord{ID: "ra-other", Node: "a", Adapter: "exec", Background: true, Status: domain.RunRunning, CreatedAt: created})
	hist.foreign = map[string]bool{"ra-other": true}
	h := repairingHistory(reg, hist)
	rc := edge.NewHistoryReconciler(h)
	t.Cleanup(rc.Close)

	rl := edge.NewReloadHandler(&ucSource{recs: ucReloadRecords()[1:]}, dir, reg, bus, versions, nil)
	rl.Reconcile = rc
	if _, err := rl.Handle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := hist.get("ra-mine"); r.Status != domain.RunFailed || r.ErrorCode != domain.CodeNodeRemoved {
		t.Fatalf("this edge's row = %+v, want failed node_removed", r)
	}
	if r := hist.get("ra-other"); r.Status != domain.RunRunning || r.ErrorCode != "" || !r.FinishedAt.IsZero() {
		t.Fatalf("another edge's row = %+v, want still running", r)
	}
}

// A background run still followed when a reload removes its node is let
// go of once the closed link's stream fails: as its node never registers
// again, that is when it is ended node_removed (and counted).
func TestRunLostByARemovedNodeIsEnded(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	obs := &ucObserver{}
	e.submit.Observe.Metrics = obs
	rh, hist, _, rc := bgRunWithHistory(t, e, false)

	dir := &ucDir{recs: []domain.NodeRecord{{ID: "a", Token: ucTokA, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 2, "upper")}}}}
	rl := edge.NewReloadHandler(&ucSource{recs: []domain.NodeRecord{}}, dir, e.reg, e.bus, &edge.ConfigVersions{}, nil)
	rl.Reconcile = rc
	if res, err := rl.Handle(context.Background()); err != nil || !slices.Equal(res.Disconnected, []string{"a"}) {
		t.Fatalf("reload = %+v, %v; want a disconnected", res, err)
	}
	select {
	case r := <-hist.recorded:
		t.Fatalf("recorded %+v while the run is still followed here", r)
	default:
	}
	e.links["a"].stream(t, rh.RunID).fail(domain.Errorf(domain.CodeNodeDisconnected, "connection closed: removed from config"))
	r := rcWaitRecorded(t, hist, "the removed node's lost run")
	if r.ID != rh.RunID || r.Status != domain.RunFailed || r.ErrorCode != domain.CodeNodeRemoved || r.FinishedAt.IsZero() {
		t.Fatalf("recorded %+v, want %s failed node_removed", r, rh.RunID)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.done) != 1 || obs.done[0].Status != domain.RunFailed {
		t.Fatalf("RunFinished %+v, want the run counted failed once", obs.done)
	}
}

// A node removed from the config while the edge was stopped is refused
// when it registers, so no repair would ever settle the rows it left
// running. At start the edge ends them failed node_removed — every one,
// past a page of the history — and leaves alone the rows of a configured
// node, the finished rows, and another edge's running row of that same
// node (RunQuery.Own).
func TestStartEndsTheRunningRowsOfAnUnconfiguredNode(t *testing.T) {
	ucNoLeaks(t)
	dir, reg := &ucDir{recs: ucReloadRecords()[1:]}, edge.NewRegistry() // b and c; a is gone
	created := time.Now().Add(-time.Hour)
	// The rows the pass must leave come first, so once it has ended the
	// last one it has decided on them all.
	rows := []domain.RunRecord{
		{ID: "rb", Node: "b", Adapter: "exec", Background: true, Status: domain.RunRunning, CreatedAt: created},
		{ID: "ra-other", Node: "a", Adapter: "exec", Background: true, Status: domain.RunRunning, CreatedAt: created},
		{ID: "ra-done", Node: "a", Adapter: "exec", Status: domain.RunSucceeded, CreatedAt: created, FinishedAt: created},
	}
	const removedRuns = 205 // more than a page (200)
	for i := range removedRuns {
		rows = append(rows, domain.RunRecord{ID: fmt.Sprintf("ra-%03d", i), Node: "a", Adapter: "exec", Background: true, Status: domain.RunRunning, CreatedAt: created})
	}
	hist := newRMHistory(rows...)
	hist.foreign = map[string]bool{"ra-other": true}
	tracker := edge.NewRunTracker(0)
	h := edge.NewRunHistoryHandler(hist)
	h.Nodes, h.Record = edge.NewGetRunHandler(reg, tracker, edge.NewNodeCommandHandler(reg)), hist
	rc := edge.NewHistoryReconciler(h)
	t.Cleanup(rc.Close)

	rc.SettleUnconfigured(dir)
	select {
	case <-edge.ReconcilerSettled(rc):
	case <-time.After(10 * time.Second):
		t.Fatal("the pass over the history did not end")
	}
	for i := range removedRuns {
		r := hist.get(fmt.Sprintf("ra-%03d", i))
		if r.Status != domain.RunFailed || r.ErrorCode != domain.CodeNodeRemoved || r.FinishedAt.IsZero() ||
			!strings.Contains(r.ErrorMsg, "not in the edge's config") || !r.CreatedAt.Equal(created) || !r.Background {
			t.Fatalf("row %s = %+v, want failed node_removed, the rest kept", r.ID, r)
		}
	}
	if r := hist.get("ra-done"); r.Status != domain.RunSucceeded || r.ErrorCode != "" {
		t.Fatalf("finished row = %+v, want it untouched", r)
	}
	for _, id := range []string{"rb", "ra-other"} {
		if r := hist.get(id); r.Status != domain.RunRunning || r.ErrorCode != "" || !r.FinishedAt.IsZero() {
			t.Fatalf("row %s = %+v, want still running (a configured node's, or another edge's)", id, r)
		}
	}
	hist.mu.Lock()
	recorded := hist.recorded
	hist.mu.Unlock()
	if recorded != removedRuns {
		t.Fatalf("recorded %d rows, want %d", recorded, removedRuns)
	}

	cancel := edge.NewCancelRunHandler(reg, tracker)
	cancel.History, cancel.Record = hist, hist
	admin := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	if _, err := cancel.Handle(admin, "ra-000"); domain.CodeOf(err) != domain.CodeRunFinished {
		t.Fatalf("cancel of an unconfigured node's run = %v, want run_finished", err)
	}
}

// gatedHistory is an rmHistory whose first list waits until the test
// releases it or its context ends: a slow history.
type gatedHistory struct {
	*rmHistory
	listing chan struct{} // closed when the first list has begun
	release chan struct{}
	once    sync.Once
}

func (h *gatedHistory) ListRuns(ctx context.Context, q domain.RunQuery) (domain.RunPage, error) {
	first := false
	h.once.Do(func() { first = true; close(h.listing) })
	if first {
		select {
		case <-h.release:
		case <-ctx.Done():
			return domain.RunPage{}, ctx.Err()
		}
	}
	return h.rmHistory.ListRuns(ctx, q)
}

// The pass at start does not hold up the start on a slow history, and
// looks at the directory as it is when a page comes: a node a reload added
// back meanwhile keeps its running rows for its repair. Close stops a pass
// still waiting on the history.
func TestStartPassLeavesANodeAddedBackAndStopsOnClose(t *testing.T) {
	ucNoLeaks(t)
	created := time.Now().Add(-time.Hour)
	newEdge := func() (*edge.HistoryReconciler, *gatedHistory, *ucDir) {
		reg := edge.NewRegistry()
		hist := &gatedHistory{rmHistory: newRMHistory(
			domain.RunRecord{ID: "ra", Node: "a", Adapter: "exec", Background: true, Status: domain.RunRunning, CreatedAt: created}),
			listing: make(chan struct{}), release: make(chan struct{})}
		return edge.NewHistoryReconciler(repairingHistory(reg, hist)), hist, &ucDir{recs: ucReloadRecords()[1:]}
	}

	rc, hist, dir := newEdge()
	rc.SettleUnconfigured(dir) // returns with the history still answering
	<-hist.listing
	dir.Replace(ucReloadRecords()) // a reload adds a back
	close(hist.release)
	select {
	case <-edge.ReconcilerSettled(rc):
	case <-time.After(10 * time.Second):
		t.Fatal("the pass over the history did not end")
	}
	rc.Close()
	if r := hist.get("ra"); r.Status != domain.RunRunning || r.ErrorCode != "" {
		t.Fatalf("row of a node added back = %+v, want still running", r)
	}

	rc, hist, dir = newEdge()
	rc.SettleUnconfigured(dir)
	<-hist.listing
	rc.Close() // the pass ends with it; ucNoLeaks checks
	if r := hist.get("ra"); r.Status != domain.RunRunning {
		t.Fatalf("row = %+v after Close, want untouched", r)
	}
}
