package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"iop/domain"
	"iop/domain/nodecmd"
)

// Limits of a run listing.
const (
	DefaultRunListLimit = 50
	MaxRunListLimit     = 1000
)

// GetRunHandler reads one run from the store of the node that ran it.
type GetRunHandler struct {
	reg  *Registry
	runs *RunTracker
	cmds *NodeCommandHandler
}

// NewGetRunHandler refuses nil dependencies.
func NewGetRunHandler(reg *Registry, runs *RunTracker, cmds *NodeCommandHandler) *GetRunHandler {
	if reg == nil || runs == nil || cmds == nil {
		panic("edge.NewGetRunHandler: nil dependency")
	}
	return &GetRunHandler{reg: reg, runs: runs, cmds: cmds}
}

// Handle returns the run as the node's run_get command reports it (a JSON
// object), with "node" set to the node's id. A run this edge dispatched is
// asked of its node; any other run is looked for on every connected node.
// Errors: run_not_found, or the failure of the node that ran it.
func (h *GetRunHandler) Handle(ctx context.Context, runID string) (json.RawMessage, error) {
	if runID == "" {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "run id is required")
	}
	if err := domain.CheckPathID("run id", runID); err != nil {
		return nil, err
	}
	args, err := json.Marshal(nodecmd.RunGetArgs{RunID: runID})
	if err != nil {
		return nil, err
	}
	caller := domain.PrincipalFrom(ctx)
	nodeID, _, known := h.runs.Lookup(runID)
	known = known && caller.SeesNode(nodeID) // other runs do not exist for this caller
	if known {
		if _, ok := h.reg.Get(nodeID); ok {
			raw, err := h.cmds.Call(ctx, nodeID, nodecmd.CmdRunGet, args)
			if err != nil {
				return nil, err
			}
			return withNode(raw, nodeID, runID)
		}
	}

	// Ask every connected node at once; the first that knows the run wins.
	nodes := h.reg.ListAs(caller)
	type answer struct {
		node string
		raw  []byte
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	answers := make(chan answer, len(nodes))
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			raw, err := h.cmds.Call(ctx, n.ID, nodecmd.CmdRunGet, args)
			answers <- answer{node: n.ID, raw: raw, err: err}
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	var failed []string
	for range nodes {
		a := <-answers
		if a.err == nil {
			// A node that answers with another run's record, or with what
			// is no record at all (buggy or hostile), does not know this
			// one: another node's answer may still come.
			out, err := withNode(a.raw, a.node, runID)
			if err == nil {
				return out, nil
			}
			a.err = err
		}
		if !errors.Is(a.err, domain.ErrRunNotFound) {
			failed = append(failed, fmt.Sprintf("%s: %v", a.node, a.err))
		}
	}
	msg := fmt.Sprintf("no connected node knows run %s", runID)
	if known {
		msg = fmt.Sprintf("run %s ran on node %s, which is not connected", runID, nodeID)
	}
	if len(failed) > 0 {
		sort.Strings(failed)
		msg += fmt.Sprintf(" (%d node(s) did not answer: %s)", len(failed), failed[0])
	}
	return nil, &domain.Error{Code: domain.CodeRunNotFound, Message: msg}
}

// OnNode asks the named node, if the caller may see it and it is
// connected, for its stored record of a run. Errors: node_not_found (not
// connected or not visible), run_not_found (the node does not know the
// run), the node's failure, or a record that does not decode.
func (h *GetRunHandler) OnNode(ctx context.Context, nodeID, runID string) (nodecmd.Run, error) {
	if !domain.PrincipalFrom(ctx).SeesNode(nodeID) {
		return nodecmd.Run{}, domain.Errorf(domain.CodeNodeNotFound, "node %q is not connected", nodeID)
	}
	if _, ok := h.reg.Get(nodeID); !ok {
		return nodecmd.Run{}, domain.Errorf(domain.CodeNodeNotFound, "node %q is not connected", nodeID)
	}
	args, err := json.Marshal(nodecmd.RunGetArgs{RunID: runID})
	if err != nil {
		return nodecmd.Run{}, err
	}
	raw, err := h.cmds.Call(ctx, nodeID, nodecmd.CmdRunGet, args)
	if err != nil {
		return nodecmd.Run{}, err
	}
	var r nodecmd.Run
	if err := json.Unmarshal(raw, &r); err != nil {
		return nodecmd.Run{}, fmt.Errorf("node %s: run is not a run record: %s", nodeID, truncate(raw, 80))
	}
	r.Node = nodeID
	return r, nil
}

// ListRuns selects recent runs. Zero fields match everything.
type ListRuns struct {
	Node   string // one node, or every connected node when empty
	Status string // a domain.RunStatus
	Limit  int    // DefaultRunListLimit when 0; at most MaxRunListLimit
}

// RunList is a merged listing, newest first. Failures names the nodes that
// could not answer a listing of every node; their runs are missing.
type RunList struct {
	Runs     []json.RawMessage
	Failures []NodeFailure
}

