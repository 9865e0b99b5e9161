package edge

import (
	"context"
	"errors"
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
}

// NewCancelRunHandler refuses nil dependencies.
func NewCancelRunHandler(reg *Registry, runs *RunTracker) *CancelRunHandler {
	if reg == nil || runs == nil {
		panic("edge.NewCancelRunHandler: nil dependency")
	}
	return &CancelRunHandler{reg: reg, runs: runs, timeout: 10 * time.Second}
}

// Handle cancels runID. Errors: run_not_found, run_finished, node_not_found.
// A run this edge did not dispatch (for example a background run from before
// an edge restart) is looked for on every connected node.
func (h *CancelRunHandler) Handle(ctx context.Context, runID string) (node string, err error) {
	if runID == "" {
		return "", domain.Errorf(domain.CodeInvalidRequest, "run id is required")
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	nodeID, active, known := h.runs.Lookup(runID)
	if known && !active {
		return nodeID, domain.Errorf(domain.CodeRunFinished, "run %s has already finished", runID)
	}
	if !known {
		nodeID, active, known = h.fromHistory(ctx, runID)
		if known && !active {
			return nodeID, domain.Errorf(domain.CodeRunFinished, "run %s has already finished", runID)
		}
	}
	if known {
		n, ok := h.reg.Get(nodeID)
		if !ok {
			return nodeID, domain.Errorf(domain.CodeNodeNotFound, "node %q running %s is not connected", nodeID, runID)
		}
		return nodeID, n.Link.CancelRun(ctx, runID)
	}
	for _, n := range h.reg.List() {
		err := n.Link.CancelRun(ctx, runID)
		if errors.Is(err, domain.ErrRunNotFound) {
			continue
		}
		return n.ID, err
	}
	return "", domain.Errorf(domain.CodeRunNotFound, "no connected node knows run %s", runID)
}

// fromHistory looks runID up in the history; a history that cannot answer
// is as good as none (the connected nodes are asked instead).
func (h *CancelRunHandler) fromHistory(ctx context.Context, runID string) (node string, active, known bool) {
	if h.History == nil {
		return "", false, false
	}
	r, err := h.History.GetRun(ctx, runID)
	if err != nil {
		return "", false, false
	}
	return r.Node, !r.Status.Finished(), true
}
