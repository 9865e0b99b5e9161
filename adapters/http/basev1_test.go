package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	httpapi "iop/adapters/http"
	"iop/domain"
)

// A client whose base URL lacks its /v1 (an OpenAI SDK given
// http://host:port asks POST /chat/completions) or has one too many
// (Claude Code given http://host:port/v1 asks /v1/v1/messages) is told
// where the route is and which base URL its kind of client takes, in the
// route's own shape; it used to get a bare "no route for POST
// /chat/completions" in the iop API's shape. The iop API's own routes and
// paths no route takes keep the plain 404.
func TestABaseURLWithoutV1IsNamed(t *testing.T) {
	e := newEnvWithDeps(t, []httpapi.APIKey{apiKey("inference-key-0123456789", "agent", nil, domain.ScopeInference, domain.ScopeRead)}, func(_ *env, d *httpapi.Deps) {
		d.OpenAI = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(299) })
	})
	srv := e.srv

	// The official OpenAI client, its base URL without /v1.
	client := openai.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey("inference-key-0123456789"), option.WithMaxRetries(0))
	_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Type != "invalid_request_error" || apiErr.Code != "not_found" ||
		!strings.Contains(apiErr.Message, "this edge serves /v1/chat/completions") || !strings.Contains(apiErr.Message, "with /v1 (http://host:port/v1)") {
		t.Fatalf("chat completion at a base URL without /v1: %v", err)
	}

	do := func(method, path string, hdr ...string) (int, string) {
		return e.call(method, path, `{"model":"m"}`, hdr...)
	}
	bearer := []string{"Authorization", "Bearer inference-key-0123456789"}
	for _, c := range []struct {
		method, path string
		hdr          []string
		want         []string // in the body
	}{
		{"POST", "/responses", bearer, []string{`"type":"invalid_request_error"`, "this edge serves /v1/responses;", "with /v1"}},
		{"GET", "/models", bearer, []string{`"type":"invalid_request_error"`, "this edge serves /v1/models;"}},
		{"POST", "/v1/v1/chat/completions", bearer, []string{`"type":"invalid_request_error"`, "this edge serves /v1/chat/completions;", "with /v1 once"}},
		{"POST", "/messages", []string{"X-Api-Key", "inference-key-0123456789", "Anthropic-Version", "2023-06-01"},
			[]string{`{"type":"error"`, `"type":"not_found_error"`, "this edge serves /v1/messages (the path lacks /v1)"}},
		{"POST", "/v1/v1/messages?beta=true", []string{"X-Api-Key", "inference-key-0123456789", "Anthropic-Version", "2023-06-01"},
			[]string{`{"type":"error"`, `"type":"not_found_error"`, "this edge serves /v1/messages; Anthropic SDKs and Claude Code take its URL without /v1 (http://host:port)"}},
		{"GET", "/runs", bearer, []string{`{"error":{"code":"not_found","message":"no route for GET /runs"}}`}},
		{"GET", "/nothing", bearer, []string{`{"error":{"code":"not_found","message":"no route for GET /nothing"}}`}},
	} {
		code, b := do(c.method, c.path, c.hdr...)
		if code != 404 || !json.Valid([]byte(b)) {
			t.Errorf("%s %s: %d %s", c.method, c.path, code, b)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(b, w) {
				t.Errorf("%s %s: %s, want %s in it", c.method, c.path, b, w)
			}
		}
	}
	// Without a key nothing is said of the routes.
	if code, b := do("POST", "/chat/completions"); code != 401 || strings.Contains(b, "/v1") {
		t.Errorf("without a key: %d %s", code, b)
	}
}
