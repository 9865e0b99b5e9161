package edge

import (
	"time"

	"iop/ports"
)

// OrphanAdd remembers run on node as a lost background run that went out
// on link would (tests).
func OrphanAdd(o *OrphanCancels, node, run string, link ports.NodeLink) { o.add(node, run, link, "") }

// NewHistoryReconcilerEvery is NewHistoryReconciler asking about watched
// runs again first after first, then at doubling intervals up to most
// (tests, which cannot wait for the real intervals).
func NewHistoryReconcilerEvery(h *RunHistoryHandler, first, most time.Duration) *HistoryReconciler {
	return newHistoryReconciler(h, first, most)
}

// SetReconcilerBudget sets how long one check of a node may ask (tests);
// call it before any node is registered with r.
func SetReconcilerBudget(r *HistoryReconciler, d time.Duration) { r.budget = d }

// ReconcilerWatching is how many runs r watches (tests).
func ReconcilerWatching(r *HistoryReconciler) int { return int(r.watching.Load()) }

// OrphanCount is how many lost runs o remembers (tests).
func OrphanCount(o *OrphanCancels) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.total
}

// SwapLink puts n in place of the node of its id in one step: the node
// left and came back on n's link between two of a reconciler's checks, its
// registration not heard of (tests: Remove then Admit leaves a moment in
// which a check finds the node gone and drops its watch).
func SwapLink(r *Registry, n *LiveNode) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n.runs = map[string]int{}
	r.nodes[n.ID] = n
}

// SessionOwner is the key session of adapter belongs to in r ("" if none).
func SessionOwner(r *Registry, adapter, session string) string {
	owner, _ := r.sessionOwner(adapter, session)
	return owner
}

// SessionKnown reports whether r remembers session of adapter at all
// (bound to a node, or ended).
func SessionKnown(r *Registry, adapter, session string) bool {
	_, known := r.sessionOwner(adapter, session)
	return known
}

// ReconcilerSettled is closed once r's SettleUnconfigured pass has ended
// (tests).
func ReconcilerSettled(r *HistoryReconciler) <-chan struct{} { return r.settled }

// SessionWaiters reports how many runs of session wait for an earlier
// run's placement (placeSession).
func SessionWaiters(r *Registry, adapter, session string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pl := r.placing[sessionKey{adapter, session}]; pl != nil {
		return pl.waiting
	}
	return 0
}

// LostAfter is how old a running record must be before its node's
// run_not_found settles it as lost (tests).
const LostAfter = lostAfter
