package edge_test

import (
	"context"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

// TestReloadRenamedNodeKeepsItsSessions: a node renamed by a reload (its
// entry keeps the token under a new id) registers again under the new id
// with its store, where its sessions' histories live. The reload used to
// forget those sessions' node as for a removed one, so the next turn of a
// session was placed afresh, on another node (one with more free slots
// here), which has none of its history: a chat went on without its
// messages, an agent could not resume.
func TestReloadRenamedNodeKeepsItsSessions(t *testing.T) {
	ucNoLeaks(t)
	recs := []domain.NodeRecord{
		{ID: "a", Token: ucTokA, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 1, "upper")}},
		{ID: "c", Token: ucTokC, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 4, "upper")}},
	}
	dir, reg, bus, versions := &ucDir{recs: recs}, edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}
	regH := edge.NewRegisterHandler(dir, reg, bus, versions, nil)
	register := func(id, tok string) {
		t.Helper()
		l := &ucLink{id: id}
		l.onClose = func(reason string) { regH.Disconnected(id, l, reason) }
		if _, err := regH.Register(context.Background(), tok, domain.NodeInfo{}, "r-"+id, l); err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
	register("a", ucTokA)
	register("c", ucTokC)
	reg.RememberSession("exec", "s1", "a") // a admitted a run of s1

	next := []domain.NodeRecord{recs[1], recs[0]}
	next[1].ID = "a2" // renamed, same token
	res, err := edge.NewReloadHandler(&ucSource{recs: next}, dir, reg, bus, versions, nil).Handle(context.Background())
	if err != nil || len(res.Disconnected) != 1 {
		t.Fatalf("reload = %+v, %v; want a disconnected", res, err)
	}
	register("a2", ucTokA) // the node, back under its new id

	if node, ok := reg.SessionNode("exec", "s1"); !ok || node != "a2" {
		t.Errorf("session s1 is bound to %q (%v) after its node was renamed; want a2", node, ok)
	}
	v, release, err := reg.PickForTarget(domain.Anonymous(), "", "exec", "", "s1")
	if err != nil {
		t.Fatal(err)
	}
	release()
	if v.ID != "a2" {
		t.Fatalf("the next run of session s1 went to node %s; want a2, the renamed node that holds its history", v.ID)
	}
}
