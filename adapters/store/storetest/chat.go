package storetest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
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
		msgs, err := newStore(t).LoadChat(context.Background(), "ollama", "nope", 0)
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
			got, err := s.LoadChat(ctx, tc.adapter, tc.session, 0)
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
		got, _ := s.LoadChat(ctx, "ollama", "s1", 0)
		got[0].Content = "changed by reader"
		got, _ = s.LoadChat(ctx, "ollama", "s1", 0)
		if !slices.Equal(got, []domain.ChatMessage{user("a")}) {
			t.Fatalf("LoadChat after callers' edits = %+v", got)
		}
	})

	t.Run("appending nothing creates nothing", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		mustAppend(t, s, "ollama", "m", "s1", nil)
		list, err := s.ListChats(ctx, "", domain.SessionQuery{})
		if err != nil || len(list) != 0 {
			t.Fatalf("ListChats = %v, %v; want none", list, err)
		}
	})

	t.Run("delete", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		mustAppend(t, s, "ollama", "m", "s1", []domain.ChatMessage{user("a"), asst("b")})
		mustAppend(t, s, "ollama", "m", "s2", []domain.ChatMessage{user("c")})
		if found, err := s.DeleteChat(ctx, "ollama", "s1"); err != nil || !found {
			t.Fatalf("DeleteChat = %v, %v; want found", found, err)
		}
		// Unknown, already deleted, or another adapter's: no error, not found.
		for _, k := range [][2]string{{"ollama", "unknown"}, {"ollama", "s1"}, {"openai", "s2"}} {
			if found, err := s.DeleteChat(ctx, k[0], k[1]); err != nil || found {
				t.Fatalf("DeleteChat(%s/%s) = %v, %v; want not found, no error", k[0], k[1], found, err)
			}
		}
		if msgs, err := s.LoadChat(ctx, "ollama", "s1", 0); err != nil || len(msgs) != 0 {
			t.Fatalf("LoadChat(deleted) = %v, %v; want none", msgs, err)
		}
		if msgs, _ := s.LoadChat(ctx, "ollama", "s2", 0); len(msgs) != 1 {
			t.Fatalf("LoadChat(kept) = %v, want 1 message", msgs)
		}
		list, err := s.ListChats(ctx, "", domain.SessionQuery{})
		if err != nil || len(list) != 1 || list[0].SessionID != "s2" {
			t.Fatalf("ListChats after delete = %+v, %v; want only s2", list, err)
		}
		// A deleted session starts again from scratch.
		mustAppend(t, s, "ollama", "m", "s1", []domain.ChatMessage{user("fresh")})
		if msgs, _ := s.LoadChat(ctx, "ollama", "s1", 0); !slices.Equal(msgs, []domain.ChatMessage{user("fresh")}) {
			t.Fatalf("LoadChat(recreated) = %+v", msgs)
		}
	})

	t.Run("a bounded load keeps the head and the newest whole turns", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		// Each message's JSON is 100 bytes (40 for the system head).
		msg := func(role, text string, size int) domain.ChatMessage {
			raw := `{"role":"` + role + `","content":"` + text
			raw += strings.Repeat("x", size-len(raw)-2) + `"}`
			return domain.ChatMessage{Role: role, Content: text, Raw: raw}
		}
		all := []domain.ChatMessage{
			msg("system", "S", 40),
			msg("user", "A", 100), msg("assistant", "a", 100),
			msg("user", "B", 100), msg("assistant", "b", 100), msg("tool", "t", 100), msg("system", "mid", 100),
			msg("user", "C", 100), msg("assistant", "c", 100),
		}
		mustAppend(t, s, "ollama", "m", "long", all[:3])
		mustAppend(t, s, "ollama", "m", "long", all[3:])
		pick := func(idx ...int) []domain.ChatMessage {
			var out []domain.ChatMessage
			for _, i := range idx {
				out = append(out, all[i])
			}
			return out
		}
		for _, c := range []struct {
			max  int
			want []domain.ChatMessage
		}{
			{0, all},
			{10000, all},
			{650, pick(0, 3, 4, 5, 6, 7, 8)},
			{350, pick(0, 7, 8)},
			{50, pick(0, 7, 8)}, // the latest turn stays past the bound
		} {
			got, err := s.LoadChat(ctx, "ollama", "long", c.max)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("LoadChat(max %d) = %d messages %+v, want %d", c.max, len(got), roles(got), len(c.want))
			}
		}
		// A session longer than a store's page of sizes: 600 turns of 200
		// bytes, 150 of which fit in 30,000.
		var many []domain.ChatMessage
		for i := range 600 {
			many = append(many, msg("user", fmt.Sprint("q", i), 100), msg("assistant", fmt.Sprint("a", i), 100))
		}
		mustAppend(t, s, "ollama", "m", "many", many)
		got, err := s.LoadChat(ctx, "ollama", "many", 30000)
		if err != nil || !slices.Equal(got, many[900:]) {
			t.Errorf("600 turns bounded at 30000: %d messages from %v (%v), want the last 300", len(got), roles(got[:1]), err)
		}
		// Only a head: returned whole; an unknown session: nothing.
		mustAppend(t, s, "ollama", "m", "sys", []domain.ChatMessage{msg("system", "S", 40), msg("developer", "D", 40)})
		if got, _ := s.LoadChat(ctx, "ollama", "sys", 10); len(got) != 2 {
			t.Errorf("head only: %+v", roles(got))
		}
		if got, err := s.LoadChat(ctx, "ollama", "nope", 10); err != nil || len(got) != 0 {
			t.Errorf("unknown: %v %v", got, err)
		}
	})

	t.Run("a bounded load of a tool loop keeps its opening and newest groups", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		msg := func(role, text string, size int) domain.ChatMessage {
			raw := `{"role":"` + role + `","content":"` + text
			raw += strings.Repeat("x", size-len(raw)-2) + `"}`
			return domain.ChatMessage{Role: role, Content: text, Raw: raw}
		}
		// An agent's tool loop through runs: one user message, then groups
		// of an assistant message (its calls) and tool results; 300 of
		// them, past a store's page of sizes.
		all := []domain.ChatMessage{msg("system", "S", 40), msg("user", "U", 100), msg("tool", "early", 100)}
		for i := range 300 {
			all = append(all, msg("assistant", fmt.Sprint("a", i), 100), msg("tool", fmt.Sprint("t", i), 100))
			if i%7 == 0 {
				all = append(all, msg("tool", fmt.Sprint("p", i), 100)) // a parallel call's result
			}
		}
		mustAppend(t, s, "ollama", "m", "loop", all)
		n := len(all)
		for _, c := range []struct {
			max  int
			want []domain.ChatMessage
		}{
			// The opening (the user message to the first assistant
			// message) and the newest groups that fit with it: 298, 299.
			{650, append(slices.Clone(all[:3]), all[n-4:]...)},
			// The newest group stays past the bound.
			{50, append(slices.Clone(all[:3]), all[n-2:]...)},
		} {
			got, err := s.LoadChat(ctx, "ollama", "loop", c.max)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("LoadChat(max %d) = %d messages %v, want %d %v", c.max, len(got), roles(got), len(c.want), roles(c.want))
			}
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
			got, err := s.ListChats(ctx, tc.adapter, domain.SessionQuery{})
			if err != nil {
				t.Fatalf("ListChats(%q): %v", tc.adapter, err)
			}
			checkListingOrder(t, got)
			for i := range got {
				checkRecent(t, "LastUsed", got[i].LastUsed, from, to)
				got[i].LastUsed = time.Time{}
			}
			slices.SortFunc(got, byAdapterAndID)
			if !slices.Equal(got, tc.want) {
				t.Errorf("ListChats(%q) =\n%+v\nwant\n%+v", tc.adapter, got, tc.want)
			}
		}
		// A turn makes its session the newest.
		mustAppend(t, s, "openai", "gpt", "s1", []domain.ChatMessage{user("again"), reply("b")})
		got, err := s.ListChats(ctx, "", domain.SessionQuery{})
		if err != nil || len(got) != 3 || got[0].Adapter != "openai" || got[0].Turns != 1 || got[0].LastUsed.Before(got[1].LastUsed) {
			t.Fatalf("ListChats after a turn of openai/s1 = %+v, %v; want it first", got, err)
		}
	})

	t.Run("list in pages", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		for i := range 23 {
			mustAppend(t, s, []string{"ollama", "openai"}[i%2], "m", fmt.Sprintf("s%02d", i), []domain.ChatMessage{user("q"), reply("a")})
		}
		checkPages(t, func(adapter string, q domain.SessionQuery) ([]domain.SessionInfo, error) {
			return s.ListChats(ctx, adapter, q)
		}, map[string]int{"": 23, "ollama": 12, "openai": 11, "none": 0})
	})
}

