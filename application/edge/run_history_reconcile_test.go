package edge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/adapters/store/edgestore"
	"iop/application/edge"
	"iop/domain"
	"iop/domain/nodecmd"
	"iop/ports"
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

// Without a final answer from the node (not connected, run unknown there
// though dispatched a moment ago, or still running there) the history's
// record stands and nothing is written.
func TestHistoryGetKeepsRecordWithoutNodeAnswer(t *testing.T) {
	admin := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	for _, tc := range []struct {
		name      string
		runs      map[string]string
		connected bool
		ctx       context.Context
		fresh     bool // created just now, not in 2026-01
	}{
		{"node disconnected", map[string]string{"r1": reconcileCancelled}, false, admin, false},
		{"node does not know the run yet", map[string]string{}, true, admin, true},
		{"node says running", map[string]string{"r1": qrRun("r1", "running", "2026-01-02T03:04:05Z")}, true, admin, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, obs, link := reconcileSetup(t, tc.runs, tc.connected)
			if tc.fresh {
				rec := obs.history["r1"]
				rec.CreatedAt = time.Now()
				obs.history["r1"] = rec
			}
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

// A record left running whose node, asked a minute or more after the
// dispatch, has no record of the run (the edge stopped between recording
// the dispatch and sending it, or the node's store lost it) is settled as
// failed with run_lost. It stayed running for good: counted as running in
// the usage and never pruned.
func TestHistoryGetSettlesARunItsNodeNeverHad(t *testing.T) {
	h, obs, link := reconcileSetup(t, map[string]string{}, true)
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	r, err := h.Get(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != domain.RunFailed || r.FinishedAt.IsZero() || r.ErrorCode != domain.CodeRunLost ||
		!strings.Contains(r.ErrorMsg, "node n1 has no record of the run") || r.Key != "alice" {
		t.Fatalf("Get = %+v, want failed with run_lost, key kept", r)
	}
	obs.mu.Lock()
	recorded := append([]domain.RunRecord(nil), obs.runs...)
	obs.mu.Unlock()
	if len(recorded) != 1 || recorded[0].ID != "r1" || recorded[0].Status != domain.RunFailed || recorded[0].ErrorCode != domain.CodeRunLost {
		t.Fatalf("recorded %+v, want r1 failed run_lost once", recorded)
	}
	if calls := link.commands(); len(calls) != 1 {
		t.Fatalf("node commands = %q, want one run_get", calls)
	}
}

// rcHistory is a history whose ListRuns answers the running rows of a node
// and whose RecordRun reports each write on a channel. Rows whose ids are
// in foreign were written by another edge sharing the history: a query of
// this edge's own rows (RunQuery.Own) leaves them out.
type rcHistory struct {
	rows     []domain.RunRecord
	foreign  map[string]bool
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
		if (q.Node == "" || r.Node == q.Node) && (q.Status == "" || r.Status == q.Status) && !(q.Own && h.foreign[r.ID]) {
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
	h := repairingHistory(reg, hist)
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

// A registering node's repair looks at this edge's rows only. Another edge
// sharing the history follows its own runs, here on another node under the
// same id: asked of this edge's node, which has no record of it, the live
// run there was written failed run_lost (its row a minute old).
func TestReconcilerRepairsOnlyThisEdgesRows(t *testing.T) {
	ucNoLeaks(t)
	old := time.Now().Add(-time.Hour)
	hist := &rcHistory{recorded: make(chan domain.RunRecord, 4), foreign: map[string]bool{"r-other": true}, rows: []domain.RunRecord{
		{ID: "r-other", Node: "n1", Adapter: "exec", Background: true, Status: domain.RunRunning, CreatedAt: old},
		{ID: "r1", Node: "n1", Adapter: "exec", Status: domain.RunRunning, CreatedAt: old},
	}}
	link := &qrLink{id: "n1", runs: map[string]string{"r1": reconcileCancelled}}
	reg := qrRegistry(t, link)
	h := repairingHistory(reg, hist)
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
	rc.Close()
	select {
	case r := <-hist.recorded:
		t.Fatalf("recorded %+v, want only r1 (r-other is another edge's)", r)
	default:
	}
	if calls := link.commands(); len(calls) != 1 {
		t.Fatalf("node commands = %q, want one run_get (r1's)", calls)
	}
}

// A run read just after it ended, while the edge's final record of it is
// still queued in the history (the row says running), is not "repaired"
// from its node: that record would be queued after the edge's own and
// replace it — the model only the edge saw, the edge's finish time. The
// store here is the real one, with a flush interval long enough to hold
// the final record across the read.
func TestHistoryGetJustAfterTheEndKeepsTheEdgesRecord(t *testing.T) {
	ucNoLeaks(t)
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	path := filepath.Join(t.TempDir(), "edge.db")
	db, err := edgestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	store := edgestore.New(db, edgestore.Options{FlushInterval: time.Second, Retention: -1})
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = store.Close()
		}
	})
	e := newUCEdge(t, ucNodeSpec{"n1", []string{"exec"}})
	e.submit.Observe = edge.Observers{History: store}
	h := edge.NewRunHistoryHandler(store)
	h.Nodes, h.Record = edge.NewGetRunHandler(e.reg, e.runs, edge.NewNodeCommandHandler(e.reg)), store

	rh, err := e.submit.Handle(ctx, edge.SubmitRun{Node: "n1", Adapter: "exec", Target: "t"})
	if err != nil {
		t.Fatal(err)
	}
	// The node's store has the run finished, without the model (it never
	// has one) and at its own time.
	link := e.links["n1"]
	link.mu.Lock()
	link.commands = map[string][]ports.CommandReply{nodecmd.CmdRunGet: {{Final: true, Result: []byte(`{"run_id":"` + rh.RunID +
		`","adapter":"exec","status":"succeeded","created_at":"2026-01-02T03:04:05Z","finished_at":"2026-01-02T03:05:00Z",` +
		`"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)}}}
	link.mu.Unlock()
	ucEventually(t, "the running row written", func() bool {
		r, err := store.GetRun(ctx, rh.RunID)
		return err == nil && r.Status == domain.RunRunning
	})
	link.stream(t, rh.RunID).push(domain.RunEvent{Seq: 2, Type: domain.EventComplete,
		Usage: &domain.Usage{PromptTokens: 1, CompletionTokens: 2, Model: "m1"}})
	for {
		ev, err := ucNext(t, rh)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type.Terminal() {
			break
		}
	}
	ended := time.Now()
	if _, err := h.Get(ctx, rh.RunID); err != nil {
		t.Fatal(err)
	}
	if _, _, _, calls, _, _ := link.snapshot(); len(calls) != 0 {
		t.Fatalf("the node was asked %q about a run whose end the edge recorded", calls)
	}
	// Close writes what is queued; the row is then read back as stored.
	closed = true
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = edgestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	again := edgestore.New(db, edgestore.Options{Retention: -1})
	defer again.Close()
	r, err := again.GetRun(ctx, rh.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != domain.RunSucceeded || r.Usage == nil || r.Usage.Model != "m1" || r.FinishedAt.Sub(ended).Abs() > time.Minute {
		t.Fatalf("stored %+v usage %+v; want succeeded with model m1, finished at the edge's time (%s)", r, r.Usage, ended)
	}
}

// A run the edge let go of before its end (the caller left and the node
// did not end it within the drain timeout) had no final record written:
// a read of it still asks the node.
func TestHistoryGetReconcilesARunLetGoBeforeItsEnd(t *testing.T) {
	ucNoLeaks(t)
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	e := newUCEdge(t, ucNodeSpec{"n1", []string{"exec"}})
	e.submit.DrainTimeout = 20 * time.Millisecond
	rh, err := e.submit.Handle(ctx, edge.SubmitRun{Node: "n1", Adapter: "exec", Target: "t"})
	if err != nil {
		t.Fatal(err)
	}
	rh.Close() // cancels on the node, which never answers with an end
	ucEventually(t, "the run let go", func() bool {
		_, active, known := e.runs.Lookup(rh.RunID)
		return known && !active
	})
	link := e.links["n1"]
	link.mu.Lock()
	link.commands = map[string][]ports.CommandReply{nodecmd.CmdRunGet: {{Final: true, Result: []byte(`{"run_id":"` + rh.RunID +
		`","adapter":"exec","status":"cancelled","created_at":"2026-01-02T03:04:05Z","finished_at":"2026-01-02T03:05:00Z"}`)}}}
	link.mu.Unlock()
	obs := &ucObserver{history: map[string]domain.RunRecord{
		rh.RunID: {ID: rh.RunID, Node: "n1", Adapter: "exec", Key: "admin", Status: domain.RunRunning, CreatedAt: time.Now()},
	}}
	h := edge.NewRunHistoryHandler(obs)
	h.Nodes, h.Record = edge.NewGetRunHandler(e.reg, e.runs, edge.NewNodeCommandHandler(e.reg)), obs
	r, err := h.Get(ctx, rh.RunID)
	if err != nil || r.Status != domain.RunCancelled {
		t.Fatalf("Get = %+v, %v; want the node's cancelled", r, err)
	}
}

// rcLink is a node whose store the test changes as the node's runs go on:
// run_get answers a run's current JSON, or run_not_found. Its other
// methods are qrLink's (inert).
type rcLink struct {
	*qrLink
	mu    sync.Mutex
	runs  map[string]string
	asked int
}

func newRCLink(id string, runs map[string]string) *rcLink {
	return &rcLink{qrLink: &qrLink{id: id}, runs: runs}
}

func (l *rcLink) Command(_ context.Context, name string, args []byte) (ports.CommandStream, error) {
	var a nodecmd.RunGetArgs
	if name != nodecmd.CmdRunGet || json.Unmarshal(args, &a) != nil {
		return &qrStream{reply: ports.CommandReply{Final: true, Err: domain.Errorf(domain.CodeUnknownCommand, "unknown command %q", name)}}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked++
	r, ok := l.runs[a.RunID]
	if !ok {
		return &qrStream{reply: ports.CommandReply{Final: true, Err: domain.Errorf(domain.CodeRunNotFound, "run %s is not known on this node", a.RunID)}}, nil
	}
	return &qrStream{reply: ports.CommandReply{Final: true, Result: []byte(r)}}, nil
}

func (l *rcLink) set(id, run string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs[id] = run
}

func (l *rcLink) askedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.asked
}

const rcSucceeded = `{"run_id":"r1","adapter":"exec","status":"succeeded","created_at":"2026-01-02T03:04:05Z",` +
	`"finished_at":"2026-01-02T03:04:15Z","background":true}`

// rcSetup is an edge whose history holds run r1 as running on node n1,
// connected on link, and a reconciler re-checking every few milliseconds.
func rcSetup(t *testing.T, link *rcLink) (*edge.HistoryReconciler, *rcHistory, *edge.Registry) {
	t.Helper()
	hist := &rcHistory{recorded: make(chan domain.RunRecord, 4), rows: []domain.RunRecord{
		{ID: "r1", Node: "n1", Adapter: "exec", Status: domain.RunRunning, Background: true},
	}}
	reg := edge.NewRegistry()
	rcAdmit(t, reg, link)
	h := repairingHistory(reg, hist)
	rc := edge.NewHistoryReconcilerEvery(h, time.Millisecond, 5*time.Millisecond)
	t.Cleanup(rc.Close)
	return rc, hist, reg
}

func rcAdmit(t *testing.T, reg *edge.Registry, link *rcLink) {
	t.Helper()
	cfg := domain.NodeConfig{NodeID: link.id, Adapters: []domain.AdapterConfig{{Name: "exec", Type: "exec", MaxConcurrency: 2}}}
	if err := reg.Admit(&edge.LiveNode{ID: link.id, Link: link, Config: cfg}); err != nil {
		t.Fatal(err)
	}
}

func rcInFlight(reg *edge.Registry, node string) int {
	n, ok := reg.Get(node)
	if !ok {
		return -1
	}
	return n.RunsInFlight
}

func rcWaitRecorded(t *testing.T, hist *rcHistory, what string) domain.RunRecord {
	t.Helper()
	select {
	case r := <-hist.recorded:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("%s was not recorded", what)
		return domain.RunRecord{}
	}
}

// A node usually registers again while a background run that outlived its
// link still goes on: the repair then finds it running. The run is asked
// about again until the node reports its end, which is recorded, so the
// history row does not stay running. Meanwhile it holds a slot of its
// adapter, as the node counts it.
func TestReconcilerWatchesARunStillGoingUntilItEnds(t *testing.T) {
	ucNoLeaks(t)
	link := newRCLink("n1", map[string]string{"r1": qrRun("r1", "running", "2026-01-02T03:04:05Z")})
	rc, hist, reg := rcSetup(t, link)
	rc.NodeRegistered("n1")
	ucEventually(t, "r1 asked about again, its slot held", func() bool {
		return link.askedCount() >= 3 && rcInFlight(reg, "n1") == 1 && edge.ReconcilerWatching(rc) == 1
	})
	select {
	case r := <-hist.recorded:
		t.Fatalf("recorded %+v while the node says it runs", r)
	default:
	}
	link.set("r1", rcSucceeded)
	if r := rcWaitRecorded(t, hist, "r1's end"); r.ID != "r1" || r.Status != domain.RunSucceeded || r.FinishedAt.IsZero() {
		t.Fatalf("recorded %+v, want r1 succeeded", r)
	}
	ucEventually(t, "r1 no longer watched, its slot free", func() bool {
		return edge.ReconcilerWatching(rc) == 0 && rcInFlight(reg, "n1") == 0
	})
	asked := link.askedCount()
	rc.Close()
	if got := link.askedCount(); got != asked {
		t.Fatalf("asked %d times after Close, want no more", got-asked)
	}
}

// The watch ends with the node's link: a node that leaves takes its slots
// with it and is asked nothing more; one back on a new link — whose
// registration the reconciler did not hear of (a full queue) — is looked
// at afresh on that link.
func TestReconcilerWatchFollowsTheNodesLink(t *testing.T) {
	ucNoLeaks(t)
	old := newRCLink("n1", map[string]string{"r1": qrRun("r1", "running", "2026-01-02T03:04:05Z")})
	rc, hist, reg := rcSetup(t, old)
	rc.NodeRegistered("n1")
	ucEventually(t, "r1 watched", func() bool { return edge.ReconcilerWatching(rc) == 1 && rcInFlight(reg, "n1") == 1 })
	if !reg.Remove("n1", old) {
		t.Fatal("n1 was not on its link")
	}
	ucEventually(t, "the watch of a node that left dropped", func() bool { return edge.ReconcilerWatching(rc) == 0 })

	back := newRCLink("n1", map[string]string{"r1": qrRun("r1", "running", "2026-01-02T03:04:05Z")})
	rcAdmit(t, reg, back)
	rc.NodeRegistered("n1") // r1 goes on: watched again, on the new link
	ucEventually(t, "r1 watched on the new link", func() bool { return edge.ReconcilerWatching(rc) == 1 && rcInFlight(reg, "n1") == 1 })
	again := newRCLink("n1", map[string]string{"r1": rcSucceeded})
	// Gone and back between two checks, its registration not heard of.
	edge.SwapLink(reg, &edge.LiveNode{ID: "n1", Link: again, Config: domain.NodeConfig{NodeID: "n1",
		Adapters: []domain.AdapterConfig{{Name: "exec", Type: "exec", MaxConcurrency: 2}}}})
	if r := rcWaitRecorded(t, hist, "r1's end, asked on the newest link"); r.ID != "r1" || r.Status != domain.RunSucceeded {
		t.Fatalf("recorded %+v, want r1 succeeded", r)
	}
	if again.askedCount() == 0 {
		t.Fatal("the node's newest link was never asked")
	}
	ucEventually(t, "nothing watched", func() bool { return edge.ReconcilerWatching(rc) == 0 && rcInFlight(reg, "n1") == 0 })
}

// A node may register again before the edge's follower of its background
// run sees the old link break: that registration's repair skips the run,
// still followed here. Letting go of it then has the node repaired again.
func TestRunLostAfterTheNodeIsBackIsReconciled(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	rh, hist, _, _ := bgRunWithHistory(t, e, true)

	old := e.links["a"]
	if !e.reg.Remove("a", old) {
		t.Fatal("a was not on its link")
	}
	back := newRCLink("a", map[string]string{rh.RunID: strings.ReplaceAll(rcSucceeded, `"r1"`, `"`+rh.RunID+`"`)})
	rcAdmit(t, e.reg, back)
	old.stream(t, rh.RunID).fail(domain.Errorf(domain.CodeNodeDisconnected, "connection lost: heartbeat timeout"))
	if r := rcWaitRecorded(t, hist, "the lost run's end"); r.ID != rh.RunID || r.Status != domain.RunSucceeded {
		t.Fatalf("recorded %+v, want %s succeeded", r, rh.RunID)
	}
}

// A run cancelled through the history after an edge restart is recorded
// cancelled at once, and, once its node reports it stopped, recorded again
// with what the node stored: its end time, error and usage (which the
// edge's own record of the cancel cannot have). Until then it holds its
// adapter's slot, as the node still counts it.
func TestCancelAfterRestartRecordsTheNodesUsage(t *testing.T) {
	ucNoLeaks(t)
	link := newRCLink("n1", map[string]string{"r1": qrRun("r1", "running", "2026-01-02T03:04:05Z")})
	rc, hist, reg := rcSetup(t, link)
	h := edge.NewCancelRunHandler(reg, edge.NewRunTracker(0))
	h.History, h.Record, h.Reconcile = hist, hist, rc
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	if node, err := h.Handle(ctx, "r1"); err != nil || node != "n1" {
		t.Fatalf("cancel = %q, %v", node, err)
	}
	if r := rcWaitRecorded(t, hist, "the cancel"); r.ID != "r1" || r.Status != domain.RunCancelled || r.Usage != nil {
		t.Fatalf("recorded %+v, want r1 cancelled at once", r)
	}
	ucEventually(t, "r1 asked about while it stops, its slot held", func() bool {
		return link.askedCount() >= 2 && rcInFlight(reg, "n1") == 1 && edge.ReconcilerWatching(rc) == 1
	})
	link.set("r1", reconcileCancelled)
	r := rcWaitRecorded(t, hist, "the node's record of the cancelled run")
	if r.ID != "r1" || r.Status != domain.RunCancelled || r.Usage == nil || r.Usage.Total() != 5 ||
		!r.FinishedAt.Equal(time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)) || r.ErrorMsg != "edge went away" {
		t.Fatalf("recorded %+v, want r1 cancelled with the node's usage and end", r)
	}
	ucEventually(t, "r1 no longer watched, its slot free", func() bool {
		return edge.ReconcilerWatching(rc) == 0 && rcInFlight(reg, "n1") == 0
	})
}

// What a node reports of a run it finished is recorded with usage below
// zero as 0 (summed per key, it would lower /v1/usage's totals), and an
// error code that is no code as provider_error.
func TestHistoryReconcileClampsWhatTheNodeReports(t *testing.T) {
	bad := `{"run_id":"r1","adapter":"exec","status":"failed","created_at":"2026-01-02T03:04:05Z",` +
		`"finished_at":"2026-01-02T03:05:00Z","background":false,"error":{"code":"Made Up!","message":"boom"},` +
		`"usage":{"prompt_tokens":-2000000,"completion_tokens":3,"total_tokens":-1999997,"cost_usd":-5}}`
	h, _, _ := reconcileSetup(t, map[string]string{"r1": bad}, true)
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	r, err := h.Get(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if u := r.Usage; u == nil || u.PromptTokens != 0 || u.CompletionTokens != 3 || u.TotalTokens != 0 || u.CostUSD != 0 {
		t.Fatalf("usage %+v, want negatives as 0", r.Usage)
	}
	if r.ErrorCode != domain.CodeProviderError || !strings.Contains(r.ErrorMsg, "Made Up!") || !strings.HasSuffix(r.ErrorMsg, "boom") {
		t.Fatalf("error %q %q, want provider_error quoting the node's code", r.ErrorCode, r.ErrorMsg)
	}
}

// A background run let go of when its link broke is counted in the
// metrics once its end is learned from its node — with the node's usage —
// and only once, however many reads and checks settle its row.
func TestLostRunIsCountedOnceItsEndIsLearned(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	obs := &ucObserver{}
	e.submit.Observe.Metrics = obs
	rh, hist, h, _ := bgRunWithHistory(t, e, true)

	old := e.links["a"]
	if !e.reg.Remove("a", old) {
		t.Fatal("a was not on its link")
	}
	ended := strings.ReplaceAll(rcSucceeded, `"r1"`, `"`+rh.RunID+`"`)
	ended = strings.Replace(ended, `"background":true`, `"background":true,"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}`, 1)
	back := newRCLink("a", map[string]string{rh.RunID: ended})
	rcAdmit(t, e.reg, back)
	old.stream(t, rh.RunID).fail(domain.Errorf(domain.CodeNodeDisconnected, "connection lost: heartbeat timeout"))
	if r := rcWaitRecorded(t, hist, "the lost run's end"); r.ID != rh.RunID || r.Status != domain.RunSucceeded {
		t.Fatalf("recorded %+v, want %s succeeded", r, rh.RunID)
	}
	// The history still says running (this fake never stores): reads
	// settle the row again, and again the node answers succeeded.
	for range 3 {
		if r, err := h.Get(context.Background(), rh.RunID); err != nil || r.Status != domain.RunSucceeded {
			t.Fatalf("Get = %+v, %v", r, err)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.done) != 1 {
		t.Fatalf("RunFinished %d times (%+v), want once", len(obs.done), obs.done)
	}
	if d := obs.done[0]; d.Node != "a" || d.Adapter != "exec" || d.Status != domain.RunSucceeded || d.Usage == nil || d.Usage.PromptTokens != 7 || d.Usage.CompletionTokens != 3 {
		t.Fatalf("RunFinished %+v usage %+v, want a/exec succeeded with 7+3 tokens", d, d.Usage)
	}
}

// A lost run's duration, learned from its node, was the node's end (on
// the node's clock) less the edge's dispatch (on the edge's): a node an
// hour ahead added an hour to iop_run_duration_seconds_sum for good, one
// behind counted 0. It is the node's own span (finished_at less
// created_at, both its clock), and never more than the edge has known of
// the run.
func TestLostRunDurationIsTheNodesSpanNotAClockDifference(t *testing.T) {
	for _, c := range []struct {
		name  string
		shift time.Duration // the node's clock less the edge's
	}{{"node ahead", time.Hour}, {"node behind", -time.Hour}, {"node two centuries ahead", 24 * 365 * 200 * time.Hour}} {
		t.Run(c.name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
			obs := &ucObserver{}
			e.submit.Observe.Metrics = obs
			before := time.Now()
			rh, hist, _, _ := bgRunWithHistory(t, e, true)

			old := e.links["a"]
			if !e.reg.Remove("a", old) {
				t.Fatal("a was not on its link")
			}
			created := before.Add(c.shift).UTC()
			ended := fmt.Sprintf(`{"run_id":%q,"adapter":"exec","status":"succeeded","created_at":%q,"finished_at":%q,"background":true}`,
				rh.RunID, created.Format(time.RFC3339Nano), created.Add(time.Millisecond).Format(time.RFC3339Nano))
			back := newRCLink("a", map[string]string{rh.RunID: ended})
			rcAdmit(t, e.reg, back)
			old.stream(t, rh.RunID).fail(domain.Errorf(domain.CodeNodeDisconnected, "connection lost: heartbeat timeout"))
			if r := rcWaitRecorded(t, hist, "the lost run's end"); r.ID != rh.RunID || r.Status != domain.RunSucceeded {
				t.Fatalf("recorded %+v, want %s succeeded", r, rh.RunID)
			}
			known := time.Since(before)
			obs.mu.Lock()
			defer obs.mu.Unlock()
			if len(obs.done) != 1 {
				t.Fatalf("RunFinished %d times (%+v), want once", len(obs.done), obs.done)
			}
			if d := obs.done[0].Duration; d <= 0 || d > known || d > time.Millisecond {
				t.Fatalf("duration %v, want the node's span (1ms) within the %v the edge knew of the run", d, known)
			}
		})
	}
}

// bgRunWithHistory submits a background exec run on e's node "a" and wires
// a history holding its running row, a history handler asking e's nodes,
// and a reconciler (checking every millisecond when fast) that the
// submit handler hands the run to when it lets go of it. Observers must
// be set on e.submit before: the run takes them when it is dispatched.
func bgRunWithHistory(t *testing.T, e *ucEdge, fast bool) (*edge.RunHandle, *rcHistory, *edge.RunHistoryHandler, *edge.HistoryReconciler) {
	t.Helper()
	rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "exec", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	hist := &rcHistory{recorded: make(chan domain.RunRecord, 8), rows: []domain.RunRecord{
		{ID: rh.RunID, Node: "a", Adapter: "exec", Status: domain.RunRunning, Background: true},
	}}
	h := edge.NewRunHistoryHandler(hist)
	h.Nodes, h.Record = edge.NewGetRunHandler(e.reg, e.runs, edge.NewNodeCommandHandler(e.reg)), hist
	var rc *edge.HistoryReconciler
	if fast {
		rc = edge.NewHistoryReconcilerEvery(h, time.Millisecond, 5*time.Millisecond)
	} else {
		rc = edge.NewHistoryReconciler(h)
	}
	t.Cleanup(rc.Close)
	e.submit.Reconcile = rc
	return rh, hist, h, rc
}

// repairingHistory is a history handler over hist that repairs records
// through reg's nodes and writes the repairs to hist, as the edge wires it.
func repairingHistory(reg *edge.Registry, hist interface {
	ports.HistoryReader
	ports.RunHistory
}) *edge.RunHistoryHandler {
	h := edge.NewRunHistoryHandler(hist)
	h.Nodes, h.Record = edge.NewGetRunHandler(reg, edge.NewRunTracker(0), edge.NewNodeCommandHandler(reg)), hist
	return h
}

// A node back within a minute of losing its store (a crashed container's
// disk, say) no longer knows the background run its history row says is
// running. Too young then to be written lost, the run was dropped from the
// repair's watch, and its row stayed running for good while the node
// stayed connected (listed and counted as running by /v1/runs and
// /v1/usage). It is asked about again until it is old enough, and then
// written failed run_lost, holding no slot meanwhile.
func TestReconcilerWritesLostARunItsNodeForgotWithinAMinute(t *testing.T) {
	ucNoLeaks(t)
	created := time.Now().Add(-edge.LostAfter + 2*time.Second)
	hist := &rcHistory{recorded: make(chan domain.RunRecord, 4), rows: []domain.RunRecord{
		{ID: "r1", Node: "n1", Adapter: "exec", Status: domain.RunRunning, Background: true, CreatedAt: created},
	}}
	link := newRCLink("n1", map[string]string{})
	reg := edge.NewRegistry()
	rcAdmit(t, reg, link)
	rc := edge.NewHistoryReconcilerEvery(repairingHistory(reg, hist), 10*time.Millisecond, 100*time.Millisecond)
	t.Cleanup(rc.Close)
	rc.NodeRegistered("n1")
	r := rcWaitRecorded(t, hist, "the run its node forgot")
	if r.ID != "r1" || r.Status != domain.RunFailed || r.ErrorCode != domain.CodeRunLost || r.FinishedAt.IsZero() {
		t.Fatalf("recorded %+v, want r1 failed run_lost", r)
	}
	if n := link.askedCount(); n < 2 {
		t.Fatalf("node asked %d times, want the young run asked again", n)
	}
	ucEventually(t, "r1 no longer watched", func() bool { return edge.ReconcilerWatching(rc) == 0 })
	if n := rcInFlight(reg, "n1"); n != 0 {
		t.Fatalf("runs in flight on n1 = %d, want 0 (the node runs nothing)", n)
	}
}

// heldHistory is rcHistory whose first ListRuns waits until gate is
// closed: a history busy (or slow) while many nodes register at once.
type heldHistory struct {
	*rcHistory
	gate    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (h *heldHistory) ListRuns(ctx context.Context, q domain.RunQuery) (domain.RunPage, error) {
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.entered)
		<-h.gate
	}
	return h.rcHistory.ListRuns(ctx, q)
}

// An edge restarted under a fleet gets its nodes' registrations all at
// once. Each registration's repair was queued on a channel of 64 and
// dropped when it was full, so beyond 64 nodes registering while a repair
// was under way, a node's running rows were never asked about while it
// stayed connected: its background runs that ended while the edge was
// away stayed running in the history for good. Every registering node is
// repaired, however many come at once.
func TestReconcilerRepairsEveryNodeOfARegistrationStorm(t *testing.T) {
	ucNoLeaks(t)
	const nodes = 150
	hist := &heldHistory{rcHistory: &rcHistory{recorded: make(chan domain.RunRecord, nodes)},
		gate: make(chan struct{}), entered: make(chan struct{})}
	reg := edge.NewRegistry()
	for i := range nodes {
		id, run := fmt.Sprintf("n%d", i), fmt.Sprintf("r%d", i)
		hist.rows = append(hist.rows, domain.RunRecord{ID: run, Node: id, Adapter: "exec", Status: domain.RunRunning, Background: true})
		rcAdmit(t, reg, newRCLink(id, map[string]string{run: strings.ReplaceAll(rcSucceeded, `"r1"`, `"`+run+`"`)}))
	}
	rc := edge.NewHistoryReconciler(repairingHistory(reg, hist))
	t.Cleanup(rc.Close)
	rc.NodeRegistered("n0")
	<-hist.entered // the first repair is under way, held by the history
	for i := 1; i < nodes; i++ {
		rc.NodeRegistered(fmt.Sprintf("n%d", i))
	}
	close(hist.gate)
	seen := map[string]bool{}
	for len(seen) < nodes {
		select {
		case r := <-hist.recorded:
			if r.Status != domain.RunSucceeded {
				t.Fatalf("recorded %+v, want succeeded", r)
			}
			seen[r.ID] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d registering nodes' runs repaired", len(seen), nodes)
		}
	}
}

// slowRCLink answers each question after delay, telling order who was asked.
type slowRCLink struct {
	*rcLink
	delay time.Duration
	order chan<- string
}

func (l *slowRCLink) Command(ctx context.Context, name string, args []byte) (ports.CommandStream, error) {
	l.order <- l.id
	time.Sleep(l.delay)
	return l.rcLink.Command(ctx, name, args)
}

// The repair worker is shared by every node: one answering each question
// just inside its timeout held it for as many questions as it has running
// rows (200 × 5 s), and every other node's repair waited. A check now stops
// asking once it has spent its budget, and the runs it did not ask about
// go first the next time.
func TestReconcilerCheckOfASlowNodeHasABudget(t *testing.T) {
	ucNoLeaks(t)
	order := make(chan string, 64)
	hist := &rcHistory{recorded: make(chan domain.RunRecord, 8)}
	runs := map[string]string{}
	for i := range 5 {
		id := fmt.Sprintf("s%d", i)
		hist.rows = append(hist.rows, domain.RunRecord{ID: id, Node: "slow", Adapter: "exec", Status: domain.RunRunning, Background: true})
		runs[id] = `{"run_id":"` + id + `","adapter":"exec","status":"running","created_at":"2026-01-02T03:04:05Z","background":true}`
	}
	hist.rows = append(hist.rows, domain.RunRecord{ID: "g1", Node: "good", Adapter: "exec", Status: domain.RunRunning, Background: true})
	reg := edge.NewRegistry()
	slow := &slowRCLink{rcLink: newRCLink("slow", runs), delay: 40 * time.Millisecond, order: order}
	cfg := domain.NodeConfig{NodeID: "slow", Adapters: []domain.AdapterConfig{{Name: "exec", Type: "exec", MaxConcurrency: 8}}}
	if err := reg.Admit(&edge.LiveNode{ID: "slow", Link: slow, Config: cfg}); err != nil {
		t.Fatal(err)
	}
	good := &slowRCLink{rcLink: newRCLink("good", map[string]string{"g1": strings.ReplaceAll(rcSucceeded, `"r1"`, `"g1"`)}), order: order}
	cfg.NodeID = "good"
	if err := reg.Admit(&edge.LiveNode{ID: "good", Link: good, Config: cfg}); err != nil {
		t.Fatal(err)
	}
	rc := edge.NewHistoryReconcilerEvery(repairingHistory(reg, hist), time.Hour, time.Hour)
	t.Cleanup(rc.Close)
	edge.SetReconcilerBudget(rc, 50*time.Millisecond) // at most two of the slow node's 40 ms answers
	rc.NodeRegistered("slow")
	if got := <-order; got != "slow" {
		t.Fatalf("first question to %s", got)
	}
	rc.NodeRegistered("good")
	slowAsked := 1
	for got := range order {
		if got == "good" {
			break
		}
		slowAsked++
	}
	if slowAsked > 2 {
		t.Fatalf("the slow node was asked %d questions before the other node's repair, want at most 2 (its budget)", slowAsked)
	}
	if r := <-hist.recorded; r.ID != "g1" || r.Status != domain.RunSucceeded {
		t.Fatalf("recorded %+v, want g1 succeeded", r)
	}
}
