package edge_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
)

// Two edges share one PostgreSQL history, each with nodes of its own: a
// cancel asked of edge b for a run edge a dispatched to a's node n1 finds
// the row, but n1 is not connected to b. It used to answer only "node n1
// is not connected", which README follows with "cancel again once it is
// back" — never, through b. The error now names the edge to ask; a run
// this edge recorded itself keeps the old message.
func TestCancelOfAnotherEdgesRunNamesThatEdge(t *testing.T) {
	hist := &rcHistory{recorded: make(chan domain.RunRecord, 4), rows: []domain.RunRecord{
		{ID: "ra", Node: "n1", Adapter: "exec", Status: domain.RunRunning, Background: true, Edge: "edge-a"},
		{ID: "rb", Node: "n1", Adapter: "exec", Status: domain.RunRunning, Background: true, Edge: "edge-b"},
	}}
	h := edge.NewCancelRunHandler(edge.NewRegistry(), edge.NewRunTracker(0))
	h.History, h.Record, h.Edge = hist, hist, "edge-b"
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})

	node, err := h.Handle(ctx, "ra")
	if domain.CodeOf(err) != domain.CodeNodeNotFound || node != "n1" {
		t.Fatalf("cancel of edge-a's run through edge-b = %q, %v; want n1, node_not_found", node, err)
	}
	for _, want := range []string{`dispatched by edge "edge-a"`, `cancel it through edge "edge-a"`, `not connected to this edge ("edge-b")`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("cancel of edge-a's run through edge-b: %q lacks %q", err, want)
		}
	}

	_, err = h.Handle(ctx, "rb")
	if domain.CodeOf(err) != domain.CodeNodeNotFound || strings.Contains(err.Error(), "edge") {
		t.Fatalf("cancel of this edge's own run, its node away: %v; want node_not_found naming no edge", err)
	}
	select {
	case r := <-hist.recorded:
		t.Fatalf("a cancel that reached no node recorded %+v", r)
	default:
	}
}

// brokenHistory is a history whose database is down.
type brokenHistory struct{ *rcHistory }

func (brokenHistory) GetRun(context.Context, string) (domain.RunRecord, error) {
	return domain.RunRecord{}, errors.New("read run: dial tcp 127.0.0.1:5432: connect: connection refused")
}

// A cancel while the history's database is down, of a run no connected
// node knows (another edge's, or one whose node is away), answers 503
// history_unavailable: it answered 404 run_not_found, telling the caller
// there was nothing to cancel. A history that says it has no such run
// still makes it run_not_found.
func TestCancelWithTheHistoryDownIsNotRunNotFound(t *testing.T) {
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	h := edge.NewCancelRunHandler(edge.NewRegistry(), edge.NewRunTracker(0))
	h.History = brokenHistory{&rcHistory{}}
	if _, err := h.Handle(ctx, "run_elsewhere"); domain.CodeOf(err) != domain.CodeHistoryUnavailable || !strings.Contains(err.Error(), "retry") {
		t.Fatalf("cancel with the history down = %v, want history_unavailable saying to retry", err)
	}
	h.History = &rcHistory{}
	if _, err := h.Handle(ctx, "run_elsewhere"); domain.CodeOf(err) != domain.CodeRunNotFound {
		t.Fatalf("cancel of a run the history has not = %v, want run_not_found", err)
	}
}

// Edges sharing a history may each have a node of the same id (README
// warns of it): a cancel through edge b of a run edge a dispatched to a's
// n1 reaches b's n1, which does not know it. The run_not_found it answers
// now names the edge to ask; it said only the node's "no such run".
func TestCancelOfAnotherEdgesRunOnANodeOfTheSameIDNamesThatEdge(t *testing.T) {
	hist := &rcHistory{recorded: make(chan domain.RunRecord, 4), rows: []domain.RunRecord{
		{ID: "ra", Node: "n1", Adapter: "exec", Status: domain.RunRunning, Background: true, Edge: "edge-a"},
	}}
	reg := edge.NewRegistry()
	link := &ucLink{id: "n1", cancelErr: domain.Errorf(domain.CodeRunNotFound, "no such run")}
	if err := reg.Admit(&edge.LiveNode{ID: "n1", Link: link, Config: domain.NodeConfig{NodeID: "n1"}, ConnectedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	h := edge.NewCancelRunHandler(reg, edge.NewRunTracker(0))
	h.History, h.Record, h.Edge = hist, hist, "edge-b"
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "admin", Scopes: []string{domain.ScopeAdmin}})
	_, err := h.Handle(ctx, "ra")
	if domain.CodeOf(err) != domain.CodeRunNotFound || !strings.Contains(err.Error(), `cancel it through edge "edge-a"`) {
		t.Fatalf("cancel through edge-b of edge-a's run on an n1 of each = %v; want run_not_found naming edge-a", err)
	}
	if len(hist.recorded) != 0 {
		t.Fatalf("a cancel the node refused recorded %+v", <-hist.recorded)
	}
}

// Ending a session through an edge sharing the history with the edge whose
// node keeps it: the node is not connected here, and the refusal names the
// edge to end it through (it said only that the node was not connected).
// Another key's session names nothing; nor does one whose newest run was
// this edge's, or on another node.
func TestEndOfAnotherEdgesSessionNamesThatEdge(t *testing.T) {
	hist := &ucSessionHistory{runs: []domain.RunRecord{
		{ID: "r2", Node: "n1", Adapter: "claude", SessionID: "s1", Key: "alice", Status: domain.RunSucceeded, Edge: "edge-a"},
		{ID: "r3", Node: "n1", Adapter: "claude", SessionID: "mine", Key: "alice", Status: domain.RunSucceeded, Edge: "edge-b"},
		{ID: "r4", Node: "n2", Adapter: "claude", SessionID: "s2", Key: "alice", Status: domain.RunSucceeded, Edge: "edge-a"},
	}}
	h := edge.NewTerminateSessionHandler(edge.NewRegistry())
	h.Sessions, h.Edge = hist, "edge-b"
	alice := domain.WithPrincipal(context.Background(), domain.Principal{Name: "alice", Scopes: []string{domain.ScopeRuns}})
	err := h.Handle(alice, edge.TerminateSession{Node: "n1", Adapter: "claude", SessionID: "s1"})
	if domain.CodeOf(err) != domain.CodeNodeNotFound || !strings.Contains(err.Error(), `end it through edge "edge-a"`) {
		t.Fatalf("end of edge-a's session through edge-b = %v; want node_not_found naming edge-a", err)
	}
	bob := domain.WithPrincipal(context.Background(), domain.Principal{Name: "bob", Scopes: []string{domain.ScopeRuns}})
	for _, tc := range []struct {
		ctx  context.Context
		cmd  edge.TerminateSession
		name string
	}{
		{bob, edge.TerminateSession{Node: "n1", Adapter: "claude", SessionID: "s1"}, "another key's session"},
		{alice, edge.TerminateSession{Node: "n1", Adapter: "claude", SessionID: "mine"}, "this edge's own session"},
		{alice, edge.TerminateSession{Node: "n1", Adapter: "claude", SessionID: "s2"}, "a session last run on another node"},
	} {
		if err := h.Handle(tc.ctx, tc.cmd); domain.CodeOf(err) != domain.CodeNodeNotFound || strings.Contains(err.Error(), "edge") {
			t.Errorf("%s: %v; want node_not_found naming no edge", tc.name, err)
		}
	}
}
