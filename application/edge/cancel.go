package edge

import (
	"context"
	"errors"
	"time"

	"iop/domain"
)

// CancelRunHandler cancels a run on the node that runs it.
type CancelRunHandler struct {
	reg     *Registry
	runs    *RunTracker
	timeout time.Duration
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
	if err := domain.PrincipalFrom(ctx).Require(domain.ScopeRuns); err != nil {
		return "", err
	}
	if runID == "" {
		return "", domain.Errorf(domain.CodeInvalidRequest, "run id is required")
	}
	if err := domain.CheckID("run id", runID); err != nil {
		return "", err
	}
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
	if known {
		n, ok := h.reg.Get(nodeID)
		if !ok {
			return nodeID, domain.Errorf(domain.CodeNodeNotFound, "node %q running %s is not connected", nodeID, runID)
		}
		return nodeID, n.Link.CancelRun(ctx, runID)
	}
	for _, n := range h.reg.ListAs(caller) {
		err := n.Link.CancelRun(ctx, runID)
		if errors.Is(err, domain.ErrRunNotFound) {
			continue
		}
		return n.ID, err
	}
	return "", domain.Errorf(domain.CodeRunNotFound, "no connected node knows run %s", runID)
}
