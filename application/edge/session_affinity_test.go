package edge

import (
	"testing"

	"iop/domain"
)

func TestSessionNodesIsBoundedLRU(t *testing.T) {
	s := newSessionNodes(2)
	s.put(sessionKey{"chat", "s1"}, "a")
	s.put(sessionKey{"chat", "s2"}, "b")
	s.get(sessionKey{"chat", "s1"}) // s2 is now the least recently used
	s.put(sessionKey{"chat", "s3"}, "a")
	if s.len() != 2 {
		t.Fatalf("%d entries, want at most 2", s.len())
	}
	if _, ok := s.get(sessionKey{"chat", "s2"}); ok {
		t.Fatal("the least recently used entry was kept")
	}
	if n, ok := s.get(sessionKey{"chat", "s1"}); !ok || n != "a" {
		t.Fatalf("s1 = %q %v, want a", n, ok)
	}

	s.drop(sessionKey{"chat", "s1"}, "b") // bound to a, not b: kept
	if _, ok := s.get(sessionKey{"chat", "s1"}); !ok {
		t.Fatal("drop for another node forgot the session")
	}
	s.dropNode("a")
	// Both stay known, bound to no node: not recalled from the history.
	for _, k := range []sessionKey{{"chat", "s1"}, {"chat", "s3"}} {
		if n, ok := s.get(k); !ok || n != "" {
			t.Fatalf("%v after dropping node a = %q %v, want known and unbound", k, n, ok)
		}
	}
	if s.len() != 2 {
		t.Fatalf("%d entries, want 2", s.len())
	}
}

func TestRegistryForgetsSessionsOfANodeLeavingTheConfig(t *testing.T) {
	r := NewRegistry()
	r.RememberSession("chat", "s1", "a")
	r.RememberSession("chat", "s2", "b")
	r.ForgetNodeSessions("a")
	if _, ok := r.SessionNode("chat", "s1"); ok {
		t.Fatal("s1 still bound to a")
	}
	if n, ok := r.SessionNode("chat", "s2"); !ok || n != "b" {
		t.Fatalf("s2 = %q %v, want b", n, ok)
	}
}

// Two keys claiming one new session at once: exactly one gets it, and an
// admin's run before either claimed nothing.
func TestClaimSessionFirstKeyWins(t *testing.T) {
	r := NewRegistry()
	r.RememberSession("chat", "s1", "a") // an admin's run: no owner
	if owner, known := r.sessionOwner("chat", "s1"); owner != "" || !known {
		t.Fatalf("after an admin's run: owner %q known %v", owner, known)
	}
	won := make(chan bool, 2)
	for _, k := range []string{"x", "y"} {
		go func() { won <- r.claimSession("chat", "s1", k) }()
	}
	if a, b := <-won, <-won; a == b {
		t.Fatalf("claims answered %v and %v, want exactly one winner", a, b)
	}
	owner, _ := r.sessionOwner("chat", "s1")
	if !r.claimSession("chat", "s1", owner) {
		t.Fatal("the owner's own claim was refused")
	}
	if n, ok := r.SessionNode("chat", "s1"); !ok || n != "a" {
		t.Fatalf("claiming moved the binding: %q %v", n, ok)
	}
}

// Two turns of one key's new session claim it at once; the one refused
// gives its claim back, and the one admitted still holds the session: the
// refused turn's give-back used to leave it owned by no key, for another
// key to take.
func TestClaimsOfOneKeyAreCounted(t *testing.T) {
	r := NewRegistry()
	for turn := 1; turn <= 2; turn++ {
		if !r.claimSession("chat", "s", "x") {
			t.Fatalf("x's claim for turn %d was not granted", turn)
		}
	}
	r.unclaimSession("chat", "s", "x") // turn 2 refused
	if owner, _ := r.sessionOwner("chat", "s"); owner != "x" {
		t.Fatalf("owner after one give-back = %q, want x (turn 1 still waits)", owner)
	}
	r.admitSession("chat", "s", "nodeA", domain.Principal{Name: "x"}) // turn 1 admitted
	if owner, _ := r.sessionOwner("chat", "s"); owner != "x" || r.claimSession("chat", "s", "y") {
		t.Fatalf("owner = %q, and y could claim it; want x's", owner)
	}
	// Both refused: nothing is left claimed.
	r.claimSession("chat", "t", "x")
	r.claimSession("chat", "t", "x")
	r.unclaimSession("chat", "t", "x")
	r.unclaimSession("chat", "t", "x")
	if owner, known := r.sessionOwner("chat", "t"); owner != "" || known {
		t.Fatalf("t after two give-backs: owner %q, remembered %v; want forgotten", owner, known)
	}
}

// A key's admitted run keeps its session although the edge forgot the
// key's claim meanwhile and another key claimed it: the admitted run wins,
// and the other key's give-back cannot undo that.
func TestAdmittedRunWinsOverATentativeClaim(t *testing.T) {
	r := NewRegistry()
	r.sessions = newSessionNodes(1)
	r.claimSession("chat", "s", "x")
	r.claimSession("chat", "other", "z") // x's claim is forgotten
	r.claimSession("chat", "s", "y")
	r.admitSession("chat", "s", "nodeA", domain.Principal{Name: "x"})
	r.unclaimSession("chat", "s", "y")
	if owner, _ := r.sessionOwner("chat", "s"); owner != "x" {
		t.Fatalf("owner = %q, want x, whose run was admitted", owner)
	}
}
