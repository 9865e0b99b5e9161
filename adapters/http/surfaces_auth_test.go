package httpapi_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"

	httpapi "iop/adapters/http"
	openaiapi "iop/adapters/http/openai"
	"iop/domain"
)

// The passthrough surfaces sit behind the same keys, each refusing in its
// clients' dialect; Claude Code's x-api-key is a key like Bearer, and the
// probe at / needs none.
func TestPassthroughSurfacesBehindKeys(t *testing.T) {
	reached := 0
	e := newEnvWithDeps(t, []httpapi.APIKey{apiKey("inference-key-0123456789", "agent", nil, domain.ScopeInference)}, func(_ *env, d *httpapi.Deps) {
		d.OpenAI = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			reached++
			w.WriteHeader(299)
		})
	})
	do := func(method, path string, hdr ...string) (int, string) {
		return e.call(method, path, `{"model":"m"}`, hdr...)
	}

	// Without a key: each surface's own error shape.
	code, b := do("POST", "/v1/messages?beta=true")
	var ae struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if code != 401 || json.Unmarshal([]byte(b), &ae) != nil || ae.Type != "error" || ae.Error.Type != "authentication_error" {
		t.Fatalf("/v1/messages without a key: %d %s", code, b)
	}
	for path, want := range map[string]string{
		"/v1/messages/count_tokens": `"type":"authentication_error"`,
		"/v1/responses":             `"code":"invalid_api_key"`,
		"/v1/responses/resp_1":      `"code":"invalid_api_key"`,
		"/v1/audio/transcriptions":  `"code":"invalid_api_key"`,
		"/v1/images/generations":    `"code":"invalid_api_key"`,
		"/v1/rerank":                `"code":"invalid_api_key"`,
		"/api/pull":                 `{"error":"`,
	} {
		if code, b := do("POST", path); code != 401 || !strings.Contains(b, want) {
			t.Errorf("%s without a key: %d %s", path, code, b)
		}
	}
	// The Anthropic SDK's /v1/models and its other routes (which the edge
	// does not serve) name an anthropic-version: refused in its shape; the
	// same route asked by an OpenAI SDK keeps OpenAI's.
	for _, c := range []struct{ method, path, want string }{
		{"GET", "/v1/models", `"type":"authentication_error"`},
		{"GET", "/v1/models/claude-sonnet-4-5", `"type":"authentication_error"`},
		{"POST", "/v1/complete", `"type":"authentication_error"`},
	} {
		if code, b := do(c.method, c.path, "Anthropic-Version", "2023-06-01"); code != 401 || !strings.Contains(b, c.want) || !strings.HasPrefix(b, `{"type":"error"`) {
			t.Errorf("%s %s from the Anthropic SDK without a key: %d %s", c.method, c.path, code, b)
		}
	}
	if code, b := do("GET", "/v1/models"); code != 401 || !strings.Contains(b, `"code":"invalid_api_key"`) {
		t.Errorf("/v1/models from an OpenAI SDK without a key: %d %s", code, b)
	}
	if code, b := do("POST", "/v1/complete", "X-Api-Key", "inference-key-0123456789", "Anthropic-Version", "2023-06-01"); code != 404 || !strings.Contains(b, `"type":"not_found_error"`) {
		t.Errorf("an Anthropic route the edge does not serve: %d %s", code, b)
	}
	if code, b := do("GET", "/v1/runs", "Anthropic-Version", "2023-06-01"); code != 401 || !strings.Contains(b, `"code":"unauthorized"`) {
		t.Errorf("the iop API keeps its shape: %d %s", code, b)
	}
	if reached != 0 {
		t.Fatalf("the surface was reached %d times without a key", reached)
	}
	// With the key, as x-api-key (Claude Code) or Bearer (Codex).
	for _, c := range [][]string{
		{"POST", "/v1/messages?beta=true", "X-Api-Key", "inference-key-0123456789"},
		{"POST", "/v1/responses", "Authorization", "Bearer inference-key-0123456789"},
		{"GET", "/v1/responses/resp_1", "Authorization", "Bearer inference-key-0123456789"},
		{"POST", "/v1/audio/translations", "Authorization", "Bearer inference-key-0123456789"},
	} {
		if code, b := do(c[0], c[1], c[2], c[3]); code != 299 {
			t.Errorf("%s %s with the key: %d %s", c[0], c[1], code, b)
		}
	}
	// The probe at / needs no key.
	for _, m := range []string{"HEAD", "GET"} {
		if code, _ := do(m, "/"); code != 299 {
			t.Errorf("%s / without a key: %d", m, code)
		}
	}
}

