package edge

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"iop/domain"
	"iop/ports"
)

// Bounds of the repair run when a node registers, and of the re-checks
// that follow it.
const (
	reconcileQueue   = 64  // follows waiting (Follow); more are dropped
	reconcileMaxRuns = 200 // running rows looked at per repair, and watched per node
	// reconcileCheckBudget bounds the questions of one check of a node.
	reconcileCheckBudget = 30 * time.Second
	// A node's watched runs are asked about again after recheckFirst, then
	// at doubling intervals up to recheckMost: a short run's end is seen
	// soon, a run of hours costs its node one run_get a minute.
	recheckFirst = 2 * time.Second
	recheckMost  = time.Minute
)

// HistoryReconciler repairs, when a node registers, that node's history
// rows (this edge's: RunQuery.Own) left running by an edge that stopped
// before their ends were
// written, or by a background run whose link broke (the edge then stops
// following it and the node goes on with it): each run whose end this edge
// process does not record itself (not in flight here, its end not seen
// here) is asked of the node, and a final status it reports is recorded.
//
// A node usually registers again while such a run still goes on, so the
// runs it reports unfinished, or leaves unanswered, are watched: asked
// about again, at growing intervals (recheckFirst up to recheckMost),
// until each has ended, the node's link changes (the node left; a node
// back on a new link is repaired afresh) or Close. While watched, a run
// the node reports going holds a slot of its adapter in the registry, as a
// run dispatched here does, so `iop nodes` and the choice of node count it.
//
// It owns one goroutine, stopped by Close; the watches are that
// goroutine's own. At start, SettleUnconfigured adds a second for one
// pass over the history, also stopped by Close.
type HistoryReconciler struct {
	history *RunHistoryHandler
	store   ports.HistoryReader
	reg     *Registry // nil when history cannot ask nodes: nothing to do
	// removed are the nodes reloads removed from the config (NodeRemoved),
	// oldest first, at most removedMax: a background run of one let go of
	// when the reload closed its link (RunLost) is ended node_removed. An id
	// leaves when a node registers under it again.
	removedMu sync.Mutex
	removed   []string
	first     time.Duration
	most      time.Duration
	// budget bounds one check of a node (check): the worker is shared by
	// every node, and one answering each question just inside its
	// reconcileTimeout would hold it 200 × 5 s.
	budget time.Duration

	queue chan reconcileJob // Follow's jobs
	// pending are the nodes whose repair is due (NodeRegistered), in
	// order, each once however often it registered meanwhile: bounded by
	// the nodes the registry admitted, so a registration storm (an edge
	// restarted under a fleet) loses none. wake tells the worker.
	pendMu  sync.Mutex
	pending []string
	queued  map[string]bool
	wake    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	goMu    sync.Mutex // no goroutine joins wg once Close has begun
	// settling is set once SettleUnconfigured has started its pass.
	settling bool
	wg       sync.WaitGroup
	once     sync.Once
	// settled is closed when SettleUnconfigured's pass has ended (tests).
	settled chan struct{}

	watches  map[string]*nodeWatch // by node id; the worker's own
	watching atomic.Int64          // runs in watches, for tests
}

// nodeWatch is one node's runs still to settle.
type nodeWatch struct {
	link ports.NodeLink // the connection the runs were seen on
	runs []*watchedRun  // in history order
	wait time.Duration  // until the next check after the coming one
	due  time.Time
}

// watchedRun is a running history row its node has not reported finished.
type watchedRun struct {
	rec     domain.RunRecord
	release func() // its slot in the registry; nil until the node says it goes on
}

// NewHistoryReconciler starts the worker; it does nothing unless history
// can ask nodes and record (its Nodes and Record are set).
func NewHistoryReconciler(history *RunHistoryHandler) *HistoryReconciler {
	return newHistoryReconciler(history, recheckFirst, recheckMost)
}

func newHistoryReconciler(history *RunHistoryHandler, first, most time.Duration) *HistoryReconciler {
	if history == nil {
		panic("edge.NewHistoryReconciler: nil history")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &HistoryReconciler{history: history, store: history.store, first: first, most: most, budget: reconcileCheckBudget,
		queue: make(chan reconcileJob, reconcileQueue), queued: map[string]bool{}, wake: make(chan struct{}, 1),
		ctx: ctx, cancel: cancel, watches: map[string]*nodeWatch{},
		settled: make(chan struct{})}
	if history.Nodes != nil && history.Record != nil {
		r.reg = history.Nodes.reg
	}
	r.wg.Add(1)
	go r.work()
	return r
}

// reconcileJob is a watch on one run of node (Follow).
type reconcileJob struct {
	node string
	run  domain.RunRecord
}

// NodeRegistered queues node for a repair without blocking. A node whose
// repair is queued already is not queued twice: the one repair lists its
// rows as they are when it runs.
func (r *HistoryReconciler) NodeRegistered(node string) {
	if r == nil || r.ctx.Err() != nil {
		return
	}
	r.forgetRemoved(node)
	r.pendMu.Lock()
	if !r.queued[node] {
		r.queued[node] = true
		r.pending = append(r.pending, node)
	}
	r.pendMu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default: // the worker has been told already
	}
}

