package provider_test

import (
	"strings"
	"testing"

	"iop/adapters/provider"
	"iop/domain"
)

// A provider that fails after it began a successful stream says so inside
// the body: the scanner notices the first such error of each family, and
// nothing in a stream that merely talks about errors.
func TestUsageScannerStreamError(t *testing.T) {
	cases := []struct {
		name, ct, body string
		want           *domain.ProviderStreamError
		usage          *domain.Usage
	}{
		{"anthropic event: error after message_start", "text/event-stream",
			"event: message_start\n" +
				`data: {"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"claude-x","usage":{"input_tokens":12,"output_tokens":1}}}` + "\n\n" +
				"event: error\n" +
				`data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}` + "\n\n",
			&domain.ProviderStreamError{Type: "overloaded_error", Message: "Overloaded"},
			&domain.Usage{PromptTokens: 12, CompletionTokens: 1, TotalTokens: 13, Model: "claude-x"}},
		{"openai-compatible data: {error} chunk, CRLF", "text/event-stream",
			"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n" +
				"data: {\"error\":{\"message\":\"upstream timed out\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\r\n\r\n" +
				"data: [DONE]\r\n\r\n",
			&domain.ProviderStreamError{Type: "server_error", Message: "upstream timed out"}, nil},
		{"openai-compatible error with a numeric code only (vLLM)", "text/event-stream",
			`data: {"error":{"object":"error","message":"context too long","code":400}}` + "\n\n",
			&domain.ProviderStreamError{Type: "400", Message: "context too long"}, nil},
		{"responses api error event", "text/event-stream",
			"event: error\n" + `data: {"type":"error","code":"rate_limit_exceeded","message":"slow down","param":null,"sequence_number":3}` + "\n\n",
			&domain.ProviderStreamError{Type: "rate_limit_exceeded", Message: "slow down"}, nil},
		{"responses api response.failed", "text/event-stream",
			"event: response.created\n" + `data: {"type":"response.created","response":{"id":"r","model":"gpt-x","status":"in_progress","error":null}}` + "\n\n" +
				"event: response.failed\n" + `data: {"type":"response.failed","response":{"id":"r","model":"gpt-x","status":"failed","error":{"code":"server_error","message":"boom"}}}` + "\n\n",
			&domain.ProviderStreamError{Type: "server_error", Message: "boom"}, nil},
		{"ollama final error line without newline", "application/x-ndjson",
			`{"model":"llama3.2","message":{"role":"assistant","content":"Hi"},"done":false}` + "\n" +
				`{"error":"an error was encountered while running the model: unexpected EOF"}`,
			&domain.ProviderStreamError{Message: "an error was encountered while running the model: unexpected EOF"}, nil},
		{"ollama pull error line", "application/x-ndjson",
			`{"status":"pulling manifest"}` + "\n" + `{"error":"pull model manifest: file does not exist"}` + "\n",
			&domain.ProviderStreamError{Message: "pull model manifest: file does not exist"}, nil},
		{"the first error is kept", "application/x-ndjson",
			`{"error":"first"}` + "\n" + `{"error":"second"}` + "\n",
			&domain.ProviderStreamError{Message: "first"}, nil},
		{"text about errors is no error", "text/event-stream",
			`data: {"model":"m","choices":[{"delta":{"content":"the \"error\": field {\"error\":1}"}}]}` + "\n\n" +
				`data: {"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3},"error":null}` + "\n\n",
			nil, &domain.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3, Model: "m"}},
		{"a plain JSON body is not a stream", "application/json",
			`{"error":{"type":"invalid_request_error","message":"bad"}}`, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Fed in 7-byte pieces: lines split across writes.
			s := provider.NewUsageScanner(c.ct)
			for b := []byte(c.body); len(b) > 0; {
				n := min(len(b), 7)
				s.Write(b[:n])
				b = b[n:]
			}
			got := s.StreamError()
			switch {
			case c.want == nil && got != nil:
				t.Fatalf("stream error %+v, want none", *got)
			case c.want != nil && (got == nil || *got != *c.want):
				t.Fatalf("stream error %+v, want %+v", got, *c.want)
			}
			u := s.Usage()
			if (u == nil) != (c.usage == nil) || (u != nil && *u != *c.usage) {
				t.Fatalf("usage %+v, want %+v", u, c.usage)
			}
		})
	}
}

// A provider's error text is cut to its bounds and made valid UTF-8.
func TestUsageScannerStreamErrorBounded(t *testing.T) {
	s := provider.NewUsageScanner("text/event-stream")
	s.Write([]byte(`data: {"type":"error","error":{"type":"` + strings.Repeat("t", 500) + `","message":"` + strings.Repeat("m", 5000) + "\xff" + `"}}` + "\n\n"))
	got := s.StreamError()
	if got == nil || len(got.Type) != domain.MaxStreamErrorType || len(got.Message) != domain.MaxStreamErrorMessage {
		t.Fatalf("stream error %+v, want its type cut to %d bytes and its message to %d", got, domain.MaxStreamErrorType, domain.MaxStreamErrorMessage)
	}
}
