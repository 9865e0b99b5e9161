package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"iop/adapters/runtime/internal/chat"
	"iop/adapters/store/memory"
	"iop/domain"
)

func TestParseInput(t *testing.T) {
	for _, tc := range []struct {
		in, send, record string
	}{
		{"hello", `{"role":"user","content":"hello"}`, "user:hello"},
		{`{"prompt":"not messages"}`, `{"role":"user","content":"{\"prompt\":\"not messages\"}"}`, `user:{"prompt":"not messages"}`},
		{`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]}]}`,
			`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]}`, "user:ab"},
		{`{"messages":[{"role":"tool","content":null,"tool_call_id":"x"}]}`, `{"role":"tool","content":null,"tool_call_id":"x"}`, "tool:"},
	} {
		turn, err := chat.ParseInput([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if len(turn.Send) != 1 || string(turn.Send[0]) != tc.send {
			t.Errorf("%s: send %s, want %s", tc.in, turn.Send, tc.send)
		}
		if got := turn.Record[0].Role + ":" + turn.Record[0].Content; got != tc.record {
			t.Errorf("%s: record %q, want %q", tc.in, got, tc.record)
		}
	}
	for _, bad := range []string{"", " \n", `{"messages":"x"}`, `{"messages":[]}`, `{"messages":[1]}`, `{"messages":[{"role":""}]}`} {
		if _, err := chat.ParseInput([]byte(bad)); !errors.Is(err, domain.ErrInvalidRequest) {
			t.Errorf("%q: err = %v, want invalid_request", bad, err)
		}
	}
}

func TestSessionsCommitAndMessages(t *testing.T) {
	ctx := context.Background()
	s := chat.NewSessions(memory.NewChatStore(), "llm", 0)
	commit(t, s, "one", chat.Reply{Content: "reply"})
	next, _ := chat.ParseInput([]byte("two"))
	msgs, err := s.Messages(ctx, "s1", next)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`{"role":"user","content":"one"}`, `{"role":"assistant","content":"reply"}`, `{"role":"user","content":"two"}`}
	if len(msgs) != 3 {
		t.Fatalf("messages %s", msgs)
	}
	for i := range want {
		if string(msgs[i]) != want[i] {
			t.Errorf("message %d = %s, want %s", i, msgs[i], want[i])
		}
	}
	if err := s.Commit(ctx, nil, "m", "", next, chat.Reply{Content: "x"}); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.List(ctx, domain.SessionQuery{}); len(list) != 1 || list[0].Turns != 1 {
		t.Errorf("List = %+v", list)
	}
}

// A history past DefaultMaxHistoryBytes (no bound configured) is replayed without its oldest whole
// turns: the leading system message stays, and an assistant message's tool
// calls stay with the tool messages that answer them.
func TestMessagesBoundHistory(t *testing.T) {
	ctx := context.Background()
	store := memory.NewChatStore()
	s := chat.NewSessions(store, "llm", 0)
	big := strings.Repeat("x", chat.DefaultMaxHistoryBytes/3)
	commit(t, s, `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"`+big+`"}]}`, chat.Reply{ToolCalls: []json.RawMessage{json.RawMessage(`{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}`)}})
	commit(t, s, `{"messages":[{"role":"tool","tool_call_id":"c1","content":"`+big+`"}]}`, chat.Reply{Content: "done"})
	for i := range 2 {
		commit(t, s, fmt.Sprintf("turn %d %s", i, big), chat.Reply{Content: "ok"})
	}
	last, _ := chat.ParseInput([]byte("now"))
	msgs, err := s.Messages(ctx, "s1", last)
	if err != nil {
		t.Fatal(err)
	}
	var roles []string
	size := 0
	for _, m := range msgs[:len(msgs)-1] {
		var head struct{ Role string }
		_ = json.Unmarshal(m, &head)
		roles = append(roles, head.Role)
		size += len(m)
	}
	// The first turn (user, tool-calling reply, tool answer, reply) went
	// whole; the system message and the last two turns stayed.
	if got, want := strings.Join(roles, ","), "system,user,assistant,user,assistant"; got != want || size > chat.DefaultMaxHistoryBytes {
		t.Errorf("replayed roles %s (%d bytes), want %s within %d", got, size, want, chat.DefaultMaxHistoryBytes)
	}
}

// A configured bound replaces the default: the store is asked for at most
// that much, and what is replayed fits in it (besides the latest turn, which
// is always kept); a history within the default but past the bound is
// trimmed.
func TestMessagesConfiguredBound(t *testing.T) {
	ctx := context.Background()
	const bound = 8 << 10
	store := &boundStore{ChatStore: memory.NewChatStore()}
	s := chat.NewSessions(store, "llm", bound)
	big := strings.Repeat("x", 3<<10)
	commit(t, s, `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"first"}]}`, chat.Reply{Content: "ok"})
	for i := range 6 {
		commit(t, s, fmt.Sprintf("turn %d %s", i, big), chat.Reply{Content: "ok"})
	}
	last, _ := chat.ParseInput([]byte("now"))
	msgs, err := s.Messages(ctx, "s1", last)
	if err != nil {
		t.Fatal(err)
	}
	if store.maxBytes != bound {
		t.Errorf("LoadChat asked for %d bytes, want %d", store.maxBytes, bound)
	}
	size := 0
	for _, m := range msgs[:len(msgs)-1] {
		size += len(m)
	}
	// 2 turns of about 3 KiB fit in 8 KiB, a third does not.
	if size > bound || len(msgs) != 1+2*2+1 || !strings.Contains(string(msgs[0]), `"system"`) || !strings.Contains(string(msgs[1]), "turn 4") {
		t.Errorf("replayed %d messages, %d bytes of history (bound %d), starting %.40s, %.40s", len(msgs), size, bound, msgs[0], msgs[1])
	}

	// The same history under the default bound is replayed whole.
	all, err := chat.NewSessions(store, "llm", 0).Messages(ctx, "s1", last)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3+6*2+1 || store.maxBytes != chat.DefaultMaxHistoryBytes {
		t.Errorf("default bound: replayed %d messages, LoadChat asked for %d bytes", len(all), store.maxBytes)
	}
}

// boundStore records the bound LoadChat was last asked for.
type boundStore struct {
	*memory.ChatStore
	maxBytes int
}

func (s *boundStore) LoadChat(ctx context.Context, adapter, sessionID string, maxBytes int) ([]domain.ChatMessage, error) {
	s.maxBytes = maxBytes
	return s.ChatStore.LoadChat(ctx, adapter, sessionID, maxBytes)
}

// The leading instructions a trimmed history keeps include developer
// messages (newer OpenAI models' system role) and several of them.
func TestTrimKeepsEveryLeadingInstruction(t *testing.T) {
	ctx := context.Background()
	s := chat.NewSessions(memory.NewChatStore(), "llm", 0)
	big := strings.Repeat("x", chat.DefaultMaxHistoryBytes/2)
	commit(t, s, `{"messages":[{"role":"system","content":"be brief"},{"role":"developer","content":"answer in French"},{"role":"user","content":"`+big+`"}]}`, chat.Reply{Content: "ok"})
	for range 2 {
		commit(t, s, big, chat.Reply{Content: "ok"})
	}
	last, _ := chat.ParseInput([]byte("now"))
	msgs, err := s.Messages(ctx, "s1", last)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) < 3 || !strings.Contains(string(msgs[0]), `"system"`) || !strings.Contains(string(msgs[1]), `"developer"`) {
		t.Fatalf("the leading instructions were trimmed; replayed %d messages starting %.60s…", len(msgs), msgs[0])
	}
	if len(msgs) >= 9 { // 2 instructions, 3 turns of 2, the new message
		t.Fatalf("%d messages replayed: the history was not trimmed", len(msgs))
	}
}

// commit stores one completed turn of session s1: input as a run's input,
// then reply.
func commit(t *testing.T, s *chat.Sessions, input string, reply chat.Reply) {
	t.Helper()
	turn, err := chat.ParseInput([]byte(input))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(context.Background(), nil, "m", "s1", turn, reply); err != nil {
		t.Fatal(err)
	}
}
