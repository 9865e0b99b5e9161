package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
)

// AgentSessionStoreContract checks the behaviour every
// ports.AgentSessionStore must have. newStore must return an empty store that
// the test may use exclusively.
func AgentSessionStoreContract(t *testing.T, newStore func(t *testing.T) ports.AgentSessionStore) {
	t.Run("get unknown is not found without error", func(t *testing.T) {
		id, ok, err := newStore(t).GetAgentSession(context.Background(), "codex", "nope")
		if err != nil || ok || id != (domain.AgentSession{}) {
			t.Fatalf("GetAgentSession(unknown) = %+v, %v, %v; want zero, false, nil", id, ok, err)
		}
	})

	t.Run("put get overwrite delete", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		mustPut(t, s, "codex", "t1", "s1", "thread-1")
		mustPut(t, s, "claude-code", "t1", "s1", "other-adapter")
		checkAgent(t, s, "codex", "s1", "thread-1", true)
		checkAgent(t, s, "claude-code", "s1", "other-adapter", true)

		mustPut(t, s, "codex", "t2", "s1", "thread-2")
		checkAgent(t, s, "codex", "s1", "thread-2", true)
		list, err := s.ListAgentSessions(ctx, "codex", domain.SessionQuery{})
		if err != nil || len(list) != 1 || list[0].Target != "t2" || list[0].AgentSessionID != "thread-2" {
			t.Fatalf("ListAgentSessions after overwrite = %+v, %v; want one with target t2, thread-2", list, err)
		}

		if found, err := s.DeleteAgentSession(ctx, "codex", "s1"); err != nil || !found {
			t.Fatalf("DeleteAgentSession = %v, %v; want found", found, err)
		}
		// Unknown, already deleted, or another adapter's: no error, not found.
		for _, k := range [][2]string{{"codex", "unknown"}, {"codex", "s1"}, {"gemini", "s1"}} {
			if found, err := s.DeleteAgentSession(ctx, k[0], k[1]); err != nil || found {
				t.Fatalf("DeleteAgentSession(%s/%s) = %v, %v; want not found, no error", k[0], k[1], found, err)
			}
		}
		checkAgent(t, s, "codex", "s1", "", false)
		checkAgent(t, s, "claude-code", "s1", "other-adapter", true)
	})

	t.Run("turns and totals", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		if err := s.EndAgentTurn(ctx, "codex", "unknown", domain.AgentTotals{Input: 1}); err != nil {
			t.Fatalf("EndAgentTurn(unknown): %v", err)
		}
		if _, ok, _ := s.GetAgentSession(ctx, "codex", "unknown"); ok {
			t.Fatal("EndAgentTurn created a session")
		}
		mustPut(t, s, "codex", "t", "s1", "thread-1")
		mustPut(t, s, "codex", "t", "s2", "thread-2")
		for i, tot := range []domain.AgentTotals{{Input: 120, Cached: 20, Output: 17}, {Input: 240, Cached: 40, Output: 34}} {
			if err := s.EndAgentTurn(ctx, "codex", "s1", tot); err != nil {
				t.Fatalf("EndAgentTurn: %v", err)
			}
			got, ok, err := s.GetAgentSession(ctx, "codex", "s1")
			if err != nil || !ok || got != (domain.AgentSession{AgentID: "thread-1", Turns: i + 1, Totals: tot}) {
				t.Fatalf("after turn %d: %+v, %v, %v", i+1, got, ok, err)
			}
		}
		// The same id again (a resumed run) keeps everything.
		mustPut(t, s, "codex", "t", "s1", "thread-1")
		got, _, _ := s.GetAgentSession(ctx, "codex", "s1")
		if got.Turns != 2 || got.Totals.Input != 240 {
			t.Fatalf("re-put of the same id changed the session: %+v", got)
		}
		list, _ := s.ListAgentSessions(ctx, "codex", domain.SessionQuery{})
		slices.SortFunc(list, byAdapterAndID)
		if len(list) != 2 || list[0].Turns != 2 || list[1].Turns != 0 {
			t.Fatalf("ListAgentSessions turns = %+v", list)
		}
		// A new agent id (the CLI started over) restarts the totals, not the count.
		mustPut(t, s, "codex", "t", "s1", "thread-9")
		got, _, _ = s.GetAgentSession(ctx, "codex", "s1")
		if got != (domain.AgentSession{AgentID: "thread-9", Turns: 2}) {
			t.Fatalf("after a new agent id: %+v", got)
		}
	})

	t.Run("list", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		from := time.Now()
		mustPut(t, s, "codex", "t", "s2", "c2")
		mustPut(t, s, "codex", "t", "s1", "c1")
		mustPut(t, s, "claude-code", "sonnet", "s9", "cc9")
		to := time.Now()

		all := []domain.SessionInfo{
			{Adapter: "claude-code", Target: "sonnet", SessionID: "s9", AgentSessionID: "cc9"},
			{Adapter: "codex", Target: "t", SessionID: "s1", AgentSessionID: "c1"},
			{Adapter: "codex", Target: "t", SessionID: "s2", AgentSessionID: "c2"},
		}
		cases := []struct {
			adapter string
			want    []domain.SessionInfo
		}{
			{"", all},
			{"claude-code", all[:1]},
			{"codex", all[1:]},
			{"none", nil},
		}
		for _, tc := range cases {
			got, err := s.ListAgentSessions(ctx, tc.adapter, domain.SessionQuery{})
			if err != nil {
				t.Fatalf("ListAgentSessions(%q): %v", tc.adapter, err)
			}
			checkListingOrder(t, got)
			for i := range got {
				checkRecent(t, "LastUsed", got[i].LastUsed, from, to)
				got[i].LastUsed = time.Time{}
			}
			slices.SortFunc(got, byAdapterAndID)
			if !slices.Equal(got, tc.want) {
				t.Errorf("ListAgentSessions(%q) =\n%+v\nwant\n%+v", tc.adapter, got, tc.want)
			}
		}
		// A turn makes its session the newest.
		if err := s.EndAgentTurn(ctx, "codex", "s2", domain.AgentTotals{Input: 1}); err != nil {
			t.Fatal(err)
		}
		got, err := s.ListAgentSessions(ctx, "", domain.SessionQuery{})
		if err != nil || len(got) != 3 || got[0].SessionID != "s2" || got[0].Turns != 1 || got[0].LastUsed.Before(got[1].LastUsed) {
			t.Fatalf("ListAgentSessions after a turn of codex/s2 = %+v, %v; want it first", got, err)
		}
	})

	t.Run("list in pages", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		for i := range 23 {
			mustPut(t, s, []string{"codex", "gemini"}[i%2], "t", fmt.Sprintf("s%02d", i), fmt.Sprint("agent-", i))
		}
		checkPages(t, func(adapter string, q domain.SessionQuery) ([]domain.SessionInfo, error) {
			return s.ListAgentSessions(ctx, adapter, q)
		}, map[string]int{"": 23, "codex": 12, "gemini": 11, "none": 0})
	})
}

func mustPut(t *testing.T, s ports.AgentSessionStore, adapter, target, session, agentID string) {
	t.Helper()
	if err := s.PutAgentSession(context.Background(), adapter, target, session, agentID); err != nil {
		t.Fatalf("PutAgentSession %s/%s: %v", adapter, session, err)
	}
}

func checkAgent(t *testing.T, s ports.AgentSessionStore, adapter, session, wantID string, wantOK bool) {
	t.Helper()
	got, ok, err := s.GetAgentSession(context.Background(), adapter, session)
	id := got.AgentID
	if err != nil || ok != wantOK || id != wantID {
		t.Fatalf("GetAgentSession %s/%s = %q, %v, %v; want %q, %v, nil", adapter, session, id, ok, err, wantID, wantOK)
	}
}
