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
	finished map[string]string
	order    []string
	limit    int
}

// NewRunTracker keeps up to limit finished runs (default 10,000).
func NewRunTracker(limit int) *RunTracker {
	if limit <= 0 {
		limit = 10000
	}
	return &RunTracker{active: map[string]string{}, finished: map[string]string{}, limit: limit}
}

func (t *RunTracker) start(runID, node string) {
	t.mu.Lock()
	t.active[runID] = node
	t.mu.Unlock()
}

func (t *RunTracker) finish(runID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	node, ok := t.active[runID]
	if !ok {
		return
	}
	delete(t.active, runID)
	t.finished[runID] = node
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
	if n, ok := t.finished[runID]; ok {
		return n, false, true
	}
	return "", false, false
}
