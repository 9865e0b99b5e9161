package provider_test

import (
	"reflect"
	"testing"

	"iop/adapters/provider"
)

var fuzzUsageTypes = []string{"text/event-stream", "application/x-ndjson", "application/json", "text/html"}

// FuzzUsageScanner feeds arbitrary response bodies to the scanner in one
// write and in pieces: it must never panic, and where the body is split
// must not change the usage it reports.
func FuzzUsageScanner(f *testing.F) {
	for _, c := range []struct {
		ct   uint8
		body string
	}{
		{0, ": OPENROUTER PROCESSING\n\ndata: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}],\"usage\":null}\n\ndata: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2,\"total_tokens\":13}}\n\ndata: [DONE]\n\n"},
		{0, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"o4\",\"usage\":{\"input_tokens\":10,\"output_tokens\":4,\"total_tokens\":14}}}\n\n"},
		{0, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-z\",\"usage\":{\"input_tokens\":4,\"cache_creation_input_tokens\":1200,\"cache_read_input_tokens\":25000,\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":25000,\"output_tokens\":30}}\n\n"},
		{1, `{"model":"qwen3","created_at":"t","message":{"role":"assistant","content":"Hi"},"done":false}` + "\n" +
			`{"model":"qwen3","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":182242375,"prompt_eval_count":169,"eval_count":15}` + "\n"},
		{1, `{"model":"llama3.2","response":"","done":true,"done_reason":"length","prompt_eval_count":4,"eval_count":9,"total_duration":2000000}`},
		{2, `{"model":"llama3.2","response":"The sky","done":true,"done_reason":"stop","total_duration":4000000,"prompt_eval_count":26,"eval_count":290}`},
		{2, `{"id":"msg_1","type":"message","model":"claude-x","stop_reason":"end_turn","usage":{"input_tokens":25,"output_tokens":15}}`},
		{3, `<html></html>`},
	} {
		f.Add(c.ct, []byte(c.body), uint16(7))
	}
	f.Fuzz(func(t *testing.T, ct uint8, body []byte, split uint16) {
		contentType := fuzzUsageTypes[int(ct)%len(fuzzUsageTypes)]
		whole := provider.NewUsageScanner(contentType)
		whole.Write(body)
		want := whole.Usage()
		step := int(split)%64 + 1
		parts := provider.NewUsageScanner(contentType)
		for i := 0; i < len(body); i += step {
			parts.Write(body[i:min(i+step, len(body))])
		}
		if got := parts.Usage(); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s in writes of %d: %+v, in one: %+v", contentType, step, got, want)
		}
	})
}
