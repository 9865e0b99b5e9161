package edge

import (
	"context"
	"errors"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

// CancelRunHandler cancels a run on the node that runs it.
type CancelRunHandler struct {
	reg     *Registry
	runs    *RunTracker
	timeout time.Duration

	// History, if set, tells where a run this edge process did not
	// dispatch runs (for example one started before an edge restart).
	History ports.HistoryReader
	// Record, if set, is told that such a run was cancelled: no stream of
	// this edge process will see its end.
	Record ports.RunHistory
	// Reconcile, if set, follows such a run after its cancel so that the
	// record gets the end, error and usage its node stored.
	Reconcile *HistoryReconciler
	// Edge is this edge's store.edge_id, if its history has one: a run
	// recorded under another id whose node is not connected here was
	// dispatched by another edge sharing the history (or this edge under
	// an earlier id), and the cancel's error says which.
	Edge string
}

// NewCancelRunHandler refuses nil dependencies.
func NewCancelRunHandler(reg *Registry, runs *RunTracker) *CancelRunHandler {
	if reg == nil || runs == nil {
		panic("edge.NewCancelRunHandler: nil dependency")
	}
	return &CancelRunHandler{reg: reg, runs: runs, timeout: 10 * time.Second}
}

// Handle cancels runID. Errors: run_not_found, run_finished, node_not_found,
// and history_unavailable for a run no connected node knows while the
// history cannot be read.
// A run this edge did not dispatch (for example a background run from before
// an edge restart) is looked for on every connected node.
func (h *CancelRunHandler) Handle(ctx context.Context, runID string) (node string, err error) {
	if err := domain.PrincipalFrom(ctx).Require(domain.ScopeRuns); err != nil {
		return "", err
	}
	if runID == "" {
		return "", domain.Errorf(domain.CodeInvalidRequest, "run id is required")
	}
	if err := domain.CheckPathID("run id", runID); err != nil {
		return "", err
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	caller := domain.PrincipalFrom(ctx)
	nodeID, active, known := h.runs.Lookup(runID)
	if known && !caller.SeesNode(nodeID) {
		// A run on a node the caller may not see does not exist for it.
		return "", domain.Errorf(domain.CodeRunNotFound, "no connected node knows run %s", runID)
	}
	if known && !active {
		return nodeID, domain.Errorf(domain.CodeRunFinished, "run %s has already finished", runID)
	}
	var unread error // the history's failure to say where runID runs
	if !known {
		var rec domain.RunRecord
		rec, known, unread = h.fromHistory(ctx, runID)
		if known && !caller.SeesNode(rec.Node) {
			return "", domain.Errorf(domain.CodeRunNotFound, "no connected node knows run %s", runID)
		}
		if known {
			if rec.Status.Finished() {
				return rec.Node, domain.Errorf(domain.CodeRunFinished, "run %s has already finished", runID)
			}
			return rec.Node, h.cancelRecorded(ctx, rec)
		}
	}
	if known {
		n, ok := h.reg.Get(nodeID)
		if !ok {
			return nodeID, domain.Errorf(domain.CodeNodeNotFound, "node %q running %s is not connected", nodeID, runID)
		}
		return nodeID, n.Link.CancelRun(ctx, runID, "")
	}
	node, err = h.askAll(parent, h.reg.ListAs(caller), runID)
	if unread != nil && errors.Is(err, domain.ErrRunNotFound) {
		// No node here knows it, but the history that would say where it
		// runs (another edge's node, or one away) could not: "not found"
		// would tell the caller there is nothing to cancel.
		return "", domain.Errorf(domain.CodeHistoryUnavailable,
			"no connected node knows run %s, and the edge's history, which says where it runs, cannot be read now; retry later", runID)
	}
	return node, err
}

// askAll asks every node in nodes to cancel runID at once, each within its
// own h.timeout (measured from now, inside the caller's ctx), so a slow or
// failing node neither hides nor delays the one running it. The first
// success or run_finished wins; run_not_found only if every node said so;
// otherwise the first other error (nodes in id order).
func (h *CancelRunHandler) askAll(ctx context.Context, nodes []NodeView, runID string) (string, error) {
	type answer struct {
		i   int
		err error
	}
	answers := make(chan answer, len(nodes)) // buffered: late answers never block
	ctx, cancelAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancelAll() // the others stop asking once one has answered,
		wg.Wait()   // and are gone when this returns
	}()
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nctx, cancel := context.WithTimeout(ctx, h.timeout)
			defer cancel()
			answers <- answer{i, n.Link.CancelRun(nctx, runID, "")}
		}()
	}
	errs := make([]error, len(nodes))
	for range nodes {
		a := <-answers
		if a.err == nil || errors.Is(a.err, domain.ErrRunFinished) {
			return nodes[a.i].ID, a.err
		}
		errs[a.i] = a.err
	}
	for i, err := range errs {
		if !errors.Is(err, domain.ErrRunNotFound) {
			return nodes[i].ID, err
		}
	}
	return "", domain.Errorf(domain.CodeRunNotFound, "no connected node knows run %s", runID)
}

