package edge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"iop/domain"
	"iop/domain/nodecmd"
	"iop/ports"
)

// RunHistoryHandler answers run and usage questions from the edge's
// durable history, so they hold across edge restarts and offline nodes.
type RunHistoryHandler struct {
	store ports.HistoryReader

	// Nodes and Record, when both set, let Get repair a record left
	// unfinished (the edge was killed or restarted before the run's end
	// was written): the run's node is asked, and a final status it reports
	// is answered and recorded.
	Nodes  *GetRunHandler
	Record ports.RunHistory
}

// reconcileTimeout bounds the question to a node while answering a read;
// a node that is slow to answer leaves the history's record as it is.
const reconcileTimeout = 5 * time.Second

// lostAfter is how old a running record must be before its node's
// run_not_found settles it as lost: younger, its dispatch may still be on
// the way (another edge sharing the history sent it a moment ago).
const lostAfter = time.Minute

// NewRunHistoryHandler refuses a nil store.
func NewRunHistoryHandler(store ports.HistoryReader) *RunHistoryHandler {
	if store == nil {
		panic("edge.NewRunHistoryHandler: nil store")
	}
	return &RunHistoryHandler{store: store}
}

// Get returns one run; run_not_found if the history has none.
func (h *RunHistoryHandler) Get(ctx context.Context, id string) (domain.RunRecord, error) {
	if id == "" {
		return domain.RunRecord{}, domain.Errorf(domain.CodeInvalidRequest, "run id is required")
	}
	r, err := h.store.GetRun(ctx, id)
	if err != nil && !errors.Is(err, domain.ErrRunNotFound) {
		return domain.RunRecord{}, historyError("the run history", err)
	}
	if err == nil && !domain.PrincipalFrom(ctx).SeesNode(r.Node) {
		// A run on a node the caller may not see does not exist for it.
		return domain.RunRecord{}, domain.Errorf(domain.CodeRunNotFound, "run %s is not in the edge's history", id)
	}
	if err == nil && !r.Status.Finished() {
		r = h.reconcile(ctx, r)
	}
	return r, err
}

// reconcile returns rec with the final state its node reports, and records
// that state, when this edge process does not record the run's end itself.
// Otherwise (the run is live here or its end passed through here, its node
// is not connected, does not know the run or reports it unfinished) rec is
// returned unchanged.
func (h *RunHistoryHandler) reconcile(ctx context.Context, rec domain.RunRecord) domain.RunRecord {
	rec, _ = h.settle(ctx, rec)
	return rec
}

// settlement is what reconciling one record came to.
type settlement int

const (
	// settledHere: this edge records the run's end itself.
	settledHere settlement = iota
	// settledFromNode: the node reported the run finished; recorded.
	settledFromNode
	// settledUnknown: the node answered for another run: there is
	// nothing to learn from it.
	settledUnknown
	// unsettledUnknownYet: the node does not know the run, whose record
	// is younger than lostAfter: its dispatch may still be on the way, so
	// it is not written lost yet — asked again once old enough, it is.
	unsettledUnknownYet
	// unsettledGoing: the node reports the run still queued or running.
	unsettledGoing
	// unsettledNoAnswer: the node was not asked (not connected, or h
	// cannot ask or record) or did not answer.
	unsettledNoAnswer
)

// settle is reconcile, also saying what it came to: the reconciler
// watches the runs a node reports still going (HistoryReconciler).
func (h *RunHistoryHandler) settle(ctx context.Context, rec domain.RunRecord) (domain.RunRecord, settlement) {
	if h.Nodes == nil || h.Record == nil {
		return rec, unsettledNoAnswer
	}
	if h.Nodes.runs.recordsEnd(rec.ID) {
		// Its end is recorded when it arrives, or was just recorded: the
		// history may still have that record queued (a flush interval), so
		// rec says running. A record made from the node's now would be
		// queued after the edge's own and replace it (losing usage.model,
		// which only the edge saw, and the edge's finish time).
		return rec, settledHere
	}
	ctx, cancel := context.WithTimeout(ctx, reconcileTimeout)
	defer cancel()
	run, err := h.Nodes.OnNode(ctx, rec.Node, rec.ID)
	switch {
	case domain.CodeOf(err) == domain.CodeRunNotFound && time.Since(rec.CreatedAt) >= lostAfter:
		// The node stores every run it admits or refuses until its
		// retention prunes it: a run it does not know never reached it (the
		// edge stopped between recording the dispatch and sending it) or
		// its store lost it. Left running, the record would count as
		// running in the usage for good and never be pruned.
		lost := rec
		lost.Status, lost.FinishedAt = domain.RunFailed, time.Now()
		lost.ErrorCode = domain.CodeRunLost
		lost.ErrorMsg = fmt.Sprintf("node %s has no record of the run: it never reached the node, or the node's store lost it", rec.Node)
		h.recordEnd(lost, -1)
		return lost, settledFromNode
	case domain.CodeOf(err) == domain.CodeRunNotFound:
		return rec, unsettledUnknownYet
	case err != nil:
		return rec, unsettledNoAnswer
	case run.RunID != rec.ID:
		return rec, settledUnknown
	}
	fixed, ok := finishedFrom(rec, run)
	if !ok {
		return rec, unsettledGoing
	}
	h.recordEnd(fixed, nodeSpan(run))
	return fixed, settledFromNode
}