// byAdapterAndID orders sessions by adapter, then session id.
func byAdapterAndID(a, b domain.SessionInfo) int {
	return cmp.Or(cmp.Compare(a.Adapter, b.Adapter), cmp.Compare(a.SessionID, b.SessionID))
}

// checkListingOrder fails unless list is in listing order: newest first,
// ties by adapter, then session id, descending.
func checkListingOrder(t *testing.T, list []domain.SessionInfo) {
	t.Helper()
	for i := 1; i < len(list); i++ {
		if !list[i-1].Key().Before(list[i].Key()) {
			t.Fatalf("sessions %d and %d out of listing order: %+v, %+v", i-1, i, list[i-1], list[i])
		}
	}
}

// checkPages lists each adapter's sessions ("" for all) whole, then in
// pages of 5 each continued after the last one of the page before, and
// checks that the pages, in listing order, add up to the whole list of
// want[adapter] sessions, each once.
func checkPages(t *testing.T, list func(adapter string, q domain.SessionQuery) ([]domain.SessionInfo, error), want map[string]int) {
	t.Helper()
	for adapter, n := range want {
		whole, err := list(adapter, domain.SessionQuery{})
		if err != nil || len(whole) != n {
			t.Fatalf("list %q whole: %d sessions, %v; want %d", adapter, len(whole), err, n)
		}
		checkListingOrder(t, whole)
		var paged []domain.SessionInfo
		q := domain.SessionQuery{Limit: 5}
		for range n/5 + 2 {
			page, err := list(adapter, q)
			if err != nil || len(page) > 5 {
				t.Fatalf("list %q after %+v: %d sessions, %v", adapter, q.After, len(page), err)
			}
			paged = append(paged, page...)
			if len(page) < 5 {
				break
			}
			k := page[len(page)-1].Key()
			q.After = &k
		}
		if !slices.EqualFunc(paged, whole, sameSession) {
			t.Fatalf("list %q in pages of 5 =\n%+v\nwant\n%+v", adapter, paged, whole)
		}
		// Continued after any session of any adapter (a node lists every
		// adapter's sessions merged, so a page may end in another's).
		all, err := list("", domain.SessionQuery{})
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range all {
			k := s.Key()
			page, err := list(adapter, domain.SessionQuery{Limit: 5, After: &k})
			var want []domain.SessionInfo
			for _, x := range all[i+1:] {
				if len(want) < 5 && (adapter == "" || x.Adapter == adapter) {
					want = append(want, x)
				}
			}
			if err != nil || !slices.EqualFunc(page, want, sameSession) {
				t.Fatalf("list %q after %+v = %+v, %v; want %+v", adapter, k, page, err, want)
			}
		}
	}
}

func sameSession(a, b domain.SessionInfo) bool {
	return a.LastUsed.Equal(b.LastUsed) && a.Adapter == b.Adapter && a.SessionID == b.SessionID && a.Turns == b.Turns && a.Target == b.Target
}

func mustAppend(t *testing.T, s ports.ChatSessionStore, adapter, target, session string, msgs []domain.ChatMessage) {
	t.Helper()
	if err := s.AppendChat(context.Background(), adapter, target, session, msgs); err != nil {
		t.Fatalf("AppendChat %s/%s: %v", adapter, session, err)
	}
}

func roles(msgs []domain.ChatMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Role + ":" + m.Content
	}
	return out
}