// Every answer the edge makes itself in Anthropic's shape — a refused key,
// a route it does not serve, a refusal of the passthrough surface — has a
// request id of Anthropic's shape, the same in its request-id header and
// its body's request_id, new for each answer, and named by its access-log
// line; a provider's own request-id on a relayed answer is kept and
// logged alike.
func TestAnthropicShapedAnswersCarryARequestID(t *testing.T) {
	buf := &lockedBuf{}
	e := newEnvWithDeps(t, []httpapi.APIKey{apiKey("inference-key-0123456789", "agent", nil, domain.ScopeInference)}, func(e *env, d *httpapi.Deps) {
		e.log, e.accessLog = slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})), true
		d.OpenAI = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("relay") != "" {
				w.Header().Set("Request-Id", "req_fromTheProvider")
				w.WriteHeader(200)
				return
			}
			openaiapi.WriteError(w, r, http.StatusTooManyRequests, domain.CodeAtCapacity, "every slot is busy")
		})
	})
	srv := e.srv
	shape := regexp.MustCompile(`^req_[0-9A-Za-z]{24}$`)
	seen := map[string]bool{}
	refusals := 0
	for _, c := range []struct {
		method, path string
		status       int
		typ          string
		hdr          []string
	}{
		{"POST", "/v1/messages?beta=true", 401, "authentication_error", nil},
		{"GET", "/v1/models", 401, "authentication_error", []string{"Anthropic-Version", "2023-06-01"}},
		{"POST", "/v1/complete", 404, "not_found_error", []string{"X-Api-Key", "inference-key-0123456789", "Anthropic-Version", "2023-06-01"}},
		{"POST", "/v1/messages", 429, "rate_limit_error", []string{"X-Api-Key", "inference-key-0123456789"}},
		{"POST", "/v1/messages", 429, "rate_limit_error", []string{"X-Api-Key", "inference-key-0123456789"}},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(`{"model":"m"}`))
		for i := 0; i+1 < len(c.hdr); i += 2 {
			req.Header.Set(c.hdr[i], c.hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body struct {
			Type      string `json:"type"`
			Error     struct{ Type, Message string }
			RequestID string `json:"request_id"`
		}
		id := resp.Header.Get("request-id")
		if resp.StatusCode != c.status || json.Unmarshal(b, &body) != nil || body.Type != "error" || body.Error.Type != c.typ {
			t.Fatalf("%s %s: %d %s", c.method, c.path, resp.StatusCode, b)
		}
		if !shape.MatchString(id) || body.RequestID != id {
			t.Fatalf("%s %s: request-id header %q, body request_id %q (want one req_ id in both): %s", c.method, c.path, id, body.RequestID, b)
		}
		if seen[id] {
			t.Fatalf("%s %s: request id %q given twice", c.method, c.path, id)
		}
		if c.status == 401 && refusals > 0 {
			// Refusals before the route are logged once per address per
			// 10 s (Server.logRefused): only the first has a line.
			refusals++
			continue
		}
		refusals += map[bool]int{true: 1}[c.status == 401]
		seen[id] = true
	}
	resp, err := http.DefaultClient.Do(func() *http.Request {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/messages?relay=1", strings.NewReader(`{}`))
		req.Header.Set("X-Api-Key", "inference-key-0123456789")
		return req
	}())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("request-id"); got != "req_fromTheProvider" {
		t.Fatalf("a relayed answer's request-id = %q, want the provider's", got)
	}
	seen["req_fromTheProvider"] = true
	logged := map[string]bool{}
	for _, l := range buf.lines() {
		if id, ok := l["request_id"].(string); ok {
			logged[id] = true
		}
	}
	for id := range seen {
		if !logged[id] {
			t.Errorf("no access-log line names request id %s (logged: %v)", id, logged)
		}
	}
}

