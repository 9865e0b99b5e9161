package openai_test

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"

	"iop/adapters/runtime/internal/standin"
	"iop/adapters/runtime/openai"
	"iop/adapters/store/memory"
	"iop/domain"
)

// Some servers send a tool call's function.arguments as a JSON object
// rather than the string OpenAI's API has: llama.cpp's server for a while
// in 2026 (ggml-org/llama.cpp#20198), TGI in its non-streamed answers
// (huggingface/text-generation-inference#2136). A session still stores the
// call, its arguments as the JSON text the API expects, so the caller's
// tool message that answers it is replayed after it, not as a tool result
// without its call, which the server refuses in every later turn.
func TestToolCallArgumentsSentAsAnObject(t *testing.T) {
	cases := map[string]http.HandlerFunc{
		"streamed": sse(events("\n",
			chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_time","arguments":{"tz":"UTC"}}}]}`, "tool_calls"),
			"[DONE]")),
		"whole": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,` +
				`"tool_calls":[{"id":"call_1","type":"function","function":{"description":null,"name":"get_time","arguments":{"tz":"UTC"}}}]},"finish_reason":"tool_calls"}]}`))
		},
	}
	for name, first := range cases {
		t.Run(name, func(t *testing.T) {
			srv := standin.NewServer(t, firstThen(first, sse(events("\n", chunk(`{"content":"It is noon."}`, "stop"), "[DONE]"))))
			a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, memory.NewChatStore())
			sessionTurns(t, a, "m", "what time is it?", `{"messages":[{"role":"tool","tool_call_id":"call_1","content":"12:00"}]}`)
			var msgs []struct {
				Role      string `json:"role"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct {
						Name      string          `json:"name"`
						Arguments json.RawMessage `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			}
			raw := srv.Request(t, 1).Body["messages"]
			if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) != 3 {
				t.Fatalf("second request sent %s (%v)", raw, err)
			}
			calls := msgs[1].ToolCalls
			if msgs[1].Role != "assistant" || len(calls) != 1 || calls[0].ID != "call_1" || calls[0].Type != "function" ||
				calls[0].Function.Name != "get_time" || string(calls[0].Function.Arguments) != `"{\"tz\":\"UTC\"}"` {
				t.Errorf("the reply's tool call was replayed as %s", raw)
			}
		})
	}
}

// firstThen answers a server's first request with first and every later
// one with rest.
func firstThen(first, rest http.HandlerFunc) http.HandlerFunc {
	var mu sync.Mutex
	n := 0
	return func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		if i == 1 {
			first(w, r)
			return
		}
		rest(w, r)
	}
}

// sessionTurns runs inputs in turn as runs of session s1 on target, each
// to its completion.
func sessionTurns(t *testing.T, a *openai.Adapter, target string, inputs ...string) {
	t.Helper()
	for _, input := range inputs {
		sink, err := run(t, a, domain.RunRequest{Target: target, Input: []byte(input), SessionID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		requireTerminal(t, sink, domain.EventComplete, "")
	}
}