// NodeFailure is one node's error in a request sent to several nodes.
type NodeFailure struct {
	Node string
	Err  error
}

// ListRunsHandler lists runs from the stores of connected nodes.
type ListRunsHandler struct {
	reg  *Registry
	cmds *NodeCommandHandler
}

// NewListRunsHandler refuses nil dependencies.
func NewListRunsHandler(reg *Registry, cmds *NodeCommandHandler) *ListRunsHandler {
	if reg == nil || cmds == nil {
		panic("edge.NewListRunsHandler: nil dependency")
	}
	return &ListRunsHandler{reg: reg, cmds: cmds}
}

// Handle runs the node command "runs" on the named node, or on every
// connected node, and merges the answers newest first (by created_at), cut
// to the limit, each with "node" set. With every node, a node that fails is
// reported in Failures unless all of them fail, which is an error.
func (h *ListRunsHandler) Handle(ctx context.Context, q ListRuns) (RunList, error) {
	if err := domain.CheckID("node", q.Node); err != nil {
		return RunList{}, err
	}
	if q.Status != "" && !domain.RunStatus(q.Status).Valid() {
		return RunList{}, domain.Errorf(domain.CodeInvalidRequest, "unknown status %q (queued, running, succeeded, failed, cancelled)", q.Status)
	}
	switch {
	case q.Limit < 0:
		return RunList{}, domain.Errorf(domain.CodeInvalidRequest, "limit must not be negative")
	case q.Limit == 0:
		q.Limit = DefaultRunListLimit
	case q.Limit > MaxRunListLimit:
		q.Limit = MaxRunListLimit
	}
	args, err := json.Marshal(nodecmd.RunsArgs{Status: q.Status, Limit: q.Limit})
	if err != nil {
		return RunList{}, err
	}

	var ids []string
	if q.Node != "" {
		ids = []string{q.Node}
	} else {
		for _, n := range h.reg.ListAs(domain.PrincipalFrom(ctx)) {
			ids = append(ids, n.ID)
		}
	}
	type answer struct {
		runs []listedRun
		err  error
	}
	answers := make([]answer, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			raw, err := h.cmds.Call(ctx, id, nodecmd.CmdRuns, args)
			if err == nil {
				answers[i].runs, err = decodeRunList(raw, id)
			}
			answers[i].err = err
		}()
	}
	wg.Wait()

	var all []listedRun
	out := RunList{Runs: []json.RawMessage{}}
	for i, a := range answers {
		if a.err != nil {
			if q.Node != "" {
				return RunList{}, a.err
			}
			out.Failures = append(out.Failures, NodeFailure{Node: ids[i], Err: a.err})
			continue
		}
		all = append(all, a.runs...)
	}
	if len(ids) > 0 && len(out.Failures) == len(ids) {
		return RunList{}, out.Failures[0].Err
	}
	sort.SliceStable(all, func(i, j int) bool {
		if !all[i].created.Equal(all[j].created) {
			return all[i].created.After(all[j].created)
		}
		return all[i].id > all[j].id
	})
	if len(all) > q.Limit {
		all = all[:q.Limit]
	}
	for _, r := range all {
		out.Runs = append(out.Runs, r.raw)
	}
	return out, nil
}

type listedRun struct {
	raw     json.RawMessage
	id      string
	created time.Time
}

func decodeRunList(raw []byte, node string) ([]listedRun, error) {
	var l nodecmd.RunList
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, fmt.Errorf("node %s: decode run list: %w", node, err)
	}
	out := make([]listedRun, 0, len(l.Runs))
	for _, r := range l.Runs {
		lr, err := placed(r, node)
		if err != nil {
			return nil, err
		}
		out = append(out, lr)
	}
	return out, nil
}

// withNode decodes node's run_get answer for run runID and returns it with
// its node set. A record of another run is run_not_found.
func withNode(raw []byte, node, runID string) (json.RawMessage, error) {
	var r nodecmd.Run
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("node %s: run is not a run record: %s", node, truncate(raw, 80))
	}
	if r.RunID != runID {
		return nil, domain.Errorf(domain.CodeRunNotFound, "node %s answered for run %s with the record of run %.64q", node, runID, r.RunID)
	}
	lr, err := placed(r, node)
	return lr.raw, err
}

// placed is r as the edge reports it: with the node that ran it.
// Its error code is kept only if shaped like one (domain.PeerCode).
func placed(r nodecmd.Run, node string) (listedRun, error) {
	r.Node = node
	if r.Error != nil {
		e := *r.Error
		e.Code, e.Message = domain.PeerError(e.Code, e.Message)
		r.Error = &e
	}
	b, err := json.Marshal(r)
	if err != nil {
		return listedRun{}, err
	}
	return listedRun{raw: b, id: r.RunID, created: r.CreatedAt}, nil
}

func truncate(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
