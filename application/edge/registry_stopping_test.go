package edge_test

import (
	"testing"

	"iop/application/edge"
)

// MarkStopping marks the node draining and stopping together, only for
// the link that serves it, and reports a new drain mark once; a node a
// reload already marked draining is still marked stopping by its own word.
func TestRegistryMarkStoppingImpliesDraining(t *testing.T) {
	reg := edge.NewRegistry()
	a, b, stale := &ucLink{id: "a"}, &ucLink{id: "b"}, &ucLink{id: "stale"}
	for _, n := range []*edge.LiveNode{{ID: "a", Link: a}, {ID: "b", Link: b}} {
		if err := reg.Admit(n); err != nil {
			t.Fatal(err)
		}
	}
	draining := func(id string) bool {
		v, ok := reg.Get(id)
		return ok && v.Draining
	}

	if reg.MarkStopping("a", stale) || reg.Stopping("a", stale) || reg.Stopping("a", a) || draining("a") {
		t.Fatal("a link that does not serve the node marked it")
	}
	if reg.MarkStopping("gone", a) {
		t.Fatal("MarkStopping of an unknown node = true")
	}
	if !reg.MarkStopping("a", a) || !reg.Stopping("a", a) || !draining("a") {
		t.Fatalf("MarkStopping(a): stopping %v, draining %v; want both", reg.Stopping("a", a), draining("a"))
	}
	if reg.MarkStopping("a", a) || reg.MarkDraining("a", a) {
		t.Fatal("a second mark of a was reported new")
	}

	// A reload's drain mark first: the node's word later adds stopping,
	// and the drain mark is not new.
	if !reg.MarkDraining("b", b) || reg.Stopping("b", b) || !draining("b") {
		t.Fatal("MarkDraining(b) did not mark it draining only")
	}
	if reg.MarkStopping("b", b) || !reg.Stopping("b", b) || !draining("b") {
		t.Fatal("MarkStopping of a draining node did not mark it stopping, or said the drain mark was new")
	}
}