// takePending returns the node whose repair has waited longest ("" if none)
// and whether others wait, and forgets it: registering from now on, it is
// queued again.
func (r *HistoryReconciler) takePending() (string, bool) {
	r.pendMu.Lock()
	defer r.pendMu.Unlock()
	if len(r.pending) == 0 {
		return "", false
	}
	node := r.pending[0]
	r.pending[0] = ""
	r.pending = r.pending[1:]
	if len(r.pending) == 0 {
		r.pending = nil // the array goes with the storm
	}
	delete(r.queued, node)
	return node, len(r.pending) > 0
}

// Follow watches rec, a run of a connected node this edge process does not
// follow (one its node just accepted a cancel of after an edge restart),
// as a repair watches the running rows it finds: its node is asked about it
// after the first interval, and the final record the node reports (its end
// time, error and usage) is recorded over the one the edge wrote itself. It
// does not block; with the queue full the run is not followed (the record
// stands without the node's usage).
func (r *HistoryReconciler) Follow(rec domain.RunRecord) {
	if r == nil || r.ctx.Err() != nil {
		return
	}
	select {
	case r.queue <- reconcileJob{node: rec.Node, run: rec}:
	default:
	}
}

// RunLost tells r that the edge let go of background run rec whose node
// link broke. A node already back on another link registered before the
// run's follower saw the break, so that registration's repair skipped the
// run as followed here: node is repaired again. A node the directory no
// longer holds (a reload removed it and closed its link) never registers
// again: the run is ended node_removed. Otherwise the node's next
// registration repairs it.
func (r *HistoryReconciler) RunLost(rec domain.RunRecord, link ports.NodeLink) {
	if r == nil || r.reg == nil {
		return
	}
	if r.wasRemoved(rec.Node) {
		r.endRemoved(rec, removedByReload)
		return
	}
	if n, ok := r.reg.Get(rec.Node); ok && n.Link != link {
		r.NodeRegistered(rec.Node)
	}
}

// removedMax bounds the removed nodes remembered for RunLost.
const removedMax = 1024

func (r *HistoryReconciler) wasRemoved(node string) bool {
	r.removedMu.Lock()
	defer r.removedMu.Unlock()
	return slices.Contains(r.removed, node)
}

// forgetRemoved drops node from the removed nodes: it registered again.
func (r *HistoryReconciler) forgetRemoved(node string) {
	r.removedMu.Lock()
	defer r.removedMu.Unlock()
	r.removed = slices.DeleteFunc(r.removed, func(id string) bool { return id == node })
}

// NodeRemoved ends this edge's history rows (RunQuery.Own) left running
// on node, which a reload has just removed from the directory and
// disconnected: its registration is refused from now on, so no repair
// would ever settle them, and the
// node stops its runs when refused. Each is written failed with code
// node_removed, but for a run this edge process records the end of itself
// (still followed here: one let go of when its link closed is ended by
// RunLost, one whose end passed through here keeps that end). It reads the
// rows a page (reconcileMaxRuns) at a time, until ctx ends.
func (r *HistoryReconciler) NodeRemoved(ctx context.Context, node string) {
	if r == nil || r.reg == nil {
		return
	}
	r.removedMu.Lock()
	if !slices.Contains(r.removed, node) {
		r.removed = append(r.removed, node)
		if len(r.removed) > removedMax {
			r.removed = slices.Delete(r.removed, 0, 1)
		}
	}
	r.removedMu.Unlock()
	// This edge's rows only: another edge sharing the history may have a
	// node of this id that it still holds, whose runs go on there.
	r.endRunning(ctx, domain.RunQuery{Node: node}, nil, removedByReload)
}

