package provider_test

import (
	"strconv"
	"strings"
	"testing"

	"iop/adapters/provider"
	"iop/domain"
)

func TestUsageScannerFormats(t *testing.T) {
	sseUsage := strings.Join([]string{
		`: OPENROUTER PROCESSING`,
		``,
		`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}],"usage":null}`,
		``,
		`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}],"usage":null}`,
		``,
		`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}`,
		``,
		`data: [DONE]`,
		``, ``,
	}, "\n")
	cases := []struct {
		name string
		ct   string
		body string
		want *domain.Usage
	}{
		{"openai sse, choices empty", "text/event-stream; charset=utf-8", sseUsage,
			&domain.Usage{PromptTokens: 11, CompletionTokens: 2, TotalTokens: 13, Model: "gpt-x"}},
		{"openai sse, choices null, CRLF", "text/event-stream",
			"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n" +
				"data: {\"model\":\"m\",\"choices\":null,\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6,\"total_tokens\":11}}\r\n\r\n" +
				"data: [DONE]\r\n\r\n",
			&domain.Usage{PromptTokens: 5, CompletionTokens: 6, TotalTokens: 11, Model: "m"}},
		{"openai sse, no usage", "text/event-stream",
			"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\ndata: [DONE]\n\n", nil},
		{"ollama ndjson chat", "application/x-ndjson",
			`{"model":"qwen3","created_at":"t","message":{"role":"assistant","content":"","thinking":"Let me"},"done":false}` + "\n" +
				`{"model":"qwen3","created_at":"t","message":{"role":"assistant","content":"Hi"},"done":false}` + "\n" +
				`{"model":"qwen3","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":182242375,"load_duration":41295167,"prompt_eval_count":169,"prompt_eval_duration":24573166,"eval_count":15,"eval_duration":115959084}` + "\n",
			&domain.Usage{PromptTokens: 169, CompletionTokens: 15, TotalTokens: 184, DurationMS: 182, StopReason: "stop", Model: "qwen3"}},
		{"ollama ndjson generate, final line without newline", "application/x-ndjson",
			`{"model":"llama3.2","response":"Hi","done":false}` + "\n" +
				`{"model":"llama3.2","response":"","done":true,"done_reason":"length","prompt_eval_count":4,"eval_count":9,"total_duration":2000000}`,
			&domain.Usage{PromptTokens: 4, CompletionTokens: 9, TotalTokens: 13, DurationMS: 2, StopReason: "length", Model: "llama3.2"}},
		{"openai json completion", "application/json",
			`{"id":"c","object":"chat.completion","model":"gpt-y","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`,
			&domain.Usage{PromptTokens: 3, CompletionTokens: 1, TotalTokens: 4, Model: "gpt-y"}},
		{"openai json embeddings", "application/json",
			`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"emb","usage":{"prompt_tokens":8,"total_tokens":8}}`,
			&domain.Usage{PromptTokens: 8, TotalTokens: 8, Model: "emb"}},
		{"ollama json, stream false", "application/json; charset=utf-8",
			`{"model":"llama3.2","response":"The sky","done":true,"done_reason":"stop","total_duration":4000000,"prompt_eval_count":26,"eval_count":290}`,
			&domain.Usage{PromptTokens: 26, CompletionTokens: 290, TotalTokens: 316, DurationMS: 4, StopReason: "stop", Model: "llama3.2"}},
		{"ollama embed", "application/json",
			`{"model":"all-minilm","embeddings":[[0.01,-0.02]],"total_duration":14000000,"load_duration":1000,"prompt_eval_count":8}`,
			&domain.Usage{PromptTokens: 8, TotalTokens: 8, DurationMS: 14, Model: "all-minilm"}},
		{"responses api event", "text/event-stream",
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"o4\",\"usage\":{\"input_tokens\":10,\"output_tokens\":4,\"total_tokens\":14}}}\n\n",
			&domain.Usage{PromptTokens: 10, CompletionTokens: 4, TotalTokens: 14, Model: "o4"}},
		{"anthropic messages sse", "text/event-stream; charset=utf-8",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-x\",\"stop_reason\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			&domain.Usage{PromptTokens: 25, CompletionTokens: 15, TotalTokens: 40, StopReason: "end_turn", Model: "claude-x"}},
		{"anthropic message json", "application/json",
			`{"id":"msg_2","type":"message","role":"assistant","model":"claude-y","content":[{"type":"text","text":"hi"}],"stop_reason":"max_tokens","usage":{"input_tokens":7,"output_tokens":3}}`,
			&domain.Usage{PromptTokens: 7, CompletionTokens: 3, TotalTokens: 10, StopReason: "max_tokens", Model: "claude-y"}},
		{"anthropic messages sse, prompt cache", "text/event-stream",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_3\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-z\",\"usage\":{\"input_tokens\":4,\"cache_creation_input_tokens\":1200,\"cache_read_input_tokens\":25000,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n",
			&domain.Usage{PromptTokens: 26204, CompletionTokens: 15, TotalTokens: 26219, StopReason: "end_turn", Model: "claude-z"}},
		{"anthropic messages sse, message_delta restates the prompt", "text/event-stream",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-z\",\"usage\":{\"input_tokens\":4,\"cache_creation_input_tokens\":1200,\"cache_read_input_tokens\":25000,\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":25000,\"output_tokens\":30}}\n\n",
			&domain.Usage{PromptTokens: 26210, CompletionTokens: 30, TotalTokens: 26240, StopReason: "tool_use", Model: "claude-z"}},
		{"anthropic message json, prompt cache", "application/json",
			`{"id":"msg_4","type":"message","role":"assistant","model":"claude-y","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":4,"cache_creation_input_tokens":1200,"cache_read_input_tokens":25000,"output_tokens":3}}`,
			&domain.Usage{PromptTokens: 26204, CompletionTokens: 3, TotalTokens: 26207, StopReason: "end_turn", Model: "claude-y"}},
		// Counts written as floats or strings (some OpenAI-compatible
		// servers; the openai runtime adapter reads them so too), and an
		// Ollama-compatible server's float duration: the line's other
		// counts are read all the same.
		{"openai sse, float counts", "text/event-stream",
			"data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":11.0,\"completion_tokens\":2.0,\"total_tokens\":13.0}}\n\ndata: [DONE]\n\n",
			&domain.Usage{PromptTokens: 11, CompletionTokens: 2, TotalTokens: 13, Model: "m"}},
		{"openai json, a string and an exponent", "application/json",
			`{"model":"m","choices":[],"usage":{"prompt_tokens":"11","completion_tokens":2,"total_tokens":1.3e1}}`,
			&domain.Usage{PromptTokens: 11, CompletionTokens: 2, TotalTokens: 13, Model: "m"}},
		{"responses api event, float counts", "text/event-stream",
			"data: {\"type\":\"response.completed\",\"response\":{\"model\":\"o4\",\"usage\":{\"input_tokens\":10.0,\"output_tokens\":4.0,\"total_tokens\":14.0}}}\n\n",
			&domain.Usage{PromptTokens: 10, CompletionTokens: 4, TotalTokens: 14, Model: "o4"}},
		{"ollama ndjson, float duration", "application/x-ndjson",
			`{"model":"q","done":true,"done_reason":"stop","total_duration":2.5e6,"prompt_eval_count":3,"eval_count":4}`,
			&domain.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7, DurationMS: 2, StopReason: "stop", Model: "q"}},
		{"error body", "application/json", `{"error":{"message":"rate limited","type":"rate_limit_error"}}`, nil},
		{"unknown content type", "text/plain", `{"usage":{"prompt_tokens":1}}`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Whole, then split at every byte boundary across two writes.
			for cut := -1; cut <= len(c.body); cut++ {
				s := provider.NewUsageScanner(c.ct)
				if cut < 0 {
					s.Write([]byte(c.body))
				} else {
					s.Write([]byte(c.body[:cut]))
					s.Write([]byte(c.body[cut:]))
				}
				got := s.Usage()
				if !sameUsage(got, c.want) {
					t.Fatalf("split at %d: usage = %+v, want %+v", cut, got, c.want)
				}
			}
		})
	}
}

