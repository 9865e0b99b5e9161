package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
)

// ChatStoreContract checks the behaviour every ports.ChatSessionStore must
// have. newStore must return an empty store that the test may use exclusively.
func ChatStoreContract(t *testing.T, newStore func(t *testing.T) ports.ChatSessionStore) {
	user := func(s string) domain.ChatMessage { return domain.ChatMessage{Role: "user", Content: s} }
	asst := func(s string) domain.ChatMessage { return domain.ChatMessage{Role: "assistant", Content: s} }
	reply := func(s string) domain.ChatMessage {
		return domain.ChatMessage{Role: "assistant", Content: s, Reply: true}
	}

	t.Run("unknown session has no messages", func(t *testing.T) {
		msgs, err := newStore(t).LoadChat(context.Background(), "ollama", "nope")
		if err != nil || len(msgs) != 0 {
			t.Fatalf("LoadChat(unknown) = %v, %v; want none", msgs, err)
		}
	})

	t.Run("appends keep order and sessions stay apart", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		first := []domain.ChatMessage{{Role: "system", Content: ""}, user("it's \"quoted\"\n"), asst("héllo ✓")}
		second := []domain.ChatMessage{user("again"), asst("again!"),
			{Role: "tool", Content: "12:00", Raw: `{"role":"tool","tool_call_id":"call_1","content":"12:00"}`}}
		mustAppend(t, s, "ollama", "m", "s1", first)
		mustAppend(t, s, "ollama", "m", "s2", []domain.ChatMessage{user("other session")})
		mustAppend(t, s, "openai", "m", "s1", []domain.ChatMessage{user("other adapter")})
		mustAppend(t, s, "ollama", "m", "s1", second)

		cases := []struct {
			adapter, session string
			want             []domain.ChatMessage
		}{
			{"ollama", "s1", append(slices.Clone(first), second...)},
			{"ollama", "s2", []domain.ChatMessage{user("other session")}},
			{"openai", "s1", []domain.ChatMessage{user("other adapter")}},
		}
		for _, tc := range cases {
			got, err := s.LoadChat(ctx, tc.adapter, tc.session)
			if err != nil {
				t.Fatalf("LoadChat %s/%s: %v", tc.adapter, tc.session, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("LoadChat %s/%s =\n%+v\nwant\n%+v", tc.adapter, tc.session, got, tc.want)
			}
		}
	})

	t.Run("loaded messages are copies", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		in := []domain.ChatMessage{user("a")}
		mustAppend(t, s, "ollama", "m", "s1", in)
		in[0].Content = "changed by caller"
		got, _ := s.LoadChat(ctx, "ollama", "s1")
		got[0].Content = "changed by reader"
		got, _ = s.LoadChat(ctx, "ollama", "s1")
		if !slices.Equal(got, []domain.ChatMessage{user("a")}) {
			t.Fatalf("LoadChat after callers' edits = %+v", got)
		}
	})

	t.Run("appending nothing creates nothing", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		mustAppend(t, s, "ollama", "m", "s1", nil)
		list, err := s.ListChats(ctx, "")
		if err != nil || len(list) != 0 {
			t.Fatalf("ListChats = %v, %v; want none", list, err)
		}
	})

	t.Run("delete", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		mustAppend(t, s, "ollama", "m", "s1", []domain.ChatMessage{user("a"), asst("b")})
		mustAppend(t, s, "ollama", "m", "s2", []domain.ChatMessage{user("c")})
		if err := s.DeleteChat(ctx, "ollama", "s1"); err != nil {
			t.Fatalf("DeleteChat: %v", err)
		}
		if err := s.DeleteChat(ctx, "ollama", "unknown"); err != nil {
			t.Fatalf("DeleteChat(unknown): %v", err)
		}
		if msgs, err := s.LoadChat(ctx, "ollama", "s1"); err != nil || len(msgs) != 0 {
			t.Fatalf("LoadChat(deleted) = %v, %v; want none", msgs, err)
		}
		if msgs, _ := s.LoadChat(ctx, "ollama", "s2"); len(msgs) != 1 {
			t.Fatalf("LoadChat(kept) = %v, want 1 message", msgs)
		}
		list, err := s.ListChats(ctx, "")
		if err != nil || len(list) != 1 || list[0].SessionID != "s2" {
			t.Fatalf("ListChats after delete = %+v, %v; want only s2", list, err)
		}
		// A deleted session starts again from scratch.
		mustAppend(t, s, "ollama", "m", "s1", []domain.ChatMessage{user("fresh")})
		if msgs, _ := s.LoadChat(ctx, "ollama", "s1"); !slices.Equal(msgs, []domain.ChatMessage{user("fresh")}) {
			t.Fatalf("LoadChat(recreated) = %+v", msgs)
		}
	})

	t.Run("list", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		from := time.Now()
		mustAppend(t, s, "openai", "gpt", "s1", []domain.ChatMessage{user("q")})
		mustAppend(t, s, "ollama", "m1", "s2", []domain.ChatMessage{user("q"), reply("a")})
		mustAppend(t, s, "ollama", "m1", "s1", []domain.ChatMessage{user("q"), reply("a")})
		// Turns count replies; a few-shot assistant message is none.
		mustAppend(t, s, "ollama", "m2", "s1", []domain.ChatMessage{user("q"), asst("few-shot"), user("q2"), reply("a"), reply("a2")})
		to := time.Now()

		all := []domain.SessionInfo{
			{Adapter: "ollama", Target: "m2", SessionID: "s1", Turns: 3},
			{Adapter: "ollama", Target: "m1", SessionID: "s2", Turns: 1},
			{Adapter: "openai", Target: "gpt", SessionID: "s1", Turns: 0},
		}
		cases := []struct {
			adapter string
			want    []domain.SessionInfo
		}{
			{"", all},
			{"ollama", all[:2]},
			{"openai", all[2:]},
			{"none", nil},
		}
		for _, tc := range cases {
			got, err := s.ListChats(ctx, tc.adapter)
			if err != nil {
				t.Fatalf("ListChats(%q): %v", tc.adapter, err)
			}
			for i := range got {
				checkRecent(t, "LastUsed", got[i].LastUsed, from, to)
				got[i].LastUsed = time.Time{}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ListChats(%q) =\n%+v\nwant\n%+v", tc.adapter, got, tc.want)
			}
		}
	})
}

func mustAppend(t *testing.T, s ports.ChatSessionStore, adapter, target, session string, msgs []domain.ChatMessage) {
	t.Helper()
	if err := s.AppendChat(context.Background(), adapter, target, session, msgs); err != nil {
		t.Fatalf("AppendChat %s/%s: %v", adapter, session, err)
	}
}
