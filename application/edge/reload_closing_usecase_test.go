package edge_test

import (
	"context"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

// TestReloadSendsNoRunToANodeItIsDisconnecting: a reload closes the links
// of the nodes it removes or whose token changed one after another, after
// it has replaced the directory. A run placed meanwhile went to such a node
// still connected (here the first by id, a, whose link is still closing,
// and b, removed too, not closed yet): it was cut when the link closed, or,
// in the background, ended node_removed, although the file kept node c to
// take it.
func TestReloadSendsNoRunToANodeItIsDisconnecting(t *testing.T) {
	ucNoLeaks(t)
	dir, reg, bus, versions := &ucDir{recs: ucReloadRecords()}, edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}
	regH := edge.NewRegisterHandler(dir, reg, bus, versions, nil)
	closing, release := make(chan struct{}), make(chan struct{})
	for id, tok := range map[string]string{"a": ucTokA, "b": ucTokB, "c": ucTokC} {
		l := &ucLink{id: id}
		l.onClose = func(reason string) {
			if id == "a" {
				close(closing)
				<-release // a TLS close alert to a peer slow to take it
			}
			regH.Disconnected(id, l, reason)
		}
		if _, err := regH.Register(context.Background(), tok, domain.NodeInfo{}, "r-"+id, l); err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
	next := ucReloadRecords()
	next[1].Token = "reload-token-b-rotated-0123" // b's token changed
	next = next[1:]                               // a removed

	h := edge.NewReloadHandler(&ucSource{recs: next}, dir, reg, bus, versions, nil)
	done := make(chan edge.ReloadResult)
	go func() {
		res, err := h.Handle(context.Background())
		if err != nil {
			t.Errorf("reload: %v", err)
		}
		done <- res
	}()
	<-closing
	for range 4 {
		v, release, err := reg.PickForTarget(domain.Anonymous(), "", "exec", "", "")
		if err != nil {
			t.Errorf("a run placed while the reload closes a's link: %v; want node c", err)
			continue
		}
		release()
		if v.ID != "c" {
			t.Errorf("a run placed while the reload closes a's link went to node %s, which the reload disconnects; want c", v.ID)
		}
	}
	if _, _, err := reg.PickForTarget(domain.Anonymous(), "b", "exec", "", ""); err == nil {
		t.Error("a run pinned to node b, whose token the reload changed, was placed on it while the reload closes the links")
	}
	close(release)
	if res := <-done; len(res.Disconnected) != 2 {
		t.Fatalf("reload = %+v; want a and b disconnected", res)
	}
	if _, ok := reg.Get("b"); ok {
		t.Fatal("b is still connected after the reload")
	}
}
