package openai_test

import (
	"encoding/json"
	"testing"

	"iop/adapters/runtime/internal/standin"
	"iop/adapters/store/memory"
	"iop/domain"
)

// DeepSeek's thinking mode and Kimi's thinking models refuse a request
// whose assistant message with tool calls lacks its reasoning_content (400
// "Missing `reasoning_content` field in the assistant message", "thinking
// is enabled but reasoning_content is missing in assistant tool call
// message"). A session stores the reasoning of a reply that made tool
// calls when the server streamed it as reasoning_content, so the turn that
// answers the calls — and every later one — is accepted; a reply without
// tool calls is stored without its reasoning, as before, and so is one
// whose reasoning came as reasoning (OpenRouter, Ollama's /v1, Groq: none
// needs it back, and Groq refuses it in a request).
func TestToolCallingReplyKeepsItsReasoning(t *testing.T) {
	cases := []struct {
		name, field string
		kept        bool
	}{
		{"DeepSeek", "reasoning_content", true},
		{"OpenRouter", "reasoning", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := standin.NewServer(t, firstThen(
				sse(events("\n",
					chunk(`{"role":"assistant","content":null,"`+tc.field+`":"The user wants "}`, ""),
					chunk(`{"`+tc.field+`":"the time."}`, ""),
					chunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_time","arguments":"{}"}}]}`, "tool_calls"),
					"[DONE]")),
				sse(events("\n", chunk(`{"`+tc.field+`":"Answer now."}`, ""), chunk(`{"content":"It is noon."}`, "stop"), "[DONE]"))))
			a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, memory.NewChatStore())
			sessionTurns(t, a, "m", "what time is it?", `{"messages":[{"role":"tool","tool_call_id":"call_1","content":"12:00"}]}`, "thanks")
			raw := srv.Request(t, 2).Body["messages"]
			var msgs []map[string]json.RawMessage
			if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) != 5 {
				t.Fatalf("third request sent %s (%v)", raw, err)
			}
			if got := string(msgs[1][tc.field]); (got == `"The user wants the time."`) != tc.kept || msgs[1]["tool_calls"] == nil {
				t.Errorf("the tool-calling reply was replayed as %s, want its %s kept: %v", msgs[1], tc.field, tc.kept)
			}
			if _, ok := msgs[3][tc.field]; ok {
				t.Errorf("the final answer was replayed with its reasoning: %s", msgs[3])
			}
		})
	}
}
