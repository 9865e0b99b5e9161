package edge

import (
	"sync"
)

// RunTracker remembers which node each run went to, so cancel requests find
// it. Finished runs are kept in a bounded FIFO so a late cancel can still
// answer run_finished without asking the node.
type RunTracker struct {
	mu       sync.Mutex
	active   map[string]string // run id → node id
	finished map[string]endedRun
	order    []string
	limit    int
}

// endedRun is a run the edge stopped following.
type endedRun struct {
	node string
	// seen: its terminal event passed through this edge, so the observers
	// were told its final record (see recordsEnd).
	seen bool
}

// NewRunTracker keeps up to limit finished runs (default 10,000).
func NewRunTracker(limit int) *RunTracker {
	if limit <= 0 {
		limit = 10000
	}
	return &RunTracker{active: map[string]string{}, finished: map[string]endedRun{}, limit: limit}
}

func (t *RunTracker) start(runID, node string) {
	t.mu.Lock()
	t.active[runID] = node
	t.mu.Unlock()
}

// finish moves a run from active to finished; seen tells whether its
// terminal event passed through the edge (false: the edge let go of it
// before its end, which it then never recorded).
func (t *RunTracker) finish(runID string, seen bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	node, ok := t.active[runID]
	if !ok {
		return
	}
	delete(t.active, runID)
	t.finished[runID] = endedRun{node: node, seen: seen}
	t.order = append(t.order, runID)
	if len(t.order) > t.limit {
		delete(t.finished, t.order[0])
		t.order = t.order[1:]
	}
}

// forget drops an active run without counting it finished: one the edge
// no longer follows, whose end is the node's to tell.
func (t *RunTracker) forget(runID string) {
	t.mu.Lock()
	delete(t.active, runID)
	t.mu.Unlock()
}

// Lookup reports the node of a run and whether it is still in flight.
func (t *RunTracker) Lookup(runID string) (node string, active, known bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n, ok := t.active[runID]; ok {
		return n, true, true
	}
	if e, ok := t.finished[runID]; ok {
		return e.node, false, true
	}
	return "", false, false
}

// recordsEnd reports whether this edge process records runID's end itself:
// the run is in flight here, or its terminal event passed through here and
// its final record went to the observers (a history may still have it
// queued, unwritten). Such a run's history row must not be "repaired" from
// its node: that record would land after the edge's own and replace it.
func (t *RunTracker) recordsEnd(runID string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.active[runID]; ok {
		return true
	}
	return t.finished[runID].seen
}
