package claudecode

import (
	"strings"
	"testing"

	"iop/adapters/runtime/internal/agenttest"
)

// FuzzStreamJSON feeds arbitrary stdout to the stream-json parser, with and
// without partial messages: see agenttest.FeedLines for what must hold.
func FuzzStreamJSON(f *testing.F) {
	for _, s := range [][]string{{
		`{"type":"system","subtype":"init","cwd":"/w","session_id":"6f1","model":"claude-opus-4"}`,
		`{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Hmm"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hel"}}}`,
		`{"type":"assistant","message":{"model":"claude-opus-4-1","content":[{"type":"thinking","thinking":"Hmm"},{"type":"text","text":"Hello"},{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"/x"}}]}}`,
		`{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":[{"type":"text","text":"no"},{"type":"image"}]}]}}`,
		`{"type":"result","subtype":"success","is_error":false,"result":"Done.","session_id":"6f1","total_cost_usd":0.0412,"usage":{"input_tokens":9,"output_tokens":77}}`,
	}, {
		`{"type":"assistant","message":{"model":"<synthetic>","content":[{"type":"text","text":"x"}]},"error":"rate_limit"}`,
		`{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"plain"}]}}`,
		`{"type":"result","subtype":"error_max_turns","is_error":true,"errors":["a"],"num_turns":3}`,
	}, {`not json`, `{"type":"result","subtype":"success","is_error":true,"result":"API Error: 529"}`}} {
		f.Add([]byte(strings.Join(s, "\n")), false)
		f.Add([]byte(strings.Join(s, "\n")), true)
	}
	f.Fuzz(func(t *testing.T, out []byte, partial bool) {
		if err := agenttest.FeedLines(&parser{partial: partial}, "sonnet", out); err != nil {
			t.Fatal(err)
		}
	})
}
