package edge

import "testing"

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