// A passthrough request on an unclean path (a base URL ending in "/"
// doubles the slash) is moved with 308 in its surface's shape, typed as
// what it is: an invalid request, never a refused key (Anthropic's
// authentication_error, OpenAI's invalid_api_key), which would send the
// caller to check a key the edge accepted.
func TestMovedPassthroughRequestsAreNotKeyErrors(t *testing.T) {
	e := newEnvWithDeps(t, []httpapi.APIKey{apiKey("inference-key-0123456789", "agent", nil, domain.ScopeInference)}, func(_ *env, d *httpapi.Deps) {
		d.OpenAI = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			t.Error("a request on an unclean path reached the passthrough")
		})
	})
	srv := e.srv
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, c := range []struct {
		path, loc string
		hdr       []string
	}{
		{"//v1/messages?beta=true", "/v1/messages?beta=true", []string{"X-Api-Key", "inference-key-0123456789", "Anthropic-Version", "2023-06-01"}},
		{"/v1/./messages/count_tokens", "/v1/messages/count_tokens", []string{"X-Api-Key", "inference-key-0123456789"}},
		{"//v1/models", "/v1/models", []string{"Authorization", "Bearer inference-key-0123456789", "Anthropic-Version", "2023-06-01"}},
		{"//v1/chat/completions", "/v1/chat/completions", []string{"Authorization", "Bearer inference-key-0123456789"}},
	} {
		req, _ := http.NewRequest("POST", srv.URL+c.path, strings.NewReader(`{"model":"m"}`))
		for i := 0; i+1 < len(c.hdr); i += 2 {
			req.Header.Set(c.hdr[i], c.hdr[i+1])
		}
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != c.loc {
			t.Fatalf("POST %s: %d Location %q, want 308 to %s: %s", c.path, resp.StatusCode, resp.Header.Get("Location"), c.loc, b)
		}
		var body struct {
			Type  string `json:"type"`
			Error struct {
				Type, Message string
				Code          *string
			}
		}
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatalf("POST %s: %v: %s", c.path, err, b)
		}
		if strings.Contains(c.path, "messages") || len(c.hdr) > 2 { // Anthropic's shape
			if body.Type != "error" || body.Error.Type != "invalid_request_error" || !strings.Contains(body.Error.Message, c.loc[:strings.IndexAny(c.loc+"?", "?")]) {
				t.Errorf("POST %s: %s, want an invalid_request_error naming the clean path", c.path, b)
			}
			continue
		}
		if body.Error.Type != "invalid_request_error" || body.Error.Code == nil || *body.Error.Code != "moved" {
			t.Errorf("POST %s: %s, want type invalid_request_error, code moved", c.path, b)
		}
	}
}

// A refused key on the Anthropic surface says "x-should-retry: false", as
// Anthropic's API does: without it Claude Code retries a 401 ten times,
// backing off for minutes, before it reports the key. A refusal that may
// pass (a rate limit) and the OpenAI and iop shapes carry no such header.
func TestAnthropicKeyRefusalsSayDoNotRetry(t *testing.T) {
	e := newEnvWithDeps(t, []httpapi.APIKey{
		apiKey("inference-key-0123456789", "agent", nil, domain.ScopeInference),
		apiKey("read-only-key-0123456789", "viewer", nil, domain.ScopeRead),
	}, func(_ *env, d *httpapi.Deps) {
		d.OpenAI = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(299) })
	})
	do := func(path string, hdr ...string) *http.Response {
		resp := e.do("POST", path, `{"model":"m"}`, hdr...)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for _, c := range []struct {
		name, path string
		hdr        []string
		status     int
		retry      string
	}{
		{"no key", "/v1/messages?beta=true", nil, 401, "false"},
		{"wrong key", "/v1/messages?beta=true", []string{"X-Api-Key", "wrong-key"}, 401, "false"},
		{"wrong bearer", "/v1/messages/count_tokens", []string{"Authorization", "Bearer wrong-key"}, 401, "false"},
		{"models, wrong key", "/v1/models", []string{"X-Api-Key", "wrong-key", "Anthropic-Version", "2023-06-01"}, 401, "false"},
		{"key without the scope", "/v1/messages", []string{"X-Api-Key", "read-only-key-0123456789"}, 403, "false"},
		{"OpenAI shape", "/v1/responses", []string{"Authorization", "Bearer wrong-key"}, 401, ""},
		{"the key", "/v1/messages", []string{"X-Api-Key", "inference-key-0123456789"}, 299, ""},
	} {
		resp := do(c.path, c.hdr...)
		if resp.StatusCode != c.status || resp.Header.Get("X-Should-Retry") != c.retry {
			t.Errorf("%s: %d x-should-retry %q, want %d %q", c.name, resp.StatusCode, resp.Header.Get("X-Should-Retry"), c.status, c.retry)
		}
	}
	// Wrong keys until the address is throttled: that 429 may pass.
	for i := 0; ; i++ {
		resp := do("/v1/messages", "X-Api-Key", "wrong-key")
		if resp.StatusCode == http.StatusTooManyRequests {
			if v := resp.Header.Get("X-Should-Retry"); v != "" {
				t.Errorf("throttled: x-should-retry %q", v)
			}
			break
		}
		if i == 2*httpapi.DefaultFailureBurst {
			t.Fatalf("never throttled: %d", resp.StatusCode)
		}
	}
}