// fromHistory looks runID up in the history. A history that cannot answer
// says why in unread; the connected nodes are asked all the same.
func (h *CancelRunHandler) fromHistory(ctx context.Context, runID string) (rec domain.RunRecord, found bool, unread error) {
	if h.History == nil {
		return domain.RunRecord{}, false, nil
	}
	r, err := h.History.GetRun(ctx, runID)
	if errors.Is(err, domain.ErrRunNotFound) {
		return domain.RunRecord{}, false, nil
	}
	if err != nil {
		return domain.RunRecord{}, false, err
	}
	return r, true, nil
}

// cancelRecorded cancels a run known only from the history on its node
// and, when the node accepts, records it as cancelled at once and has the
// reconciler complete that record from the node's store once the run has
// stopped there. A node that says the run already ended leaves the record
// as it was (its final state is in the node's own store).
func (h *CancelRunHandler) cancelRecorded(ctx context.Context, rec domain.RunRecord) error {
	n, ok := h.reg.Get(rec.Node)
	elsewhere := byOtherEdge(rec.Edge, h.Edge)
	if !ok && elsewhere {
		// Its node is another edge's: "cancel again once it is back"
		// would never come true through this one.
		return domain.Errorf(domain.CodeNodeNotFound,
			"run %s was dispatched by edge %q (store.edge_id) to node %q, which is not connected to this edge (%q): cancel it through edge %q "+
				"(edges sharing a history reach only their own nodes; %q may also be this edge under an earlier id)",
			rec.ID, rec.Edge, rec.Node, h.Edge, rec.Edge, rec.Edge)
	}
	if !ok {
		return domain.Errorf(domain.CodeNodeNotFound, "node %q running %s is not connected", rec.Node, rec.ID)
	}
	if err := n.Link.CancelRun(ctx, rec.ID, ""); err != nil {
		if elsewhere && errors.Is(err, domain.ErrRunNotFound) {
			// This edge's node of that id is not the other edge's.
			return domain.Errorf(domain.CodeRunNotFound,
				"node %q connected to this edge (%q) does not know run %s, which edge %q (store.edge_id) dispatched to its own node %q: cancel it through edge %q",
				rec.Node, h.Edge, rec.ID, rec.Edge, rec.Node, rec.Edge)
		}
		return err
	}
	if h.Record != nil {
		rec.Status, rec.FinishedAt = domain.RunCancelled, time.Now()
		rec.ErrorCode, rec.ErrorMsg = domain.CodeCancelled, "cancelled after an edge restart"
		h.Record.RecordRun(rec)
		h.Reconcile.Follow(rec)
	}
	return nil
}

// byOtherEdge reports whether a history record's edge (its Edge) is another
// edge than self, this edge's id on a history others may share ("" on one
// that is this edge's alone, where no record is another's).
func byOtherEdge(recorded, self string) bool {
	return recorded != "" && self != "" && recorded != self
}
