package openai_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/adapters/runtime/internal/standin"
	"iop/adapters/store/memory"
	"iop/domain"
)

// Ollama's /v1 gives every parallel tool call of a turn index 0, each call
// whole with an id of its own (ollama/ollama#15457). They are distinct
// calls: a session stores both, each with its own arguments, not one call
// with the arguments joined into invalid JSON.
func TestParallelToolCallsSharingAnIndex(t *testing.T) {
	srv := standin.NewServer(t, sse(events("\n",
		chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}`, ""),
		chunk(`{"tool_calls":[{"index":0,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\":"}}]}`, ""),
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"\"CET\"}"}}]}`, "tool_calls"),
		"[DONE]")))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, memory.NewChatStore())
	for _, input := range []string{"weather and time?", `{"messages":[{"role":"tool","tool_call_id":"call_a","content":"sunny"},{"role":"tool","tool_call_id":"call_b","content":"12:00"}]}`} {
		sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte(input), SessionID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		requireTerminal(t, sink, domain.EventComplete, "")
	}
	var msgs []struct {
		Role      string `json:"role"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct{ Name, Arguments string }
		} `json:"tool_calls"`
	}
	raw := srv.Request(t, 1).Body["messages"]
	if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) < 2 {
		t.Fatalf("second request sent %s (%v)", raw, err)
	}
	calls := msgs[1].ToolCalls
	if len(calls) != 2 ||
		calls[0].ID != "call_a" || calls[0].Function.Name != "get_weather" || calls[0].Function.Arguments != `{"city":"Paris"}` ||
		calls[1].ID != "call_b" || calls[1].Function.Name != "get_time" || calls[1].Function.Arguments != `{"tz":"CET"}` {
		t.Errorf("the reply's tool calls were replayed as %s", raw)
	}
}

// Some servers give every fragment of one streamed tool call an id of its
// own at the same index (Poolside's API; mlx-openai-server before its PR
// #216; vLLM's early gpt-oss streaming, vllm-project/vllm#23522): only the
// first fragment names the function. The fragments are one call, stored
// with its first id, not one nameless call per fragment — and not "tool
// calls exceed 128 calls" once there are more than 128 fragments.
func TestToolCallWhoseIDChangesOnEveryFragment(t *testing.T) {
	for _, n := range []int{3, 200} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			payloads := []string{chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"write","arguments":""}}]}`, "")}
			for i := 1; i <= n; i++ {
				payloads = append(payloads, chunk(fmt.Sprintf(`{"tool_calls":[{"index":0,"id":"call_%d","type":"function","function":{"arguments":"x"}}]}`, i), ""))
			}
			payloads = append(payloads, chunk(`{}`, "tool_calls"), "[DONE]")
			body := events("\n", payloads...)
			srv := standin.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, body) // whole: 200 fragments cut in pieces of bytes take long
			})
			a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, memory.NewChatStore())
			for _, input := range []string{"write it", `{"messages":[{"role":"tool","tool_call_id":"call_0","content":"done"}]}`} {
				sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte(input), SessionID: "s1"})
				if err != nil {
					t.Fatal(err)
				}
				requireTerminal(t, sink, domain.EventComplete, "")
			}
			var msgs []struct {
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
			raw := srv.Request(t, 1).Body["messages"]
			if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) < 2 {
				t.Fatalf("second request sent %s (%v)", raw, err)
			}
			calls := msgs[1].ToolCalls
			if len(calls) != 1 || calls[0].ID != "call_0" || calls[0].Function.Name != "write" || calls[0].Function.Arguments != strings.Repeat("x", n) {
				t.Errorf("the reply's tool call was replayed as %s", raw)
			}
		})
	}
}
