package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"iop/adapters/store/memory"
	"iop/adapters/store/sqlite"
	"iop/domain"
	"iop/internal/racebuild"
	"iop/ports"
)

// A store's bounded load keeps at least what trim keeps of the whole
// history, so a turn replays the same either way: random histories of
// turns and of agents' tool loops (one user message, then groups of an
// assistant message and its tool results, parallel ones too), with
// instructions, messages stored without their JSON (which replay escaped,
// longer than the store counts them), and sessions longer than the SQLite
// store's page of sizes.
func TestBoundedLoadReplaysAsTrimOfTheWholeHistory(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "node.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	stores := map[string]ports.ChatSessionStore{"memory": memory.NewChatStore(), "sqlite": sqlite.NewChatStore(db)}
	rng := rand.New(rand.NewPCG(7, 11))
	text := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString([]string{"x", "é", "\"", "\n", "<", "ab"}[rng.IntN(6)])
		}
		return b.String()
	}
	msg := func(role string) domain.ChatMessage {
		n := []int{0, 5, 40, 200, 2000}[rng.IntN(5)] + rng.IntN(30)
		m := domain.ChatMessage{Role: role, Content: text(n)}
		if rng.IntN(5) > 0 {
			extra := map[string]any{"role": role, "content": m.Content}
			switch role {
			case "assistant":
				if rng.IntN(3) > 0 {
					extra["tool_calls"] = []map[string]any{{"id": "c", "type": "function", "function": map[string]any{"name": "f", "arguments": "{}"}}}
				}
			case "tool":
				extra["tool_call_id"] = "c"
			}
			raw, _ := json.Marshal(extra)
			m.Raw = string(raw)
		}
		return m
	}
	// 300 histories take ≈ 4 s; the race detector makes that ≈ 77 s, and
	// the comparison is single-goroutine, so a fifth of them there.
	histories := 300
	if racebuild.Enabled() {
		histories = 60
	}
	for i := range histories {
		var h []domain.ChatMessage
		for range rng.IntN(3) {
			h = append(h, msg([]string{"system", "developer"}[rng.IntN(2)]))
		}
		turns := 1 + rng.IntN(4)
		if rng.IntN(4) == 0 {
			h = append(h, msg("assistant")) // a prefix before the first user message
		}
		for turn := range turns {
			h = append(h, msg("user"))
			if rng.IntN(6) == 0 {
				h = append(h, msg("user"), msg("system"))
			}
			groups := rng.IntN(4)
			if turn == turns-1 && rng.IntN(2) == 0 {
				groups = rng.IntN([]int{10, 40, 300}[rng.IntN(3)]) // a tool loop
			}
			for g := range groups {
				h = append(h, msg("assistant"))
				tools := 1 + rng.IntN(2) // parallel calls now and then
				if g == groups-1 && rng.IntN(3) == 0 {
					tools = 0 // calls the next run's messages answer
				}
				for range tools {
					h = append(h, msg("tool"))
				}
			}
			if rng.IntN(3) > 0 {
				h = append(h, msg("assistant"))
			}
		}
		session := fmt.Sprint("s", i)
		for _, s := range stores {
			for from := 0; from < len(h); {
				n := min(len(h)-from, 1+rng.IntN(20))
				if err := s.AppendChat(ctx, "llm", "m", session, h[from:from+n]); err != nil {
					t.Fatal(err)
				}
				from += n
			}
		}
		wires := func(ms []domain.ChatMessage) []json.RawMessage {
			out := make([]json.RawMessage, len(ms))
			for j, m := range ms {
				out[j] = wire(m)
			}
			return out
		}
		all := wires(h)
		total := 0
		for _, m := range all {
			total += len(m)
		}
		for _, max := range []int{1, 100, 1000, 3000, 10000, total / 2, total - 1, total, total + 1} {
			if max <= 0 {
				continue
			}
			want := trim(h, wires(h), max)
			for name, s := range stores {
				loaded, err := s.LoadChat(ctx, "llm", session, max)
				if err != nil {
					t.Fatal(err)
				}
				got := trim(loaded, wires(loaded), max)
				same := func(a, b json.RawMessage) bool { return string(a) == string(b) }
				if !slices.EqualFunc(got, want, same) {
					t.Fatalf("%s, session %d (%d messages, %d bytes), max %d: bounded load of %d messages replays %d, trim of the whole history %d\nroles %v",
						name, i, len(h), total, max, len(loaded), len(got), len(want), roleList(h))
				}
				// And it loads no more than that and what fits in the
				// bound besides, as the store counts it.
				head := 0
				for head < len(loaded) && (loaded[head].Role == "system" || loaded[head].Role == "developer") {
					head++
				}
				stored := 0
				for _, m := range loaded[head:] {
					stored += storedSize(m)
				}
				if stored > max && !slices.EqualFunc(wires(loaded[head:]), want[head:], same) {
					t.Fatalf("%s, session %d, max %d: the bounded load holds %d bytes after its head, more than the bound and than the replay (%d of %d messages)",
						name, i, max, stored, len(want)-head, len(loaded)-head)
				}
			}
		}
	}
}

// storedSize is a message's size as the stores count it (chattail.Size).
func storedSize(m domain.ChatMessage) int {
	if m.Raw != "" {
		return len(m.Raw)
	}
	return len(`{"role":"","content":""}`) + len(m.Role) + len(m.Content)
}

func roleList(h []domain.ChatMessage) string {
	var b strings.Builder
	for _, m := range h {
		b.WriteString(m.Role[:1])
	}
	return b.String()
}

// An agent's tool loop driven through runs (one user message, then only
// tool results) is bounded like any session: its oldest tool-call groups
// are left out, its user message and newest group stay, and no tool
// message is replayed without the assistant message that made its call.
func TestToolLoopHistoryIsBounded(t *testing.T) {
	ctx := context.Background()
	s := NewSessions(memory.NewChatStore(), "llm", 1024)
	call := func(i int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"id":"c%d","type":"function","function":{"name":"read","arguments":"{}"}}`, i))
	}
	turn := func(input string) Turn {
		tr, err := ParseInput([]byte(input))
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	if err := s.Commit(ctx, nil, "m", "s1", turn(`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"fix the bug"}]}`), Reply{ToolCalls: []json.RawMessage{call(0)}}); err != nil {
		t.Fatal(err)
	}
	result := func(i int) string {
		return fmt.Sprintf(`{"messages":[{"role":"tool","tool_call_id":"c%d","content":"%s"}]}`, i, strings.Repeat("r", 2048))
	}
	for i := range 50 {
		if err := s.Commit(ctx, nil, "m", "s1", turn(result(i)), Reply{ToolCalls: []json.RawMessage{call(i + 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := s.Messages(ctx, "s1", turn(result(50)))
	if err != nil {
		t.Fatal(err)
	}
	size := 0
	var roles []string
	for _, m := range msgs[:len(msgs)-1] {
		size += len(m)
		var head struct{ Role string }
		_ = json.Unmarshal(m, &head)
		roles = append(roles, head.Role)
	}
	if got, want := strings.Join(roles, ","), "system,user,assistant"; got != want || size > 1024 {
		t.Fatalf("replayed %d bytes of history, roles %s; want %s within 1024", size, got, want)
	}
	if !strings.Contains(string(msgs[2]), `"c50"`) {
		t.Fatalf("the kept group is %s, want the call c50 the new message answers", msgs[2])
	}
}
