package openai_test

import (
	"encoding/json"
	"testing"

	"iop/adapters/runtime/internal/standin"
	"iop/adapters/store/memory"
	"iop/domain"
)

// Gemini 3 through its OpenAI compatibility layer gives each tool call a
// thought signature under "extra_content", which must come back with the
// call in the history: without it the next request is refused (400
// "Function call is missing a thought_signature in functionCall parts").
// A session keeps a call's fields beyond id, type and function as the
// server sent them, so the turn that answers the call is accepted.
func TestToolCallExtraFieldsAreKept(t *testing.T) {
	const extra = `{"google":{"thought_signature":"CiQBjz1rX+sig=="}}`
	srv := standin.NewServer(t, firstThen(
		// As Gemini streams it: each call whole, no index.
		sse(events("\n",
			`{"choices":[{"delta":{"role":"assistant","tool_calls":[{"extra_content":`+extra+`,"function":{"arguments":"{\"city\":\"Paris\"}","name":"get_weather"},"id":"function-call-1","type":"function"}]},"finish_reason":"tool_calls","index":0}],"created":1,"id":"x","model":"gemini-3-flash-preview","object":"chat.completion.chunk"}`,
			"[DONE]")),
		sse(events("\n", chunk(`{"content":"Sunny."}`, "stop"), "[DONE]"))))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, memory.NewChatStore())
	sessionTurns(t, a, "gemini-3-flash-preview", "weather in Paris?", `{"messages":[{"role":"tool","tool_call_id":"function-call-1","content":"sunny"}]}`)
	var msgs []struct {
		ToolCalls []struct {
			ID           string          `json:"id"`
			ExtraContent json.RawMessage `json:"extra_content"`
			Function     struct{ Name, Arguments string }
		} `json:"tool_calls"`
	}
	raw := srv.Request(t, 1).Body["messages"]
	if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) != 3 {
		t.Fatalf("second request sent %s (%v)", raw, err)
	}
	calls := msgs[1].ToolCalls
	if len(calls) != 1 || calls[0].ID != "function-call-1" || calls[0].Function.Name != "get_weather" ||
		calls[0].Function.Arguments != `{"city":"Paris"}` || string(calls[0].ExtraContent) != extra {
		t.Errorf("the reply's tool call was replayed as %s", raw)
	}
	var call map[string]json.RawMessage
	_ = json.Unmarshal(mustFirstCall(t, raw), &call)
	if _, ok := call["index"]; ok {
		t.Errorf("the stored call carries a stream index: %s", raw)
	}
}

// mustFirstCall returns the first tool call of the second message of raw.
func mustFirstCall(t *testing.T, raw json.RawMessage) json.RawMessage {
	t.Helper()
	var msgs []struct {
		ToolCalls []json.RawMessage `json:"tool_calls"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) < 2 || len(msgs[1].ToolCalls) == 0 {
		t.Fatalf("no tool call in %s", raw)
	}
	return msgs[1].ToolCalls[0]
}
