package httpapi

import (
	"encoding/json"
	"testing"

	"iop/domain"
)

// FuzzRunEventJSON checks appendRunEventJSON against json.Marshal of the
// same event, byte for byte, for arbitrary strings and counts.
func FuzzRunEventJSON(f *testing.F) {
	text := "plain, \"quoted\" \\ <b>&amp;</b>\n\r\t\b\f\x00\x1f\x7f é 漢字 \u2028\u2029 bad:\xff\xc3 end"
	f.Add("run_1", "n1", uint64(2), "delta", "hello\n", uint8(0), int64(0), int64(0), int64(0), int64(0), "", "", "", "")
	f.Add(text, text, uint64(1<<63), text, text, uint8(1), int64(1), int64(2), int64(3), int64(4), "end_turn", text, "", "")
	f.Add("run_1", "", uint64(4), "error", "", uint8(2), int64(0), int64(0), int64(0), int64(0), "", "", "node_disconnected", text)
	f.Add("run_1", "n", uint64(3), "complete", "", uint8(3), int64(-1), int64(0), int64(-9223372036854775808), int64(0), "", "m", "c", "")
	f.Fuzz(func(t *testing.T, runID, node string, seq uint64, typ, txt string, has uint8,
		prompt, completion, total, dur int64, stop, model, code, msg string) {
		ev := domain.RunEvent{RunID: runID, Seq: seq, Type: domain.EventType(typ), Text: txt}
		if has&1 != 0 {
			ev.Usage = &domain.Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: total,
				DurationMS: dur, StopReason: stop, Model: model}
		}
		if has&2 != 0 {
			ev.Error = &domain.ErrorInfo{Code: code, Message: msg}
		}
		want, err := json.Marshal(toRunEventJSON(node, ev))
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendRunEventJSON([]byte("prefix"), node, ev)
		if err != nil || string(got) != "prefix"+string(want) {
			t.Fatalf("got %q (%v)\nwant prefix%q", got, err, want)
		}
	})
}
