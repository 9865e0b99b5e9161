package openai

import (
	"testing"

	"iop/domain"
)

// discard is an EventSink that keeps nothing.
type discard struct{}

func (discard) Emit(domain.RunEvent) error { return nil }

// BenchmarkChunk is the adapter's handling of one streamed delta chunk,
// as vLLM and most servers send one per token.
func BenchmarkChunk(b *testing.B) {
	data := []byte(`{"id":"chatcmpl-8f1e","object":"chat.completion.chunk","created":1733130000,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`)
	s := &stream{sink: discard{}}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.dispatch("", data); err != nil {
			b.Fatal(err)
		}
	}
}