// recordEnd writes a run's end learned from its node (or the lack of one)
// to the history. A run this process dispatched and let go of when its
// link broke (lose) is counted now that its end is known; only the first
// of the reads and checks that settle it gets its observation. Counted
// before it is written: whoever sees the row sees it counted. took is how
// long the run lasted by its node's clock, below zero if unknown
// (runObservation.settled).
func (h *RunHistoryHandler) recordEnd(r domain.RunRecord, took time.Duration) {
	h.Nodes.runs.claimLost(r.ID).settled(r, took)
	h.Record.RecordRun(r)
}

// nodeSpan is how long run lasted from its admission to its end, both as
// its node's clock tells them, or -1 if the node did not say: a time the
// node reports is on its own clock, which may be far from the edge's.
func nodeSpan(run nodecmd.Run) time.Duration {
	if run.FinishedAt == nil || run.FinishedAt.IsZero() || run.CreatedAt.IsZero() {
		return -1
	}
	return max(run.FinishedAt.Sub(run.CreatedAt), 0)
}

// finishedFrom is rec completed with the final state of run as its node
// stored it; false if the node does not report the run finished.
func finishedFrom(rec domain.RunRecord, run nodecmd.Run) (domain.RunRecord, bool) {
	st := domain.RunStatus(run.Status)
	if run.RunID != rec.ID || !st.Finished() {
		return rec, false
	}
	rec.Status = st
	rec.FinishedAt = time.Now()
	if run.FinishedAt != nil && !run.FinishedAt.IsZero() {
		rec.FinishedAt = *run.FinishedAt
	}
	rec.ErrorCode, rec.ErrorMsg = "", ""
	if run.Error != nil {
		rec.ErrorCode, rec.ErrorMsg = domain.PeerError(run.Error.Code, run.Error.Message)
	}
	if u := run.Usage; u != nil {
		model := ""
		if rec.Usage != nil {
			model = rec.Usage.Model
		}
		// Below zero (a buggy or hostile node) is 0: summed per key, it
		// would lower the totals /v1/usage reports.
		rec.Usage = &domain.Usage{PromptTokens: max(u.PromptTokens, 0), CompletionTokens: max(u.CompletionTokens, 0),
			TotalTokens: max(u.TotalTokens, 0), CostUSD: max(u.CostUSD, 0), Model: model}
	}
	return rec, true
}

// List returns one page of runs, newest first. Errors: invalid_request for
// an unknown status, a negative limit, since not before until, or a cursor
// this edge did not hand out.
func (h *RunHistoryHandler) List(ctx context.Context, q domain.RunQuery) (domain.RunPage, error) {
	if q.Status != "" && !q.Status.Valid() {
		return domain.RunPage{}, domain.Errorf(domain.CodeInvalidRequest, "unknown status %q (queued, running, succeeded, failed, cancelled)", q.Status)
	}
	switch {
	case q.Limit < 0:
		return domain.RunPage{}, domain.Errorf(domain.CodeInvalidRequest, "limit must not be negative")
	case q.Limit == 0:
		q.Limit = DefaultRunListLimit
	case q.Limit > MaxRunListLimit:
		q.Limit = MaxRunListLimit
	}
	if err := checkRange(q.Since, q.Until); err != nil {
		return domain.RunPage{}, err
	}
	if caller := domain.PrincipalFrom(ctx); caller.Limited() {
		if q.Node != "" && !caller.SeesNode(q.Node) {
			return domain.RunPage{Runs: []domain.RunRecord{}}, nil
		}
		q.Nodes = caller.Nodes
	}
	if q.Status == domain.RunQueued && q.Cursor == "" {
		// The edge records a run when it dispatches it, running (see
		// observeRun), and then its end: its history holds no queued run
		// (a run queues on its node, whose runs command lists it). Answered
		// here, that filter — which the console asks on every load — costs
		// no read of the history. A cursor goes to the store, which checks
		// it is one it handed out.
		return domain.RunPage{Runs: []domain.RunRecord{}}, nil
	}
	p, err := h.store.ListRuns(ctx, q)
	if err != nil {
		return domain.RunPage{}, historyError("the run history", err)
	}
	return p, nil
}

// historyError is err from a history read as the caller gets it: what the
// caller can act on (invalid_request: narrow the range, fix the cursor;
// timeout: the read took longer than the store allows) as it is, any other
// fault as internal (answered 503 history_unavailable).
func historyError(what string, err error) error {
	switch domain.CodeOf(err) {
	case domain.CodeInvalidRequest, domain.CodeTimeout:
		return err
	}
	return domain.Errorf(domain.CodeInternal, "%s cannot be read: %v", what, err)
}

// Usage sums runs and tunnels by q.GroupBy (key, node, model or day).
func (h *RunHistoryHandler) Usage(ctx context.Context, q domain.UsageQuery) ([]domain.UsageTotal, error) {
	switch q.GroupBy {
	case domain.GroupByKey, domain.GroupByNode, domain.GroupByModel, domain.GroupByDay:
	default:
		return nil, domain.Errorf(domain.CodeInvalidRequest, "group_by must be key, node, model or day, not %q", q.GroupBy)
	}
	if err := checkRange(q.Since, q.Until); err != nil {
		return nil, err
	}
	if caller := domain.PrincipalFrom(ctx); caller.Limited() {
		q.Nodes = caller.Nodes
	}
	u, err := h.store.Usage(ctx, q)
	if err != nil {
		return nil, historyError("the usage history", err)
	}
	return u, nil
}

func checkRange(since, until time.Time) error {
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		return domain.Errorf(domain.CodeInvalidRequest, "since (%s) must be before until (%s)", since.UTC().Format(time.RFC3339Nano), until.UTC().Format(time.RFC3339Nano))
	}
	return nil
}
