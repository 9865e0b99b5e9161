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
	// lost are the background runs let go of when their node link broke
	// (lose), each with its observation, until the history learns their
	// end from the node and they are counted (claimLost); at most limit,
	// the oldest forgotten first.
	lost      map[string]*runObservation
	lostOrder []string
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
	return &RunTracker{active: map[string]string{}, finished: map[string]endedRun{}, lost: map[string]*runObservation{}, limit: limit}
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

// lose drops an active run without counting it finished (one the edge no
// longer follows, whose end is the node's to tell), keeping its
// observation until that end is learned from its node (claimLost).
func (t *RunTracker) lose(runID string, ob *runObservation) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.active, runID)
	if ob == nil {
		return
	}
	if _, ok := t.lost[runID]; !ok {
		t.lostOrder = append(t.lostOrder, runID)
	}
	t.lost[runID] = ob
	for len(t.lostOrder) > t.limit {
		delete(t.lost, t.lostOrder[0])
		t.lostOrder = t.lostOrder[1:]
	}
	if len(t.lostOrder) > 2*len(t.lost)+64 {
		// Claimed runs leave their ids in lostOrder: drop them now and
		// then, so it stays in proportion.
		kept := t.lostOrder[:0]
		for _, id := range t.lostOrder {
			if _, ok := t.lost[id]; ok {
				kept = append(kept, id)
			}
		}
		clear(t.lostOrder[len(kept):])
		t.lostOrder = kept
	}
}

// claimLost returns the observation of runID if it is a lost run (lose)
// not claimed yet, and forgets it: its end is counted once, by the one
// caller that gets it.
func (t *RunTracker) claimLost(runID string) *runObservation {
	t.mu.Lock()
	defer t.mu.Unlock()
	ob := t.lost[runID]
	delete(t.lost, runID)
	return ob
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
