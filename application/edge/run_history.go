package edge

import (
	"context"
	"errors"
	"time"

	"iop/domain"
	"iop/ports"
)

// RunHistoryHandler answers run and usage questions from the edge's
// durable history, so they hold across edge restarts and offline nodes.
type RunHistoryHandler struct {
	store ports.HistoryReader
}

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
		return domain.RunRecord{}, domain.Errorf(domain.CodeInternal, "the run history cannot be read: %v", err)
	}
	if err == nil && !domain.PrincipalFrom(ctx).SeesNode(r.Node) {
		// A run on a node the caller may not see does not exist for it.
		return domain.RunRecord{}, domain.Errorf(domain.CodeRunNotFound, "run %s is not in the edge's history", id)
	}
	return r, err
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
	p, err := h.store.ListRuns(ctx, q)
	if err != nil && domain.CodeOf(err) != domain.CodeInvalidRequest {
		return domain.RunPage{}, domain.Errorf(domain.CodeInternal, "the run history cannot be read: %v", err)
	}
	return p, err
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
	if err != nil && domain.CodeOf(err) != domain.CodeInvalidRequest {
		return nil, domain.Errorf(domain.CodeInternal, "the usage history cannot be read: %v", err)
	}
	return u, err
}

func checkRange(since, until time.Time) error {
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		return domain.Errorf(domain.CodeInvalidRequest, "since (%s) must be before until (%s)", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	return nil
}