func TestUsageScannerByteAtATime(t *testing.T) {
	body := "data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\ndata: [DONE]\n\n"
	s := provider.NewUsageScanner("text/event-stream")
	for i := range len(body) {
		s.Write([]byte{body[i]})
	}
	if u := s.Usage(); !sameUsage(u, &domain.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3, Model: "m"}) {
		t.Fatalf("usage = %+v", u)
	}
}

func TestUsageScannerLargeJSONReadsTail(t *testing.T) {
	// An embeddings answer larger than the scanner keeps whole.
	var b strings.Builder
	b.WriteString(`{"object":"list","model":"emb-large","data":[`)
	for i := 0; b.Len() < 6<<20; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"object":"embedding","index":1,"embedding":[0.123456789,0.987654321,-0.5]}`)
	}
	b.WriteString(`],"usage":{"prompt_tokens":4000,"total_tokens":4000}}`)
	body := b.String()
	s := provider.NewUsageScanner("application/json")
	for len(body) > 0 {
		n := min(len(body), 32<<10)
		s.Write([]byte(body[:n]))
		body = body[n:]
	}
	if u := s.Usage(); !sameUsage(u, &domain.Usage{PromptTokens: 4000, TotalTokens: 4000, Model: "emb-large"}) {
		t.Fatalf("usage = %+v", u)
	}
}

// A line too long to keep is read from its head and tail: an Ollama
// /api/generate done line whose "context" holds a long conversation's
// tokens (here ≈ 1.3 MB), and a Responses API response.completed with a
// large output. Lines after it are read as before.
func TestUsageScannerReadsOverlongLine(t *testing.T) {
	write := func(s *provider.UsageScanner, body string) {
		for len(body) > 0 {
			n := min(len(body), 32<<10)
			s.Write([]byte(body[:n]))
			body = body[n:]
		}
	}
	var b strings.Builder
	b.WriteString(`{"model":"qwen3","created_at":"t","response":"","done":true,"done_reason":"stop","context":[`)
	for i := range 180_000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(100_000 + i))
	}
	b.WriteString(`],"total_duration":2500000000,"prompt_eval_count":170000,"eval_count":10000}` + "\n")
	if b.Len() < 1<<20 {
		t.Fatalf("the line is %d bytes, not over the 1 MiB kept", b.Len())
	}
	want := &domain.Usage{PromptTokens: 170000, CompletionTokens: 10000, TotalTokens: 180000, DurationMS: 2500, StopReason: "stop", Model: "qwen3"}
	s := provider.NewUsageScanner("application/x-ndjson")
	write(s, b.String())
	if u := s.Usage(); !sameUsage(u, want) {
		t.Fatalf("ollama usage = %+v, want %+v", u, want)
	}
	one := provider.NewUsageScanner("application/x-ndjson") // the line in one write
	one.Write([]byte(b.String()))
	if u := one.Usage(); !sameUsage(u, want) {
		t.Fatalf("ollama usage, one write = %+v, want %+v", u, want)
	}

	big := strings.Repeat("word ", 300_000)
	r := provider.NewUsageScanner("text/event-stream")
	write(r, "event: response.completed\ndata: "+`{"type":"response.completed","response":{"id":"resp_1","model":"gpt-5","output":[{"type":"message","content":[{"type":"output_text","text":"`+big+
		`"}]}],"usage":{"input_tokens":12,"output_tokens":300000,"total_tokens":300012}}}`+"\n\n")
	if u := r.Usage(); !sameUsage(u, &domain.Usage{PromptTokens: 12, CompletionTokens: 300000, TotalTokens: 300012, Model: "gpt-5"}) {
		t.Fatalf("responses usage = %+v", u)
	}

	after := provider.NewUsageScanner("application/x-ndjson")
	write(after, `{"pad":"`+strings.Repeat("x", 2<<20)+`","done":true,"prompt_eval_count":99}`+"\n")
	after.Write([]byte(`{"model":"m","done":true,"prompt_eval_count":1,"eval_count":2}` + "\n"))
	if u := after.Usage(); !sameUsage(u, &domain.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3, Model: "m"}) {
		t.Fatalf("usage after a long line = %+v", u)
	}
}

func sameUsage(a, b *domain.Usage) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// A line whose start shows it cannot carry counts is skipped without being
// kept; the lines after it, including data lines written in pieces and with
// leading blanks, are still read.
func TestUsageScannerSkipsNonDataLinesEarly(t *testing.T) {
	s := provider.NewUsageScanner("text/event-stream")
	bulk := strings.Repeat("x", 3<<20)
	for len(bulk) > 0 {
		n := min(len(bulk), 32<<10)
		s.Write([]byte(bulk[:n]))
		bulk = bulk[n:]
	}
	s.Write([]byte("\n: keep-alive\n  da"))
	s.Write([]byte(`ta: {"model":"m","usage":{"prompt_tokens":4,"completion_tokens":5}}` + "\n\n"))
	if u := s.Usage(); !sameUsage(u, &domain.Usage{PromptTokens: 4, CompletionTokens: 5, TotalTokens: 9, Model: "m"}) {
		t.Fatalf("usage = %+v", u)
	}
	n := provider.NewUsageScanner("application/x-ndjson")
	n.Write([]byte("not json at all, and long" + strings.Repeat("y", 1<<20) + "\n"))
	n.Write([]byte(` {"model":"o","done":true,"prompt_eval_count":2,"eval_count":3}`))
	if u := n.Usage(); !sameUsage(u, &domain.Usage{PromptTokens: 2, CompletionTokens: 3, TotalTokens: 5, Model: "o"}) {
		t.Fatalf("ndjson usage = %+v", u)
	}
}

// Lines are decoded only when they can tell something; the model named by a
// later line and the counts of a line without a model still come through.
func TestUsageScannerModelFromLaterLine(t *testing.T) {
	s := provider.NewUsageScanner("text/event-stream")
	s.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"))
	s.Write([]byte("data: {\"model\":\"late\",\"choices\":[]}\n\n"))
	s.Write([]byte("data: {\"model\":\"ignored-later\",\"choices\":[]}\n\n"))
	s.Write([]byte("data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"))
	if u := s.Usage(); !sameUsage(u, &domain.Usage{PromptTokens: 1, CompletionTokens: 1, TotalTokens: 2, Model: "late"}) {
		t.Fatalf("usage = %+v", u)
	}
}

// A body or line too large to keep whole that states "usage": null — a
// background response still queued, polled with instructions of several
// MiB, or its stream's response.created — reports no usage, not a usage
// of zeros: the edge counts a stored response's usage once, at the first
// tunnel that reports one, so zeros there lost the real counts of the
// retrieval that found it completed.
func TestUsageScannerLargeNullUsage(t *testing.T) {
	big := strings.Repeat("Answer briefly. ", 400_000) // 6.4 MB
	queued := `{"id":"resp_1","object":"response","status":"queued","background":true,"instructions":"` + big +
		`","model":"gpt-5","output":[],"usage":null,"user":null,"metadata":{}}`
	s := provider.NewUsageScanner("application/json")
	for b := queued; len(b) > 0; {
		n := min(len(b), 32<<10)
		s.Write([]byte(b[:n]))
		b = b[n:]
	}
	if u := s.Usage(); u != nil {
		t.Fatalf("usage of a queued response = %+v, want none", u)
	}

	created := "event: response.created\ndata: " + `{"type":"response.created","response":{"id":"resp_2","status":"in_progress","instructions":"` + big[:2<<20] +
		`","model":"gpt-5","output":[],"usage":null}}` + "\n\n"
	r := provider.NewUsageScanner("text/event-stream")
	r.Write([]byte(created))
	if u := r.Usage(); u != nil {
		t.Fatalf("usage of a stream cut after response.created = %+v, want none", u)
	}
}