// SettleUnconfigured ends, as NodeRemoved does, this edge's history rows
// (RunQuery.Own) left running on nodes dir does not hold: nodes removed
// from the config while the edge was stopped. Their registration is
// refused, so no repair would ever settle those rows, and such a node
// stops its runs when refused. Called once at start, with the history
// and the config's directory there; the rows are read a page at a time on
// a goroutine r owns (Close stops it), so a slow history does not hold up
// the start. Each page is checked against dir as it is then: a node a
// reload has added back meanwhile keeps its rows for its repair. The nodes
// are not remembered as removed (RunLost): none has a run this process
// follows, and one a reload adds back is a node like any other.
func (r *HistoryReconciler) SettleUnconfigured(dir ports.NodeDirectory) {
	if r == nil || r.reg == nil || dir == nil {
		return
	}
	r.goMu.Lock()
	defer r.goMu.Unlock()
	if r.ctx.Err() != nil || r.settling {
		return // stopped, or called already
	}
	r.settling = true
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(r.settled)
		r.endRunning(r.ctx, domain.RunQuery{}, func(page []domain.RunRecord) []domain.RunRecord {
			known := map[string]bool{}
			for _, rec := range dir.Records() {
				known[rec.ID] = true
			}
			return slices.DeleteFunc(page, func(rec domain.RunRecord) bool { return rec.Node == "" || known[rec.Node] })
		}, notConfigured)
	}()
}

// endRunning ends failed, node_removed (endRemoved, with the message why),
// this edge's running rows (RunQuery.Own) that q selects, those pick keeps
// of each page (all with pick nil), but for a run this edge process
// records the end of itself. It reads the rows a page (reconcileMaxRuns)
// at a time, until ctx ends.
func (r *HistoryReconciler) endRunning(ctx context.Context, q domain.RunQuery, pick func([]domain.RunRecord) []domain.RunRecord, why string) {
	q.Status, q.Limit, q.Own = domain.RunRunning, reconcileMaxRuns, true
	for ctx.Err() == nil {
		page, err := r.store.ListRuns(ctx, q)
		if err != nil {
			return // the history is unreachable; the rows stay running
		}
		runs := page.Runs
		if pick != nil {
			runs = pick(slices.Clone(runs))
		}
		for _, rec := range runs {
			if !r.history.Nodes.runs.recordsEnd(rec.ID) {
				r.endRemoved(rec, why)
			}
		}
		if page.Next == "" || len(page.Runs) == 0 {
			return
		}
		q.Cursor = page.Next
	}
}

// The messages of endRemoved, given the node's id.
const (
	removedByReload = "node %s was removed from the edge's config while the run was going; the node stops its runs"
	notConfigured   = "node %s is not in the edge's config since the edge started (removed while the edge was stopped); the node stops its runs"
)

// endRemoved records rec failed, its node removed from the config (why,
// given the node's id, says how), and counts it if this edge process let
// go of it (as settle does).
func (r *HistoryReconciler) endRemoved(rec domain.RunRecord, why string) {
	rec.Status, rec.FinishedAt = domain.RunFailed, time.Now()
	rec.ErrorCode = domain.CodeNodeRemoved
	rec.ErrorMsg = fmt.Sprintf(why, rec.Node)
	r.history.recordEnd(rec, -1)
}

// Close stops the worker, and SettleUnconfigured's pass, and waits for
// them; the slots its watches held are released.
func (r *HistoryReconciler) Close() {
	if r == nil {
		return
	}
	r.once.Do(func() {
		r.goMu.Lock()
		r.cancel()
		r.goMu.Unlock()
		r.wg.Wait()
	})
}

func (r *HistoryReconciler) work() {
	defer r.wg.Done()
	defer func() {
		for node := range r.watches {
			r.unwatch(node)
		}
	}()
	for {
		var tick <-chan time.Time
		var timer *time.Timer
		if due, ok := r.nextDue(); ok {
			timer = time.NewTimer(time.Until(due))
			tick = timer.C
		}
		select {
		case <-r.ctx.Done():
		case j := <-r.queue:
			r.follow(j.node, j.run)
		case <-r.wake:
			// One node per pass, so that follow-ups (Follow, whose queue
			// drops when full) are taken between the repairs of a
			// registration storm, each of which may wait on its node.
			if node, more := r.takePending(); node != "" {
				r.repair(node)
				if more {
					select {
					case r.wake <- struct{}{}:
					default:
					}
				}
			}
		case <-tick:
			r.recheckDue()
		}
		if timer != nil {
			timer.Stop()
		}
		if r.ctx.Err() != nil {
			return
		}
	}
}

// nextDue is when the earliest watch is due; false if none is.
func (r *HistoryReconciler) nextDue() (time.Time, bool) {
	var first time.Time
	for _, w := range r.watches {
		if first.IsZero() || w.due.Before(first) {
			first = w.due
		}
	}
	return first, !first.IsZero()
}

