package openai_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/adapters/runtime/internal/standin"
	"iop/adapters/store/memory"
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

// A 200 application/json answer that is JSON but no chat completion (a
// gateway's {"detail": …}, [], an object without "choices") used to
// complete the run with an empty reply, and a session stored an empty
// assistant turn; the streamed path fails the same answer. It fails with
// provider_error quoting what came, and the session keeps nothing. A
// completion whose content is empty still completes.
func TestJSONThatIsNoCompletionFailsTheRun(t *testing.T) {
	for _, body := range []string{`{"detail":"Upstream gateway says no"}`, `[]`, `{}`, `{"id":"x","object":"chat.completion"}`, `{"choices":null}`, `"ok"`} {
		srv := standin.NewServer(t, status(200, body))
		chats := memory.NewChatStore()
		a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, chats)
		sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi"), SessionID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
		if !strings.Contains(ev.Error.Message, "not a chat completion") || !strings.Contains(ev.Error.Message, body) {
			t.Errorf("%s: message = %q, want it to say it is no completion and quote it", body, ev.Error.Message)
		}
		if msgs, _ := chats.LoadChat(context.Background(), "llm", "s1", 0); len(msgs) != 0 {
			t.Errorf("%s: the session stored %+v", body, msgs)
		}
	}
	srv := standin.NewServer(t, status(200, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"stop"}]}`))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	if ev := requireTerminal(t, sink, domain.EventComplete, ""); ev.Usage == nil || ev.Usage.StopReason != "stop" {
		t.Errorf("empty completion: %+v", ev)
	}
}

// A 200 answer that echoes the request's credentials — a gateway's page
// dumping the headers it got, a mid-stream error or a JSON body quoting the
// key — is quoted in the run's error without them, as a 401 is: the key
// is the node's.
func TestAnswerEchoingTheKeyIsRedacted(t *testing.T) {
	t.Setenv("IOP_TEST_OPENAI_KEY", "sk-node-secret-key")
	for name, answer := range map[string]func(w http.ResponseWriter, auth string){
		"text page": func(w http.ResponseWriter, auth string) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "debug echo\nAuthorization: "+auth+"\n")
		},
		"json": func(w http.ResponseWriter, auth string) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"detail":"got Authorization: `+auth+`"}`)
		},
		"mid-stream error": func(w http.ResponseWriter, auth string) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, events("\n", `{"error":{"message":"key `+auth+` is revoked"}}`, "[DONE]"))
		},
	} {
		srv := standin.NewServer(t, func(w http.ResponseWriter, r *http.Request) { answer(w, r.Header.Get("Authorization")) })
		a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL, APIKeyEnv: "IOP_TEST_OPENAI_KEY"}, nil)
		sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
		if err != nil {
			t.Fatal(err)
		}
		ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
		if strings.Contains(ev.Error.Message, "sk-node-secret-key") || !strings.Contains(ev.Error.Message, "Bearer [redacted]") {
			t.Errorf("%s: message = %q", name, ev.Error.Message)
		}
	}
}
