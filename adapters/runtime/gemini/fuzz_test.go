package gemini

import (
	"strings"
	"testing"

	"iop/adapters/runtime/internal/agenttest"
)

// FuzzStreamJSON feeds arbitrary stdout to the gemini stream-json parser:
// see agenttest.FeedLines for what must hold.
func FuzzStreamJSON(f *testing.F) {
	for _, s := range [][]string{{
		`Loaded cached credentials.`,
		`{"type":"init","timestamp":"2025-10-10T12:00:00.000Z","session_id":"abc","model":"auto"}`,
		`{"type":"message","timestamp":"t","role":"user","content":"hi"}`,
		`{"type":"tool_use","timestamp":"t","tool_name":"read_file","tool_id":"t1","parameters":{"path":"a"}}`,
		`{"type":"tool_result","timestamp":"t","tool_id":"t1","status":"error","output":{"x":1},"error":{"type":"e","message":"no"}}`,
		`{"type":"message","timestamp":"t","role":"assistant","content":"Hel","delta":true}`,
		`{"type":"result","timestamp":"t","status":"success","stats":{"total_tokens":10,"input_tokens":7,"output_tokens":3,"duration_ms":5,"models":{"gemini-2.5-pro":{},"gemini-2.5-flash":{}}}}`,
	}, {
		`{"type":"error","severity":"error","message":"invalid stream"}`,
		`{"type":"result","status":"error","error":{"type":"api","message":"API Error: 500"}}`,
	}} {
		f.Add([]byte(strings.Join(s, "\n")))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		if err := agenttest.FeedLines(&parser{}, "gemini-2.5-pro", out); err != nil {
			t.Fatal(err)
		}
	})
}