// Every answer the edge makes itself in OpenAI's shape — a refused key, a
// key without the scope, a request moved to its clean path, a refusal of
// the passthrough surface — has a request id in its x-request-id header,
// as OpenAI's API answers (the SDKs keep it as the error's request id,
// Codex prints it), new for each answer and named by its access-log line;
// a provider's own x-request-id on a relayed answer is kept and logged
// alike.
func TestOpenAIShapedAnswersCarryARequestID(t *testing.T) {
	buf := &lockedBuf{}
	e := newEnvWithDeps(t, []httpapi.APIKey{
		apiKey("inference-key-0123456789", "agent", nil, domain.ScopeInference),
		apiKey("read-only-key-0123456789", "viewer", nil, domain.ScopeRead),
	}, func(e *env, d *httpapi.Deps) {
		e.log, e.accessLog = slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})), true
		d.OpenAI = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("relay") != "" {
				w.Header().Set("X-Request-Id", "req_fromTheProvider")
				w.WriteHeader(200)
				return
			}
			openaiapi.WriteError(w, r, http.StatusServiceUnavailable, domain.CodeNoNodeAvailable, "no node")
		})
	})
	srv := e.srv
	shape := regexp.MustCompile(`^req_[0-9A-Za-z]{24}$`)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	seen, logs := map[string]bool{}, map[string]bool{}
	for _, c := range []struct {
		method, path string
		status       int
		code         string
		hdr          []string
	}{
		{"POST", "/v1/chat/completions", 401, "invalid_api_key", []string{"Authorization", "Bearer wrong-key"}},
		{"POST", "/v1/responses", 403, "insufficient_permissions", []string{"Authorization", "Bearer read-only-key-0123456789"}},
		{"POST", "//v1/responses", 308, "moved", []string{"Authorization", "Bearer inference-key-0123456789"}},
		{"POST", "/v1/responses", 503, "no_node_available", []string{"Authorization", "Bearer inference-key-0123456789"}},
		{"POST", "/v1/embeddings", 503, "no_node_available", []string{"Authorization", "Bearer inference-key-0123456789"}},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(`{"model":"m"}`))
		for i := 0; i+1 < len(c.hdr); i += 2 {
			req.Header.Set(c.hdr[i], c.hdr[i+1])
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body struct {
			Error struct{ Type, Message, Code string }
		}
		id := resp.Header.Get("x-request-id")
		if resp.StatusCode != c.status || json.Unmarshal(b, &body) != nil || body.Error.Code != c.code || body.Error.Type == "" {
			t.Fatalf("%s %s: %d %s", c.method, c.path, resp.StatusCode, b)
		}
		if !shape.MatchString(id) || seen[id] {
			t.Fatalf("%s %s: x-request-id %q (want a new req_ id)", c.method, c.path, id)
		}
		seen[id] = true
		// Refusals before the route are logged once per address per 10 s
		// (Server.logRefused): of the 401 and the 403, only the first.
		logs[id] = c.status != 403
	}
	req, _ := http.NewRequest("POST", srv.URL+"/v1/responses?relay=1", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer inference-key-0123456789")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("x-request-id"); got != "req_fromTheProvider" {
		t.Fatalf("a relayed answer's x-request-id = %q, want the provider's", got)
	}
	logs["req_fromTheProvider"] = true
	logged := map[string]bool{}
	for _, l := range buf.lines() {
		if id, ok := l["request_id"].(string); ok {
			logged[id] = true
		}
	}
	for id, must := range logs {
		if must && !logged[id] {
			t.Errorf("no access-log line names request id %s (logged: %v)", id, logged)
		}
	}
}
