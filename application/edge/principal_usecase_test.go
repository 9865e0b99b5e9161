package edge_test

import (
	"context"
	"errors"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

// The use cases check the caller's scope and node limit by name, whatever
// surface called them.
func TestUseCasesCheckThePrincipal(t *testing.T) {
	e := newUCEdge(t, ucNodeSpec{"n1", []string{"exec"}}, ucNodeSpec{"n2", []string{"exec"}})
	ctx, cancel := context.WithTimeout(context.Background(), ucWait)
	defer cancel()
	as := func(scopes []string, nodes ...string) context.Context {
		return domain.WithPrincipal(ctx, domain.Principal{Name: "k", Scopes: scopes, Nodes: nodes})
	}

	reader := as([]string{domain.ScopeRead})
	if _, err := e.submit.Handle(reader, edge.SubmitRun{Adapter: "exec"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("submit with a read key: %v", err)
	}
	if _, err := edge.NewCancelRunHandler(e.reg, e.runs).Handle(reader, "run_x"); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("cancel with a read key: %v", err)
	}
	if err := edge.NewTerminateSessionHandler(e.reg).Handle(reader, edge.TerminateSession{Adapter: "exec", SessionID: "s"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("end session with a read key: %v", err)
	}

	n2 := as([]string{domain.ScopeRuns}, "n2")
	if _, err := e.submit.Handle(n2, edge.SubmitRun{Node: "n1", Adapter: "exec"}); !errors.Is(err, domain.ErrNodeNotFound) {
		t.Fatalf("submit to n1 with an n2-only key: %v", err)
	}
	for range 3 {
		rh, err := e.submit.Handle(n2, edge.SubmitRun{Adapter: "exec", Background: true})
		if err != nil || rh.Node != "n2" || rh.Key != "k" {
			t.Fatalf("submit with an n2-only key: %+v %v", rh, err)
		}
	}
	if ids := e.reg.ListAs(domain.PrincipalFrom(n2)); len(ids) != 1 || ids[0].ID != "n2" {
		t.Fatalf("ListAs = %+v", ids)
	}
	if _, ok := e.reg.GetAs(domain.PrincipalFrom(n2), "n1"); ok {
		t.Fatal("GetAs found a node outside the key's limit")
	}
	// No principal: the anonymous caller of an edge without keys may do all.
	if rh, err := e.submit.Handle(ctx, edge.SubmitRun{Node: "n1", Adapter: "exec", Background: true}); err != nil || rh.Key != domain.AnonymousName {
		t.Fatalf("anonymous submit: %+v %v", rh, err)
	}
}
