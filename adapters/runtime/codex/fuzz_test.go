package codex

import (
	"strings"
	"testing"
	"time"

	"iop/adapters/runtime/internal/agenttest"
)

// FuzzJSONL feeds arbitrary stdout to the codex exec --json parser: see
// agenttest.FeedLines for what must hold.
func FuzzJSONL(f *testing.F) {
	for _, s := range [][]string{{
		`{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}`,
		`{"type":"turn.started"}`,
		`{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"Thinking"}}`,
		`{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"ls","aggregated_output":"a\nb","exit_code":0,"status":"completed"}}`,
		`{"type":"item.completed","item":{"id":"item_3","type":"agent_message","text":"Yes."}}`,
		`{"type":"turn.completed","usage":{"input_tokens":24763,"cached_input_tokens":24448,"output_tokens":122}}`,
	}, {
		`{"type":"error","message":"stream disconnected"}`,
		`{"type":"turn.failed","error":{"message":"boom"}}`,
	}} {
		f.Add([]byte(strings.Join(s, "\n")))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		if err := agenttest.FeedLines(&parser{started: time.Now()}, "gpt-5", out); err != nil {
			t.Fatal(err)
		}
	})
}