// repair looks at node's running rows this edge wrote (RunQuery.Own) one
// by one (settle asks the node
// only for runs whose end this edge does not record itself) and watches
// those not settled. It replaces the node's watch: what the history says
// now is the fresher list.
func (r *HistoryReconciler) repair(node string) {
	if r.reg == nil {
		return
	}
	r.unwatch(node)
	n, ok := r.reg.Get(node)
	if !ok {
		return // it left already; its next registration repairs
	}
	// This edge's rows only: another edge sharing the history follows its
	// own runs, which may be of another node under the same id (this one
	// would answer run_not_found, and a live run there be written lost).
	page, err := r.store.ListRuns(r.ctx, domain.RunQuery{Node: node, Status: domain.RunRunning, Limit: reconcileMaxRuns, Own: true})
	if err != nil {
		return // the history is unreachable; a later read or registration repairs
	}
	w := &nodeWatch{link: n.Link, wait: r.first}
	for _, rec := range page.Runs {
		w.runs = append(w.runs, &watchedRun{rec: rec})
	}
	r.check(node, w)
}

// follow adds rec to node's watch, due after the first interval; a node
// not on the link its watch was made on is left to its repair, which
// lists the history afresh.
func (r *HistoryReconciler) follow(node string, rec domain.RunRecord) {
	if r.reg == nil {
		return
	}
	n, ok := r.reg.Get(node)
	if !ok {
		return
	}
	w, ok := r.watches[node]
	switch {
	case !ok:
		w = &nodeWatch{link: n.Link, wait: r.first, due: time.Now().Add(r.first)}
		r.watches[node] = w
	case w.link != n.Link:
		return
	}
	for _, run := range w.runs {
		if run.rec.ID == rec.ID {
			return
		}
	}
	if len(w.runs) >= reconcileMaxRuns {
		return
	}
	// Asked as running: what the history holds now is the edge's own
	// record of the cancel, which the node's answer replaces.
	rec.Status, rec.FinishedAt = domain.RunRunning, time.Time{}
	w.runs = append(w.runs, &watchedRun{rec: rec})
	r.watching.Add(1)
}

// recheckDue checks every watch that is due.
func (r *HistoryReconciler) recheckDue() {
	now := time.Now()
	var due []string
	for node, w := range r.watches {
		if !w.due.After(now) {
			due = append(due, node)
		}
	}
	for _, node := range due {
		if r.ctx.Err() != nil {
			return
		}
		w, ok := r.watches[node]
		if !ok {
			continue
		}
		if n, ok := r.reg.Get(node); !ok || n.Link != w.link {
			// The node left, so its runs' slots went with that link. One
			// back on a new link is looked at afresh (its registration
			// may not have reached the reconciler yet).
			r.unwatch(node)
			if ok {
				r.repair(node)
			}
			continue
		}
		delete(r.watches, node)
		r.watching.Add(-int64(len(w.runs)))
		r.check(node, w)
	}
}

// check asks node about each run of w, in order, and watches those still
// unsettled. A node that does not answer is not asked about the rest this
// time, so an unresponsive node costs one reconcileTimeout per check; nor
// is one whose questions have taken the check's budget, a slow node
// holding up every other's repairs, and the runs not asked go first next
// time.
func (r *HistoryReconciler) check(node string, w *nodeWatch) {
	var kept, unasked []*watchedRun
	answering := true
	end := time.Now().Add(r.budget)
	for _, run := range w.runs {
		if !answering || r.ctx.Err() != nil || !time.Now().Before(end) {
			unasked = append(unasked, run)
			continue
		}
		_, s := r.history.settle(r.ctx, run.rec)
		switch s {
		case unsettledGoing:
			if run.release == nil {
				run.release, _ = r.reg.holdRun(node, w.link, run.rec.Adapter)
			}
			kept = append(kept, run)
		case unsettledNoAnswer:
			answering = false
			kept = append(kept, run)
		case unsettledUnknownYet:
			// Not known to the node, too young to be written lost: asked
			// again until it is (a node back within a minute of losing its
			// store, a crashed container's, say), else its row would stay
			// running for good. It holds no slot: the node runs nothing.
			if run.release != nil {
				run.release()
				run.release = nil
			}
			kept = append(kept, run)
		default: // ended, recorded here, written lost, or answered for another run
			if run.release != nil {
				run.release()
			}
		}
	}
	w.runs = append(unasked, kept...)
	if len(w.runs) == 0 {
		return
	}
	w.due = time.Now().Add(w.wait)
	w.wait = min(2*w.wait, r.most)
	r.watches[node] = w
	r.watching.Add(int64(len(w.runs)))
}

// unwatch drops node's watch, releasing the slots its runs held.
func (r *HistoryReconciler) unwatch(node string) {
	w, ok := r.watches[node]
	if !ok {
		return
	}
	delete(r.watches, node)
	r.watching.Add(-int64(len(w.runs)))
	for _, run := range w.runs {
		if run.release != nil {
			run.release()
		}
	}
}
