package chat_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"iop/adapters/runtime/internal/chat"
	"iop/adapters/store/memory"
)

// The leading instructions are sent besides max_history_bytes, not out of
// it (README, docs/adapters.md, and the stores' bounded load, which counts
// the history after them): a long system prompt does not cut a latest
// turn that alone fits in the bound — an agent's tool loop keeps its
// earlier tool results — nor leave less of the older turns than the bound
// holds.
func TestLeadingInstructionsAreSentBesidesTheBound(t *testing.T) {
	const bound = 4 << 10
	system := strings.Repeat("s", 3<<10) // most of the bound
	call := json.RawMessage(`{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}`)
	roles := func(msgs []json.RawMessage) string {
		var out []string
		for _, m := range msgs {
			var h struct{ Role, Content string }
			_ = json.Unmarshal(m, &h)
			out = append(out, h.Role+":"+strings.TrimSpace(h.Content[:min(len(h.Content), 6)]))
		}
		return strings.Join(out, " ")
	}

	t.Run("tool loop", func(t *testing.T) {
		s := chat.NewSessions(memory.NewChatStore(), "llm", bound)
		result := strings.Repeat("r", 900)
		commit(t, s, `{"messages":[{"role":"system","content":"`+system+`"},{"role":"user","content":"go"}]}`, chat.Reply{Content: "call1", ToolCalls: []json.RawMessage{call}})
		commit(t, s, `{"messages":[{"role":"tool","tool_call_id":"c1","content":"`+result+`"}]}`, chat.Reply{Content: "call2", ToolCalls: []json.RawMessage{call}})
		next, _ := chat.ParseInput([]byte(`{"messages":[{"role":"tool","tool_call_id":"c1","content":"last"}]}`))
		msgs, err := s.Messages(context.Background(), "s1", next)
		if err != nil {
			t.Fatal(err)
		}
		// The turn (about 1 KiB) fits in the bound: all of it is sent.
		if got, want := roles(msgs), "system:ssssss user:go assistant:call1 tool:rrrrrr assistant:call2 tool:last"; got != want {
			t.Errorf("sent %s\nwant %s", got, want)
		}
	})

	t.Run("turns", func(t *testing.T) {
		s := chat.NewSessions(memory.NewChatStore(), "llm", bound)
		commit(t, s, `{"messages":[{"role":"system","content":"`+system+`"},{"role":"user","content":"turn0"}]}`, chat.Reply{Content: "ok"})
		for i := 1; i < 10; i++ {
			commit(t, s, fmt.Sprintf("turn%d %s", i, strings.Repeat("x", 900)), chat.Reply{Content: "ok"})
		}
		next, _ := chat.ParseInput([]byte("now"))
		msgs, err := s.Messages(context.Background(), "s1", next)
		if err != nil {
			t.Fatal(err)
		}
		// Four turns of about 1 KiB fit in 4 KiB besides the system prompt.
		if got, want := roles(msgs), "system:ssssss user:turn6 assistant:ok user:turn7 assistant:ok user:turn8 assistant:ok user:turn9 assistant:ok user:now"; got != want {
			t.Errorf("sent %s\nwant %s", got, want)
		}
	})
}
