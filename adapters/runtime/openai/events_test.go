package openai_test

import (
	"testing"

	"iop/adapters/runtime/internal/standin"
	"iop/domain"
)

// An SSE event named "error" is the server reporting a failure, whatever
// its data looks like: the run fails with its message, even though a
// [DONE] follows.
func TestErrorEventFailsTheRun(t *testing.T) {
	for name, data := range map[string]string{
		"message object": `{"message":"boom"}`,
		"error object":   `{"type":"error","error":{"type":"overloaded_error","message":"boom"}}`,
		"plain text":     `boom`,
	} {
		t.Run(name, func(t *testing.T) {
			srv := standin.NewServer(t, sse(events("\n", chunk(`{"content":"par"}`, ""), "event: error", data, "[DONE]")))
			a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
			sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
			if err != nil {
				t.Fatal(err)
			}
			ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
			if ev.Error.Message != "boom" {
				t.Errorf("message = %q, want %q", ev.Error.Message, "boom")
			}
		})
	}
}
