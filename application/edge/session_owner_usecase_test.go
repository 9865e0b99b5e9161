package edge_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

// ucAs is ctx carrying the principal of a key named name with scopes.
func ucAs(ctx context.Context, name string, scopes ...string) context.Context {
	return domain.WithPrincipal(ctx, domain.Principal{Name: name, Scopes: scopes})
}

// ucSent counts the runs and session ends the edge sent to the nodes.
func ucSent(e *ucEdge) (runs, terminates int) {
	for _, l := range e.links {
		s, _, term, _, _, _ := l.snapshot()
		runs += len(s)
		terminates += len(term)
	}
	return runs, terminates
}

// A session belongs to the key that first ran it: another key's run of it
// (its node named or not) and its end are refused with forbidden before
// anything reaches a node, so that key never sees the owner's history.
// The owner goes on; an admin key may use and end any session.
func TestSessionIsItsFirstKeys(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	ctx := context.Background()
	x, y := ucAs(ctx, "x", domain.ScopeRuns), ucAs(ctx, "y", domain.ScopeRuns, domain.ScopeRead)
	admin := ucAs(ctx, "ops", domain.ScopeAdmin)
	term := edge.NewTerminateSessionHandler(e.reg)

	rh, err := e.submit.Handle(x, edge.SubmitRun{Node: "b", Adapter: "chat", SessionID: "s1"})
	if err != nil {
		t.Fatalf("x's first turn: %v", err)
	}
	ucFinish(t, e, rh)
	runs, _ := ucSent(e)

	for _, node := range []string{"", "a", "b"} {
		_, err := e.submit.Handle(y, edge.SubmitRun{Node: node, Adapter: "chat", SessionID: "s1"})
		if !errors.Is(err, domain.ErrForbidden) {
			t.Fatalf("y's turn of x's session (node %q): %v, want forbidden", node, err)
		}
	}
	if err := term.Handle(y, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("y ending x's session: %v, want forbidden", err)
	}
	if r, tm := ucSent(e); r != runs || tm != 0 {
		t.Fatalf("refused calls reached the nodes: %d runs (want %d), %d session ends", r, runs, tm)
	}
	if n, ok := e.reg.SessionNode("chat", "s1"); !ok || n != "b" {
		t.Fatalf("x's session is bound to %q %v, want b", n, ok)
	}

	// The owner's next turn goes to its node; an admin's too.
	for _, c := range []context.Context{x, admin} {
		rh, err := e.submit.Handle(c, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
		if err != nil || rh.Node != "b" {
			t.Fatalf("%s's turn: %+v %v, want node b", domain.PrincipalFrom(c).Name, rh, err)
		}
		ucFinish(t, e, rh)
	}
	// The admin's turn did not make the session the admin's.
	if _, err := e.submit.Handle(y, edge.SubmitRun{Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("y after the admin's turn: %v, want forbidden", err)
	}
	rh, err = e.submit.Handle(x, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil {
		t.Fatalf("x after the admin's turn: %v", err)
	}
	ucFinish(t, e, rh)

	// The owner ends it; it stays x's, so y cannot start it over.
	if err := term.Handle(x, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"}); err != nil {
		t.Fatalf("x ending its session: %v", err)
	}
	if _, err := e.submit.Handle(y, edge.SubmitRun{Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("y after x ended it: %v, want forbidden", err)
	}
	if err := term.Handle(admin, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"}); err != nil {
		t.Fatalf("admin ending x's session: %v", err)
	}

	// y's own session is y's, turn after turn.
	for turn := range 2 {
		rh, err := e.submit.Handle(y, edge.SubmitRun{Adapter: "chat", SessionID: "s2"})
		if err != nil {
			t.Fatalf("y's own session, turn %d: %v", turn, err)
		}
		ucFinish(t, e, rh)
	}
	if _, err := e.submit.Handle(x, edge.SubmitRun{Adapter: "chat", SessionID: "s2"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("x's turn of y's session: %v, want forbidden", err)
	}
}

// A session an admin key started is the admin's: another key's run of it
// and its end are refused, as for any key's session (a key could otherwise
// read the admin's conversation through the model); the admin and other
// admins go on. An admin that only used another key's session took
// nothing from it (TestSessionIsItsFirstKeys).
func TestSessionAnAdminStartedIsTheAdmins(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	ctx := context.Background()
	x := ucAs(ctx, "x", domain.ScopeRuns, domain.ScopeRead)
	admin, other := ucAs(ctx, "ops", domain.ScopeAdmin), ucAs(ctx, "ops2", domain.ScopeAdmin)
	term := edge.NewTerminateSessionHandler(e.reg)

	rh, err := e.submit.Handle(admin, edge.SubmitRun{Node: "b", Adapter: "chat", SessionID: "ops-chat"})
	if err != nil {
		t.Fatalf("the admin's first turn: %v", err)
	}
	ucFinish(t, e, rh)
	for _, node := range []string{"", "a", "b"} {
		if _, err := e.submit.Handle(x, edge.SubmitRun{Node: node, Adapter: "chat", SessionID: "ops-chat"}); !errors.Is(err, domain.ErrForbidden) {
			t.Fatalf("x's turn of the admin's session (node %q): %v, want forbidden", node, err)
		}
	}
	if err := term.Handle(x, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "ops-chat"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("x ending the admin's session: %v, want forbidden", err)
	}
	for _, c := range []context.Context{admin, other} {
		rh, err := e.submit.Handle(c, edge.SubmitRun{Adapter: "chat", SessionID: "ops-chat"})
		if err != nil || rh.Node != "b" {
			t.Fatalf("%s's turn: %+v %v, want node b", domain.PrincipalFrom(c).Name, rh, err)
		}
		ucFinish(t, e, rh)
	}
	if owner := edge.SessionOwner(e.reg, "chat", "ops-chat"); owner != "ops" {
		t.Fatalf("owner %q, want ops (another admin's turn takes nothing)", owner)
	}
}

// An edge that does not remember a session (it restarted, or forgot it
// among more recent ones) learns its owner from the keys that ran its
// newest runs in the history: another key is refused, running or ending
// it, the node named or not; its owner and an admin go on, to its node.
func TestSessionOwnerRecalledFromHistory(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	hist := &ucSessionHistory{runs: []domain.RunRecord{
		{ID: "run_3", Node: "b", Adapter: "chat", SessionID: "s1", Key: "ops", Status: domain.RunSucceeded},
		{ID: "run_2", Node: "b", Adapter: "chat", SessionID: "s1", Key: "x", Status: domain.RunSucceeded},
		{ID: "run_1", Node: "b", Adapter: "chat", SessionID: "s1", Key: "x", Status: domain.RunSucceeded},
	}}
	e.submit.Sessions = hist
	term := edge.NewTerminateSessionHandler(e.reg)
	term.Sessions = hist
	ctx := context.Background()
	x, y := ucAs(ctx, "x", domain.ScopeRuns), ucAs(ctx, "y", domain.ScopeRuns)

	for _, node := range []string{"", "a"} {
		if _, err := e.submit.Handle(y, edge.SubmitRun{Node: node, Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
			t.Fatalf("y's turn of x's recalled session (node %q): %v, want forbidden", node, err)
		}
	}
	if err := term.Handle(y, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("y ending x's recalled session: %v, want forbidden", err)
	}
	if r, tm := ucSent(e); r != 0 || tm != 0 {
		t.Fatalf("refused calls reached the nodes: %d runs, %d session ends", r, tm)
	}
	rh, err := e.submit.Handle(x, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "b" {
		t.Fatalf("x's turn: %+v %v, want node b", rh, err)
	}
	ucFinish(t, e, rh)
	// Remembered now, as x's: y is refused without asking the history.
	asked := hist.count()
	if _, err := e.submit.Handle(y, edge.SubmitRun{Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("y after x's turn: %v, want forbidden", err)
	}
	if n := hist.count(); n != asked {
		t.Fatalf("history asked %d more times for a session remembered as x's", n-asked)
	}

	// An admin may run and end a session the history names another key
	// for; it stays that key's.
	e2 := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	e2.submit.Sessions = hist
	admin := ucAs(ctx, "ops", domain.ScopeAdmin)
	rh, err = e2.submit.Handle(admin, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "b" {
		t.Fatalf("admin's turn: %+v %v, want node b", rh, err)
	}
	ucFinish(t, e2, rh)
	if _, err := e2.submit.Handle(y, edge.SubmitRun{Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("y after the admin's turn: %v, want forbidden", err)
	}
	term2 := edge.NewTerminateSessionHandler(e2.reg)
	term2.Sessions = hist
	if err := term2.Handle(admin, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"}); err != nil {
		t.Fatalf("admin ending x's session: %v", err)
	}
	if err := term2.Handle(x, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"}); err != nil {
		t.Fatalf("x ending its session: %v", err)
	}
}

// Whose a session is when its owner cannot be looked up is unknown: a
// key's run of it is refused; an admin's (the anonymous caller's of an
// edge without keys) is only placed afresh.
func TestSessionOwnerLookupFailureRefusesKeys(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	e.submit.Sessions = &ucSessionHistory{err: errors.New("database is locked")}
	ctx := context.Background()
	if _, err := e.submit.Handle(ucAs(ctx, "x", domain.ScopeRuns), edge.SubmitRun{Adapter: "chat", SessionID: "s1"}); ucCode(err) != domain.CodeHistoryUnavailable || strings.Contains(err.Error(), "locked") {
		t.Fatalf("a key's run of a session whose owner is unknown: %v, want history_unavailable (503, retry) without the database's error", err)
	}
	if r, _ := ucSent(e); r != 0 {
		t.Fatalf("%d runs reached the nodes", r)
	}
	rh, err := e.submit.Handle(ucAs(ctx, "ops", domain.ScopeAdmin), edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	ucFinish(t, e, rh)
	// A run without a session needs no owner.
	rh, err = e.submit.Handle(ucAs(ctx, "x", domain.ScopeRuns), edge.SubmitRun{Adapter: "chat"})
	if err != nil {
		t.Fatalf("x's run without a session: %v", err)
	}
	ucFinish(t, e, rh)
}

// On an edge without keys every caller is the anonymous admin: sessions
// are shared as before, and the history is asked only for a session's
// node, as before.
func TestSessionsOfAnEdgeWithoutKeysAreShared(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	hist := &ucSessionHistory{runs: []domain.RunRecord{
		{ID: "run_1", Node: "b", Adapter: "chat", SessionID: "s1", Key: domain.AnonymousName, Status: domain.RunSucceeded},
	}}
	e.submit.Sessions = hist
	term := edge.NewTerminateSessionHandler(e.reg)
	term.Sessions = hist
	ctx := context.Background()
	for turn := range 2 {
		rh, err := e.submit.Handle(ctx, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
		if err != nil || rh.Node != "b" {
			t.Fatalf("turn %d: %+v %v, want node b", turn, rh, err)
		}
		ucFinish(t, e, rh)
	}
	rh, err := e.submit.Handle(ctx, edge.SubmitRun{Node: "a", Adapter: "chat", SessionID: "s9"})
	if err != nil {
		t.Fatalf("named node: %v", err)
	}
	ucFinish(t, e, rh)
	if err := term.Handle(ctx, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"}); err != nil {
		t.Fatalf("end: %v", err)
	}
	if n := hist.count(); n != 1 {
		t.Fatalf("history asked %d times, want once (s1's node)", n)
	}
}

// The owner recalled from the history is the key of the session's runs a
// node took, leaving out the anonymous caller of an edge that had no keys
// then (every session of an edge that later got keys would be refused to
// every key), and admin keys unless no other key ran it: an admin owns a
// session it started, as in memory, but one it used is still its key's.
func TestSessionOwnerFromHistory(t *testing.T) {
	ctx := context.Background()
	y := ucAs(ctx, "y", domain.ScopeRuns)
	rec := func(key string, st domain.RunStatus, code string) domain.RunRecord {
		return domain.RunRecord{ID: "run_" + key, Node: "b", Adapter: "chat", SessionID: "s1", Key: key, Status: st, ErrorCode: code}
	}
	for _, tc := range []struct {
		name    string
		runs    []domain.RunRecord
		refused bool
	}{
		{"admin's session", []domain.RunRecord{rec("ops", domain.RunSucceeded, "")}, true},
		{"admin's session, refused to y", []domain.RunRecord{rec("y", domain.RunFailed, domain.CodeAtCapacity), rec("ops", domain.RunSucceeded, "")}, true},
		{"y's session an admin went on", []domain.RunRecord{rec("ops", domain.RunSucceeded, ""), rec("y", domain.RunSucceeded, "")}, false},
		{"keyless edge's session", []domain.RunRecord{rec(domain.AnonymousName, domain.RunSucceeded, "")}, false},
		{"x's session an admin went on", []domain.RunRecord{rec("ops", domain.RunSucceeded, ""), rec("x", domain.RunSucceeded, "")}, true},
		{"x's session y was refused on", []domain.RunRecord{rec("y", domain.RunFailed, domain.CodeAtCapacity), rec("x", domain.RunSucceeded, "")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
			e.submit.Sessions = &ucSessionHistory{runs: tc.runs}
			e.submit.AdminKey = func(name string) bool { return name == "ops" }
			rh, err := e.submit.Handle(y, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
			if tc.refused {
				if !errors.Is(err, domain.ErrForbidden) {
					t.Fatalf("y's turn: %v, want forbidden", err)
				}
				return
			}
			if err != nil || rh.Node != "b" {
				t.Fatalf("y's turn: %v on %v, want it on b, the session's node", err, rh)
			}
			ucFinish(t, e, rh)
		})
	}
}

// A run that is refused (a node it may not see, no node to take it, the
// node's own refusal) claims no session: a key could otherwise take a
// session id it never ran and lock its real user out. A claim given back
// also leaves the session's node to be recalled from the history.
func TestRefusedRunClaimsNoSession(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	hist := &ucSessionHistory{}
	e.submit.Sessions = hist
	ctx := context.Background()
	x, y := ucAs(ctx, "x", domain.ScopeRuns), ucAs(ctx, "y", domain.ScopeRuns)

	if _, err := e.submit.Handle(y, edge.SubmitRun{Node: "nope", Adapter: "chat", SessionID: "s1"}); ucCode(err) != domain.CodeNodeNotFound {
		t.Fatalf("y's run on no node: %v, want node_not_found", err)
	}
	if _, err := e.submit.Handle(y, edge.SubmitRun{Adapter: "other", SessionID: "s1"}); err == nil {
		t.Fatal("y's run of an adapter no node offers was admitted")
	}
	e.links["a"].refuse = &domain.ErrorInfo{Code: domain.CodeAtCapacity, Message: "full"}
	if _, err := e.submit.Handle(y, edge.SubmitRun{Node: "a", Adapter: "chat", SessionID: "s1"}); ucCode(err) != domain.CodeAtCapacity {
		t.Fatalf("y's run refused by a: %v, want at_capacity", err)
	}
	e.links["a"].refuse = nil
	// Meanwhile another edge sharing the history ran x's session on b.
	hist.mu.Lock()
	hist.runs = []domain.RunRecord{{ID: "run_x", Node: "b", Adapter: "chat", SessionID: "s1", Key: "x", Status: domain.RunSucceeded}}
	hist.mu.Unlock()
	rh, err := e.submit.Handle(x, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "b" {
		t.Fatalf("x's turn: %v on %v, want it admitted on b, its session's node", err, rh)
	}
	ucFinish(t, e, rh)
	if _, err := e.submit.Handle(y, edge.SubmitRun{Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("y's turn after x's: %v, want forbidden", err)
	}
}

// An admin that used a key's session for more turns than the recall reads
// (8) does not take it over after a restart: a window of admin runs only
// makes admins the owners when it holds the session's first run. Between
// admins, the one the history names keeps it.
func TestAdminTurnsDoNotTakeAKeysSessionOnRecall(t *testing.T) {
	ctx := context.Background()
	var runs []domain.RunRecord
	for i := range 8 {
		runs = append(runs, domain.RunRecord{ID: fmt.Sprintf("run_ops%d", i), Node: "b", Adapter: "chat", SessionID: "s1", Key: "ops", Status: domain.RunSucceeded})
	}
	runs = append(runs, domain.RunRecord{ID: "run_y", Node: "b", Adapter: "chat", SessionID: "s1", Key: "y", Status: domain.RunSucceeded})
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	e.submit.Sessions = &ucSessionHistory{runs: runs}
	e.submit.AdminKey = func(name string) bool { return name == "ops" || name == "ops2" }
	rh, err := e.submit.Handle(ucAs(ctx, "ops", domain.ScopeAdmin), edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil {
		t.Fatalf("the admin's turn: %v", err)
	}
	ucFinish(t, e, rh)
	if owner := edge.SessionOwner(e.reg, "chat", "s1"); owner != "" {
		t.Fatalf("owner %q after the admin's turn, want none (y's session, its first run beyond the recall)", owner)
	}
	rh, err = e.submit.Handle(ucAs(ctx, "y", domain.ScopeRuns), edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil {
		t.Fatalf("y's turn of its own session: %v", err)
	}
	ucFinish(t, e, rh)

	// A session ops started (all of it in the window): another admin uses
	// it but does not become its owner.
	e2 := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	e2.submit.Sessions = &ucSessionHistory{runs: runs[:3]}
	e2.submit.AdminKey = e.submit.AdminKey
	rh, err = e2.submit.Handle(ucAs(ctx, "ops2", domain.ScopeAdmin), edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil {
		t.Fatalf("ops2's turn: %v", err)
	}
	ucFinish(t, e2, rh)
	if owner := edge.SessionOwner(e2.reg, "chat", "s1"); owner != "" {
		t.Fatalf("owner %q after ops2's turn of ops's session, want none claimed by ops2", owner)
	}
	if _, err := e2.submit.Handle(ucAs(ctx, "y", domain.ScopeRuns), edge.SubmitRun{Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("y's turn of ops's session: %v, want forbidden", err)
	}
}

// ucRecallCase is an edge that does not remember session s1 of chat, whose
// history holds runs; y is a key that never ran it.
func ucRecallCase(t *testing.T, runs []domain.RunRecord) (*ucEdge, *edge.TerminateSessionHandler, *ucSessionHistory) {
	t.Helper()
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	hist := &ucSessionHistory{runs: runs}
	e.submit.Sessions = hist
	e.submit.AdminKey = func(name string) bool { return strings.HasPrefix(name, "ops") }
	term := edge.NewTerminateSessionHandler(e.reg)
	term.Sessions, term.AdminKey = hist, e.submit.AdminKey
	return e, term, hist
}

// ucRefusedEverywhere checks that key y may neither end session s1 nor
// run it (its node named or not), and that nothing reached a node.
func ucRefusedEverywhere(t *testing.T, e *ucEdge, term *edge.TerminateSessionHandler, y context.Context) {
	t.Helper()
	if err := term.Handle(y, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
		t.Fatalf("y ending x's session: %v, want forbidden", err)
	}
	for _, node := range []string{"", "a", "b"} {
		if _, err := e.submit.Handle(y, edge.SubmitRun{Node: node, Adapter: "chat", SessionID: "s1"}); !errors.Is(err, domain.ErrForbidden) {
			t.Fatalf("y's turn of x's session (node %q): %v, want forbidden", node, err)
		}
	}
	if r, tm := ucSent(e); r != 0 || tm != 0 {
		t.Fatalf("refused calls reached the nodes: %d runs, %d session ends", r, tm)
	}
}

// The owner's turns the nodes refused (x retrying on at_capacity more
// times than the recall reads) are in the history as runs of the session:
// after a restart they neither hide its owner — another key would get in,
// read the conversation through the model and take the session — nor its
// node, where the owner's next turn still goes.
func TestRefusedRunsHideNeitherOwnerNorNodeOnRecall(t *testing.T) {
	ucNoLeaks(t)
	var runs []domain.RunRecord
	for i := range 2 * 8 {
		runs = append(runs, domain.RunRecord{ID: fmt.Sprintf("run_r%02d", 20-i), Node: "a", Adapter: "chat", SessionID: "s1", Key: "x",
			Status: domain.RunFailed, ErrorCode: domain.CodeAtCapacity})
	}
	runs = append(runs, domain.RunRecord{ID: "run_1", Node: "b", Adapter: "chat", SessionID: "s1", Key: "x", Status: domain.RunSucceeded})
	e, term, _ := ucRecallCase(t, runs)
	ctx := context.Background()
	ucRefusedEverywhere(t, e, term, ucAs(ctx, "y", domain.ScopeRuns))
	rh, err := e.submit.Handle(ucAs(ctx, "x", domain.ScopeRuns), edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "b" {
		t.Fatalf("x's turn: %v on %v, want it on b, where its history is (a wins a tie)", err, rh)
	}
	ucFinish(t, e, rh)
	if owner := edge.SessionOwner(e.reg, "chat", "s1"); owner != "x" {
		t.Fatalf("owner %q, want x", owner)
	}
}

// An admin's turns of a key's session, more than the recall reads and by
// several admins, do not leave it to any key after a restart: the owner is
// looked for past them. The admins go on without taking it.
func TestAdminTurnsHideNoOwnerOnRecall(t *testing.T) {
	ucNoLeaks(t)
	var runs []domain.RunRecord
	for i, key := range []string{"ops", "ops2", "ops3"} {
		for j := range 9 {
			runs = append(runs, domain.RunRecord{ID: fmt.Sprintf("run_%d%d", 9-i, 9-j), Node: "b", Adapter: "chat", SessionID: "s1", Key: key, Status: domain.RunSucceeded})
		}
		runs = append(runs, domain.RunRecord{ID: fmt.Sprintf("run_%d0", 9-i), Node: "a", Adapter: "chat", SessionID: "s1", Key: "z",
			Status: domain.RunFailed, ErrorCode: domain.CodeNoNodeAvailable})
	}
	runs = append(runs, domain.RunRecord{ID: "run_1", Node: "b", Adapter: "chat", SessionID: "s1", Key: "x", Status: domain.RunSucceeded})
	e, term, hist := ucRecallCase(t, runs)
	ctx := context.Background()
	for _, k := range []string{"y", "z"} {
		ucRefusedEverywhere(t, e, term, ucAs(ctx, k, domain.ScopeRuns))
	}
	if n := hist.count(); n != 8*4 {
		t.Fatalf("history asked %d times for 8 refusals, want 4 queries each (one, then one past each admin key)", n)
	}
	rh, err := e.submit.Handle(ucAs(ctx, "ops4", domain.ScopeAdmin), edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "b" {
		t.Fatalf("an admin's turn: %v on %v, want it on b", err, rh)
	}
	ucFinish(t, e, rh)
	if owner := edge.SessionOwner(e.reg, "chat", "s1"); owner != "" {
		t.Fatalf("owner %q after an admin's turn of x's session, want none", owner)
	}
	rh, err = e.submit.Handle(ucAs(ctx, "x", domain.ScopeRuns), edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "b" {
		t.Fatalf("x's turn: %v on %v, want it on b", err, rh)
	}
	ucFinish(t, e, rh)

	// Admins alone ran it: they own it, another key is refused.
	e2, term2, _ := ucRecallCase(t, runs[:len(runs)-1])
	ucRefusedEverywhere(t, e2, term2, ucAs(ctx, "x", domain.ScopeRuns))
	rh, err = e2.submit.Handle(ucAs(ctx, "ops3", domain.ScopeAdmin), edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil {
		t.Fatalf("ops3's turn: %v", err)
	}
	ucFinish(t, e2, rh)
	if owner := edge.SessionOwner(e2.reg, "chat", "s1"); owner != "ops3" {
		t.Fatalf("owner %q, want ops3 (among the admins that ran it alone)", owner)
	}
}

// A history that does not honour the query's key filter makes the owner
// unknown (the recall would otherwise never end): a key is refused as when
// the history cannot be read.
func TestRecallOwnerUnknownRefusesKeys(t *testing.T) {
	ucNoLeaks(t)
	var runs []domain.RunRecord
	for i := range 9 {
		runs = append(runs, domain.RunRecord{ID: fmt.Sprintf("run_%d", 9-i), Node: "b", Adapter: "chat", SessionID: "s1", Key: "ops", Status: domain.RunSucceeded})
	}
	e, _, _ := ucRecallCase(t, runs)
	e.submit.Sessions = ucIgnoringHistory{runs}
	if _, err := e.submit.Handle(ucAs(context.Background(), "y", domain.ScopeRuns), edge.SubmitRun{Adapter: "chat", SessionID: "s1"}); ucCode(err) != domain.CodeHistoryUnavailable {
		t.Fatalf("y's turn: %v, want history_unavailable", err)
	}
}

// ucIgnoringHistory answers every query with the first 8 of its runs and
// more to come.
type ucIgnoringHistory struct{ runs []domain.RunRecord }

func (h ucIgnoringHistory) GetRun(context.Context, string) (domain.RunRecord, error) {
	return domain.RunRecord{}, domain.ErrRunNotFound
}

func (h ucIgnoringHistory) ListRuns(context.Context, domain.RunQuery) (domain.RunPage, error) {
	return domain.RunPage{Runs: h.runs[:8], Next: "more"}, nil
}

func (h ucIgnoringHistory) Usage(context.Context, domain.UsageQuery) ([]domain.UsageTotal, error) {
	return nil, nil
}

// An admin key limited to some nodes may use another key's session, but
// the session's node is one it may not see: its turn is placed on a node
// it sees, as a new session's would be. That turn used to bind the
// session to that node, so the owner's next turn went there too, away
// from the node holding its conversation (and into the admin's turn).
func TestANodeLimitedAdminDoesNotMoveAnotherKeysSession(t *testing.T) {
	ucNoLeaks(t)
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	ctx := context.Background()
	x := ucAs(ctx, "x", domain.ScopeRuns)
	limAdmin := domain.WithPrincipal(ctx, domain.Principal{Name: "opa", Scopes: []string{domain.ScopeAdmin}, Nodes: []string{"a"}})

	rh, err := e.submit.Handle(x, edge.SubmitRun{Node: "b", Adapter: "chat", SessionID: "s1"})
	if err != nil {
		t.Fatalf("x's first turn: %v", err)
	}
	ucFinish(t, e, rh)

	rh, err = e.submit.Handle(limAdmin, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "a" {
		t.Fatalf("the limited admin's turn: %+v %v, want node a (b is not its)", rh, err)
	}
	ucFinish(t, e, rh)

	if n, ok := e.reg.SessionNode("chat", "s1"); !ok || n != "b" {
		t.Fatalf("after the limited admin's turn x's session is bound to %q %v, want b", n, ok)
	}
	rh, err = e.submit.Handle(x, edge.SubmitRun{Adapter: "chat", SessionID: "s1"})
	if err != nil || rh.Node != "b" {
		t.Fatalf("x's next turn: %+v %v, want node b, where its conversation is", rh, err)
	}
	ucFinish(t, e, rh)
}
