package openai_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/adapters/runtime/internal/standin"
	"iop/domain"
)

// A 200 answer that is no event stream at all — a proxy's login page, a
// captive portal — fails the run with what came back, not only with "the
// stream ended before [DONE]".
func TestNonStreamAnswerIsNamed(t *testing.T) {
	const page = "<!DOCTYPE html>\n<html><head><title>Sign in to Corp Proxy</title></head>\n<body><form action=\"/login\"></form></body></html>\n"
	srv := standin.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, page)
	})
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
	if !strings.Contains(ev.Error.Message, "text/html") || !strings.Contains(ev.Error.Message, "Sign in to Corp Proxy") {
		t.Errorf("message = %q, want the content type and the start of the body", ev.Error.Message)
	}
}
