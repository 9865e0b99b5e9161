package edge_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

// ucSessionHistory answers ListRuns with the runs of one session, newest
// first, and records the queries.
type ucSessionHistory struct {
	mu      sync.Mutex
	runs    []domain.RunRecord
	err     error
	queries []domain.RunQuery
}

func (h *ucSessionHistory) GetRun(context.Context, string) (domain.RunRecord, error) {
	return domain.RunRecord{}, domain.ErrRunNotFound
}

func (h *ucSessionHistory) ListRuns(_ context.Context, q domain.RunQuery) (domain.RunPage, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.queries = append(h.queries, q)
	var page domain.RunPage
	for _, r := range h.runs {
		key := r.Key
		if key == "" {
			key = domain.AnonymousName // as the store keeps it
		}
		if r.SessionID != q.Session || r.Adapter != q.Adapter || (q.Took && !r.Took()) || slices.Contains(q.ExcludeKeys, key) {
			continue
		}
		if len(page.Runs) == q.Limit {
			page.Next = "more"
			break
		}
		page.Runs = append(page.Runs, r)
	}
	return page, h.err
}

func (h *ucSessionHistory) Usage(context.Context, domain.UsageQuery) ([]domain.UsageTotal, error) {
	return nil, nil
}

func (h *ucSessionHistory) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.queries)
}

// An edge with no session in memory (it restarted) sends the session's run
// to the node of its newest run in the history that a node took — not to
// one that refused it before it started — and asks the history once: the
// admitted run binds the session in memory.
func TestSessionNodeRecalledFromHistory(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	hist := &ucSessionHistory{runs: []domain.RunRecord{
		{ID: "run_3", Node: "a", Adapter: "chat", SessionID: "s1", Status: domain.RunFailed, ErrorCode: domain.CodeAtCapacity},
		{ID: "run_2", Node: "b", Adapter: "chat", SessionID: "s1", Status: domain.RunSucceeded},
		{ID: "run_1", Node: "a", Adapter: "chat", SessionID: "s1", Status: domain.RunSucceeded},
	}}
	e.submit.Sessions = hist
	ctx := context.Background()
	for turn := range 2 {
		rh, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		if rh.Node != "b" {
			t.Fatalf("turn %d went to %s, want b (the session's last run there); a would win a tie", turn, rh.Node)
		}
		ucFinish(t, e, rh)
	}
	if n := hist.count(); n != 1 {
		t.Fatalf("history asked %d times, want once", n)
	}
	// A node named by the caller needs no recall; a session the history
	// does not know is placed afresh (the tie goes to a).
	rh, err := e.submit.Handle(ctx, edge.SubmitRun{Node: "a", Adapter: "chat", SessionID: "s9"})
	if err != nil || rh.Node != "a" {
		t.Fatalf("named node: %v %v", rh, err)
	}
	ucFinish(t, e, rh)
	rh, err = e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "new"})
	if err != nil || rh.Node != "a" {
		t.Fatalf("new session: %v %v", rh, err)
	}
	ucFinish(t, e, rh)
	if n := hist.count(); n != 2 {
		t.Fatalf("history asked %d times, want 2 (s1 once, new once)", n)
	}
}

// A history that fails costs the session its binding, never the run.
func TestSessionRecallFailureStillRuns(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	e.submit.Sessions = &ucSessionHistory{err: errors.New("database is locked"),
		runs: []domain.RunRecord{{ID: "run_1", Node: "b", Adapter: "chat", SessionID: "s1", Status: domain.RunSucceeded}}}
	rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if rh.Node != "a" {
		t.Fatalf("went to %s, want a (placed afresh)", rh.Node)
	}
	ucFinish(t, e, rh)
}

// A session ended on its node is placed afresh on its next run, although
// the history still names that node.
func TestEndedSessionIsNotRecalled(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	e.submit.Sessions = &ucSessionHistory{runs: []domain.RunRecord{{ID: "run_1", Node: "b", Adapter: "chat", SessionID: "s1", Status: domain.RunSucceeded}}}
	ctx := context.Background()
	rh, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "b" {
		t.Fatalf("recalled turn: %v %v", rh, err)
	}
	ucFinish(t, e, rh)
	if err := edge.NewTerminateSessionHandler(e.reg).Handle(ctx, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"}); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	rh, err = e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "a" {
		t.Fatalf("after its end the session went to %v (%v), want a (placed afresh, a wins the tie)", rh, err)
	}
	ucFinish(t, e, rh)
}

// A session ended before the edge had bound it to a node (the edge
// restarted, or forgot it among more recent sessions) is not recalled from
// the history afterwards either: the node it was just ended on would get
// its next turn, pinned there even when full.
func TestSessionEndedBeforeAnyTurnIsNotRecalled(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	e.submit.Sessions = &ucSessionHistory{runs: []domain.RunRecord{{ID: "run_1", Node: "b", Adapter: "chat", SessionID: "s1", Status: domain.RunSucceeded}}}
	ctx := context.Background()
	if err := edge.NewTerminateSessionHandler(e.reg).Handle(ctx, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"}); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	rh, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "a" {
		t.Fatalf("after its end the session went to %v (%v), want a (placed afresh, a wins the tie)", rh, err)
	}
	ucFinish(t, e, rh)
}
