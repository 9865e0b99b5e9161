package provider_test

import (
	"testing"

	"iop/adapters/provider"
)

// BenchmarkUsageScanner feeds one streamed completion per op, one event per
// Write as a provider flushes them: what the node's scan costs per tunnel.
func BenchmarkUsageScanner(b *testing.B) {
	for _, s := range []struct{ name, ct, start, chunk, end string }{
		{"openai", "text/event-stream",
			`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n",
			`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"content":"token "}}]}` + "\n\n",
			`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":200,"total_tokens":209}}` + "\n\ndata: [DONE]\n\n"},
		{"anthropic", "text/event-stream",
			"event: message_start\n" + `data: {"type":"message_start","message":{"id":"m1","type":"message","role":"assistant","model":"claude-sonnet-4-5","usage":{"input_tokens":9,"output_tokens":1}}}` + "\n\n",
			"event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"token "}}` + "\n\n",
			"event: message_delta\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":200}}` + "\n\nevent: message_stop\n" + `data: {"type":"message_stop"}` + "\n\n"},
		{"ollama", "application/x-ndjson",
			`{"model":"llama3.2","created_at":"2024-01-01T00:00:00Z","message":{"role":"assistant","content":""},"done":false}` + "\n",
			`{"model":"llama3.2","created_at":"2024-01-01T00:00:00Z","message":{"role":"assistant","content":"token "},"done":false}` + "\n",
			`{"model":"llama3.2","created_at":"2024-01-01T00:00:00Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":9,"eval_count":200}` + "\n"},
	} {
		start, chunk, end := []byte(s.start), []byte(s.chunk), []byte(s.end)
		size := len(start) + 200*len(chunk) + len(end)
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				sc := provider.NewUsageScanner(s.ct)
				sc.Write(start)
				for range 200 {
					sc.Write(chunk)
				}
				sc.Write(end)
				if sc.Usage() == nil {
					b.Fatal("no usage")
				}
			}
		})
	}
}
