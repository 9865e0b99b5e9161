package openaiapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
)

func do(t *testing.T, method, url, payload string, hdr ...string) *http.Response {
	t.Helper()
	var rd io.Reader
	if payload != "" {
		rd = strings.NewReader(payload)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestRootAnswersLikeOllama(t *testing.T) {
	e := newEnv(t)
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		resp := do(t, m, e.srv.URL+"/", "")
		got := readAll(t, resp)
		want := "Ollama is running"
		if m == http.MethodHead {
			want = ""
		}
		if resp.StatusCode != 200 || got != want || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" || resp.ContentLength != 17 {
			t.Fatalf("%s / = %d %q %v", m, resp.StatusCode, got, resp.Header)
		}
	}
}

func TestRoutesByFamilyAndDialects(t *testing.T) {
	e := newEnv(t)
	link := e.node(t, "gpu", serve(response(200, "application/json", `{"id":"resp_1"}`)...),
		provider("ant", domain.ProviderAnthropic, "claude-x"), provider("vllm", domain.ProviderOpenAI, "qwen", "whisper-1"), provider("ol", domain.ProviderOllama, "tiny"))
	for _, c := range []struct{ path, body, wantProv string }{
		{"/v1/messages?beta=true", `{"model":"claude-x","max_tokens":5,"messages":[]}`, "ant"},
		{"/v1/messages/count_tokens", `{"model":"claude-x","messages":[]}`, "ant"},
		{"/v1/responses", `{"input":"hi","model":"qwen"}`, "vllm"},
		{"/v1/images/generations", `{"model":"qwen","prompt":"a cat"}`, "vllm"},
		{"/v1/rerank", `{"model":"qwen","query":"q","documents":["a"]}`, "vllm"},
	} {
		resp := do(t, http.MethodPost, e.srv.URL+c.path, c.body, "X-Api-Key", "sk-edge-key", "Anthropic-Version", "2023-06-01")
		if got := readAll(t, resp); resp.StatusCode != 200 || got != `{"id":"resp_1"}` {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, got)
		}
		o := link.last(t)
		path, query, _ := strings.Cut(c.path, "?")
		if o.req.Provider != c.wantProv || o.req.Path != path || o.req.Query != query || string(o.body) != c.body {
			t.Fatalf("%s: forwarded %+v %q", c.path, o.req, o.body)
		}
		if o.req.Header.Get("X-Api-Key") != "" || o.req.Header.Get("Anthropic-Version") != "2023-06-01" {
			t.Fatalf("%s: forwarded header %v (the caller's key must stay at the edge, anthropic-version must pass)", c.path, o.req.Header)
		}
	}

	// Multipart: the model is a form field.
	var mb bytes.Buffer
	mw := multipart.NewWriter(&mb)
	fw, _ := mw.CreateFormFile("file", "a.wav")
	fw.Write(bytes.Repeat([]byte("RIFF"), 1000))
	mw.WriteField("model", "whisper-1")
	mw.Close()
	resp := do(t, http.MethodPost, e.srv.URL+"/v1/audio/transcriptions", mb.String(), "Content-Type", mw.FormDataContentType())
	if got := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("transcriptions: %d %s", resp.StatusCode, got)
	}
	if o := link.last(t); o.req.Provider != "vllm" || !bytes.Equal(o.body, mb.Bytes()) {
		t.Fatalf("transcriptions forwarded to %s, %d bytes of %d", o.req.Provider, len(o.body), mb.Len())
	}

	// Errors the edge writes, each in its route's dialect.
	type anthropicErr struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	resp = do(t, http.MethodPost, e.srv.URL+"/v1/messages", `{"model":"nope","messages":[]}`)
	var ae anthropicErr
	if got := readAll(t, resp); resp.StatusCode != 404 || json.Unmarshal([]byte(got), &ae) != nil || ae.Type != "error" || ae.Error.Type != "not_found_error" || ae.Error.Message == "" {
		t.Fatalf("/v1/messages unknown model: %d %s", resp.StatusCode, got)
	}
	resp = do(t, http.MethodPost, e.srv.URL+"/v1/messages", `{"x":`+strings.Repeat("[", 200))
	if got := readAll(t, resp); resp.StatusCode != 400 || json.Unmarshal([]byte(got), &ae) != nil || ae.Error.Type != "invalid_request_error" || !strings.Contains(ae.Error.Message, "deeper than 128") {
		t.Fatalf("/v1/messages too deep: %d %s", resp.StatusCode, got)
	}
	resp = do(t, http.MethodPost, e.srv.URL+"/v1/responses", `{"model":"nope"}`)
	if got := readAll(t, resp); resp.StatusCode != 404 || !strings.Contains(got, `"code":"model_not_found"`) || !strings.Contains(got, `"type":"invalid_request_error"`) {
		t.Fatalf("/v1/responses unknown model: %d %s", resp.StatusCode, got)
	}
	resp = do(t, http.MethodPost, e.srv.URL+"/api/chat", `{"model":"tiny3"}`)
	if got := readAll(t, resp); resp.StatusCode != 404 || got != `{"error":"model 'tiny3' not found"}`+"\n" || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Fatalf("/api/chat unknown model: %d %q %v", resp.StatusCode, got, resp.Header)
	}
	resp = do(t, http.MethodPost, e.srv.URL+"/api/chat", `{"a":`+strings.Repeat(`{"a":`, 200))
	if got := readAll(t, resp); resp.StatusCode != 400 || !strings.HasPrefix(got, `{"error":"request body nests`) {
		t.Fatalf("/api/chat too deep: %d %s", resp.StatusCode, got)
	}
}

func TestResponsesFollowUpsGoToTheCreatingNode(t *testing.T) {
	e := newEnv(t)
	created := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_abc\",\"object\":\"response\",\"status\":\"in_progress\"}}\n\n"
	a := e.node(t, "a", serve(response(200, "text/event-stream", created[:40], created[40:])...), provider("p", domain.ProviderOpenAI, "m"))
	b := e.node(t, "b", serve(response(200, "application/json", `{"id":"resp_other"}`)...), provider("p", domain.ProviderOpenAI, "m"))
	resp := do(t, http.MethodPost, e.srv.URL+"/v1/responses", `{"model":"m","stream":true}`, "X-IOP-Node", "a")
	if got := readAll(t, resp); got != created {
		t.Fatalf("create: %q", got)
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/resp_abc"},
		{http.MethodDelete, "/v1/responses/resp_abc"},
		{http.MethodPost, "/v1/responses/resp_abc/cancel"},
		{http.MethodGet, "/v1/responses/resp_abc/input_items"},
	} {
		before := len(b.calls)
		resp := do(t, c.method, e.srv.URL+c.path, "")
		readAll(t, resp)
		if o := a.last(t); o.req.Path != c.path || o.req.Method != c.method || len(b.calls) != before {
			t.Fatalf("%s %s went to %+v", c.method, c.path, o.req)
		}
	}
	resp = do(t, http.MethodGet, e.srv.URL+"/v1/responses/resp_unknown", "")
	if got := readAll(t, resp); resp.StatusCode != 404 || !strings.Contains(got, "resp_unknown") {
		t.Fatalf("unknown id with two nodes: %d %s", resp.StatusCode, got)
	}
}

// TestChainedResponseGoesToTheNodeHoldingThePrevious: a create that
// continues a response (previous_response_id) goes to the node and provider
// that created that response, though another node serving the model is
// less busy; an id the edge did not see is routed by model.
func TestChainedResponseGoesToTheNodeHoldingThePrevious(t *testing.T) {
	e := newEnv(t)
	hang := newFakeStream(status(200), header("Content-Type", "text/event-stream"), body("data: {}\n\n"))
	t.Cleanup(hang.Close)
	var mu sync.Mutex
	made := 0
	b := e.node(t, "b", func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		if req.Path == "/v1/chat/completions" {
			return hang, nil
		}
		mu.Lock()
		defer mu.Unlock()
		made++
		return newFakeStream(response(200, "application/json", fmt.Sprintf(`{"id":"resp_b%d","object":"response"}`, made))...), nil
	}, provider("p", domain.ProviderOpenAI, "m"))
	a := e.node(t, "a", serve(response(404, "application/json", `{"error":{"message":"Previous response not found."}}`)...), provider("p", domain.ProviderOpenAI, "m"))

	resp := do(t, http.MethodPost, e.srv.URL+"/v1/responses", `{"model":"m","input":"hi"}`, "X-IOP-Node", "b")
	if got := readAll(t, resp); got != `{"id":"resp_b1","object":"response"}` {
		t.Fatalf("create: %d %s", resp.StatusCode, got)
	}
	// b now has a tunnel in flight, a none: routed by model, a wins.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	req.Header.Set("X-IOP-Node", "b")
	busy, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Body.Close()
	waitFor(t, "b busy", func() bool { v, _ := e.reg.Get("b"); return v.TunnelsInFlight == 1 })

	for _, c := range []struct {
		name, payload string
		hdr           []string
	}{
		{"id after the model", `{"model":"m","input":"more","previous_response_id":"resp_b1"}`, nil},
		{"id before the model", `{"previous_response_id":"resp_b1","input":"more","model":"m"}`, nil},
		// Over a pin elsewhere too, as the follow-ups: only b can answer.
		{"pinned to a", `{"model":"m","previous_response_id":"resp_b1"}`, []string{"X-IOP-Node", "a"}},
	} {
		before := b.count()
		resp = do(t, http.MethodPost, e.srv.URL+"/v1/responses", c.payload, c.hdr...)
		if got := readAll(t, resp); resp.StatusCode != 200 || a.count() != 0 || b.count() != before+1 {
			t.Fatalf("%s: %d %s; tunnels a %d, b %d (was %d)", c.name, resp.StatusCode, got, a.count(), b.count(), before)
		}
		if o := b.last(t); string(o.body) != c.payload || o.req.Provider != "p" {
			t.Fatalf("%s: b's provider %q got %q, want the body unchanged", c.name, o.req.Provider, o.body)
		}
	}

	// Unknown to the edge: routed by model, to the less busy a.
	resp = do(t, http.MethodPost, e.srv.URL+"/v1/responses", `{"model":"m","previous_response_id":"resp_unknown"}`)
	if got := readAll(t, resp); resp.StatusCode != 404 || a.count() != 1 {
		t.Fatalf("resp_unknown: %d %s; tunnels a %d", resp.StatusCode, got, a.count())
	}
	// Another key's, created on a node the caller may not see: refused
	// without a tunnel, naming no node (routed by model, a provider
	// sharing the upstream would replay the other key's conversation).
	limited := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := domain.Principal{Name: "team-a", Scopes: []string{domain.ScopeInference}, Nodes: []string{"a"}}
		e.h.ServeHTTP(w, r.WithContext(domain.WithPrincipal(r.Context(), p)))
	}))
	defer limited.Close()
	resp = do(t, http.MethodPost, limited.URL+"/v1/responses", `{"model":"m","previous_response_id":"resp_b1"}`)
	if got := readAll(t, resp); resp.StatusCode != 404 || !strings.Contains(got, "previous_response_not_found") || a.count() != 1 || strings.Contains(got, `"b"`) {
		t.Fatalf("resp_b1 for a key limited to a: %d %s; tunnels a %d", resp.StatusCode, got, a.count())
	}

	// An id that is no string, or named twice, is refused before any tunnel.
	for _, payload := range []string{
		`{"model":"m","previous_response_id":7}`,
		`{"model":"m","previous_response_id":"resp_b1","previous_response_id":"resp_x"}`,
	} {
		before := a.count() + b.count()
		resp = do(t, http.MethodPost, e.srv.URL+"/v1/responses", payload)
		got := readAll(t, resp)
		if resp.StatusCode != 400 || !strings.Contains(got, "previous_response_id") || a.count()+b.count() != before {
			t.Fatalf("%s: %d %s", payload, resp.StatusCode, got)
		}
	}
}

func TestOllamaModelManagementRouting(t *testing.T) {
	e := newEnv(t)
	okStream := func(domain.TunnelRequest) (ports.TunnelStream, error) {
		return newFakeStream(response(200, "application/x-ndjson", `{"status":"pulling manifest"}`+"\n", `{"status":"success"}`+"\n")...), nil
	}
	a := e.node(t, "a", okStream, provider("ol", domain.ProviderOllama, "tiny"))
	vl := e.node(t, "v", serve(), provider("vllm", domain.ProviderOpenAI, "qwen"))
	// The only node with an ollama provider takes a model no node has.
	resp := do(t, http.MethodPost, e.srv.URL+"/api/pull", `{"model":"new:1b"}`)
	if got := readAll(t, resp); resp.StatusCode != 200 || got != "{\"status\":\"pulling manifest\"}\n{\"status\":\"success\"}\n" {
		t.Fatalf("pull: %d %q", resp.StatusCode, got)
	}
	if o := a.last(t); o.req.Path != "/api/pull" {
		t.Fatalf("pull went to %+v", o.req)
	}
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/api/copy", `{"source":"tiny","destination":"tiny3"}`},
		{http.MethodDelete, "/api/delete", `{"model":"tiny"}`},
		{http.MethodPost, "/api/push", `{"model":"tiny"}`},
		{http.MethodPost, "/api/create", `{"model":"mine","from":"tiny"}`},
		{http.MethodHead, "/api/blobs/sha256:abc", ""},
		{http.MethodPost, "/api/blobs/sha256:abc", "blobdata"},
	} {
		resp := do(t, c.method, e.srv.URL+c.path, c.body)
		readAll(t, resp)
		if o := a.last(t); resp.StatusCode != 200 || o.req.Path != c.path || o.req.Method != c.method || string(o.body) != c.body {
			t.Fatalf("%s %s: %d, forwarded %+v %q", c.method, c.path, resp.StatusCode, o.req, o.body)
		}
	}
	if len(vl.calls) != 0 {
		t.Fatalf("the openai-only node got %d tunnels", len(vl.calls))
	}
	// A second ollama node: a new model needs a pin.
	e.node(t, "b", okStream, provider("ol", domain.ProviderOllama, "other"))
	resp = do(t, http.MethodPost, e.srv.URL+"/api/pull", `{"model":"new:1b"}`)
	if got := readAll(t, resp); resp.StatusCode != 400 || !strings.Contains(got, "X-IOP-Node") || !strings.Contains(got, "a, b") {
		t.Fatalf("pull with two nodes: %d %s", resp.StatusCode, got)
	}
	resp = do(t, http.MethodPost, e.srv.URL+"/api/pull", `{"model":"new:1b"}`, "X-IOP-Node", "b")
	if got := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("pinned pull: %d %s", resp.StatusCode, got)
	}
	// A blob upload names no model: the refusal says what it needs.
	resp = do(t, http.MethodPost, e.srv.URL+"/api/blobs/sha256:abc", "blobdata")
	if got := readAll(t, resp); resp.StatusCode != 400 ||
		got != `{"error":"this request needs a node: several nodes have a provider for the ollama API (a, b): choose one with the X-IOP-Node header"}`+"\n" {
		t.Fatalf("blob upload with two nodes: %d %s", resp.StatusCode, got)
	}
}

// The edge routes on the decoded path but forwards the caller's escaped
// one: an escaped "?", "#" or "%" in a blob digest stays part of the
// digest at the provider instead of becoming a query, a fragment or an
// escape the provider cannot read.
func TestEscapedPathReachesTheProviderAsSent(t *testing.T) {
	e := newEnv(t)
	a := e.node(t, "a", serve(response(200, "application/json", `{}`)...), provider("ol", domain.ProviderOllama, "tiny"))
	for _, c := range []struct{ path, query string }{
		{"/api/blobs/sha256%3Fx=1", ""},
		{"/api/blobs/sha256%23frag", ""},
		{"/api/blobs/sha256%25zz", ""},
		{"/api/blobs/sha256:%61bc", "q=%3F"},
	} {
		u := e.srv.URL + c.path
		if c.query != "" {
			u += "?" + c.query
		}
		resp := do(t, http.MethodPost, u, "blobdata")
		readAll(t, resp)
		if o := a.last(t); resp.StatusCode != 200 || o.req.Path != c.path || o.req.Query != c.query {
			t.Fatalf("%s: %d, forwarded path %q query %q", c.path, resp.StatusCode, o.req.Path, o.req.Query)
		}
	}
}

func TestOllamaPSMergesNodes(t *testing.T) {
	e := newEnv(t)
	ps := func(name string) func(domain.TunnelRequest) (ports.TunnelStream, error) {
		return func(req domain.TunnelRequest) (ports.TunnelStream, error) {
			return newFakeStream(response(200, "application/json; charset=utf-8", `{"models":[{"name":"`+name+`","size":1}]}`)...), nil
		}
	}
	e.node(t, "a", ps("tiny"), provider("ol", domain.ProviderOllama, "tiny"))
	e.node(t, "b", ps("big"), provider("ol", domain.ProviderOllama, "big"))
	resp := do(t, http.MethodGet, e.srv.URL+"/api/ps", "")
	if got := readAll(t, resp); resp.StatusCode != 200 || got != `{"models":[{"name":"tiny","size":1},{"name":"big","size":1}]}`+"\n" {
		t.Fatalf("merged ps: %d %s", resp.StatusCode, got)
	}
}

func TestRelayedResponseKeepsContentLength(t *testing.T) {
	e := newEnv(t)
	e.node(t, "a", serve(status(200), header("Content-Type", "application/json; charset=utf-8", "Content-Length", "11"), body(`{"ok":true}`), frame(domain.TunnelEnd)),
		provider("ol", domain.ProviderOllama, "tiny"))
	resp := do(t, http.MethodPost, e.srv.URL+"/api/show", `{"model":"tiny"}`)
	if got := readAll(t, resp); got != `{"ok":true}` || resp.ContentLength != 11 || len(resp.TransferEncoding) != 0 {
		t.Fatalf("relayed: %q, length %d, TE %v", got, resp.ContentLength, resp.TransferEncoding)
	}
}

func TestSlowDiscoveryDelaysListsOnlyByRefreshWait(t *testing.T) {
	e := newEnv(t)
	e.h.RefreshWait = 100 * time.Millisecond
	hang := newFakeStream() // discovery never answers
	e.node(t, "gpu", serveStream(hang), provider("ol", domain.ProviderOllama))
	e.node(t, "cpu", serve(), provider("vllm", domain.ProviderOpenAI, "qwen"))
	for _, path := range []string{"/v1/models", "/api/tags"} {
		start := time.Now()
		resp := do(t, http.MethodGet, e.srv.URL+path, "")
		got := readAll(t, resp)
		if d := time.Since(start); resp.StatusCode != 200 || d > 3*time.Second {
			t.Fatalf("%s: %d after %v: %s", path, resp.StatusCode, d, got)
		}
	}
	resp := do(t, http.MethodGet, e.srv.URL+"/v1/models", "")
	if got := readAll(t, resp); !strings.Contains(got, `"qwen"`) {
		t.Fatalf("the known models are still listed: %s", got)
	}
}

// TestFormNamingModelTwice: a form naming its model twice (the edge routes
// on the first, Starlette keeps the last) is refused with a 400, small or
// streamed, and never reaches the provider whole.
func TestFormNamingModelTwice(t *testing.T) {
	e := newEnv(t)
	link := e.node(t, "gpu", serve(response(200, "application/json", `{"text":"hi"}`)...), provider("vllm", domain.ProviderOpenAI, "whisper-1"))
	form := func(audio int, fields ...string) (string, string) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		mw.WriteField(fields[0], fields[1])
		fw, _ := mw.CreateFormFile("file", "a.wav")
		fw.Write(bytes.Repeat([]byte("RIFF"), audio/4))
		for i := 2; i+1 < len(fields); i += 2 {
			mw.WriteField(fields[i], fields[i+1])
		}
		mw.Close()
		return b.String(), mw.FormDataContentType()
	}
	for _, c := range []struct {
		name   string
		audio  int
		fields []string
	}{
		{"small", 4000, []string{"model", "whisper-1", "model", "undeclared-large"}},
		{"streamed, at its end", 3 << 20, []string{"model", "whisper-1", "language", "en", "model", "undeclared-large"}},
		{"other case", 4000, []string{"model", "whisper-1", "Model", "undeclared-large"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			body, ct := form(c.audio, c.fields...)
			before := link.count()
			resp := do(t, http.MethodPost, e.srv.URL+"/v1/audio/transcriptions", body, "Content-Type", ct)
			got := readAll(t, resp)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, "invalid_request") || !strings.Contains(got, "more than once") {
				t.Fatalf("got %d %s, want 400 naming the field twice", resp.StatusCode, got)
			}
			if link.count() != before {
				t.Fatal("a tunnel carried the whole body to the provider")
			}
		})
	}
	// One model field, and a file part that happens to be named model.
	body, ct := form(4000, "model", "whisper-1", "language", "en")
	resp := do(t, http.MethodPost, e.srv.URL+"/v1/audio/transcriptions", body, "Content-Type", ct)
	if got := readAll(t, resp); resp.StatusCode != 200 || string(link.last(t).body) != body {
		t.Fatalf("a form naming its model once: %d %s", resp.StatusCode, got)
	}
}

// TestAnthropicAliasRoutes: a request for an alias Anthropic serves (the
// listed dated id without its date) reaches the anthropic provider, the
// alias forwarded as sent.
func TestAnthropicAliasRoutes(t *testing.T) {
	e := newEnv(t)
	link := e.node(t, "gw", serve(response(200, "application/json", `{}`)...), provider("claude", domain.ProviderAnthropic, "claude-sonnet-4-5-20250929"))
	body := `{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[]}`
	resp := do(t, http.MethodPost, e.srv.URL+"/v1/messages", body, "Content-Type", "application/json")
	if got := readAll(t, resp); resp.StatusCode != 200 || string(link.last(t).body) != body {
		t.Fatalf("got %d %s", resp.StatusCode, got)
	}
	resp = do(t, http.MethodGet, e.srv.URL+"/v1/models/claude-sonnet-4-5", "", "Anthropic-Version", "2023-06-01")
	if got := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(got, `"id":"claude-sonnet-4-5-20250929"`) {
		t.Fatalf("GET /v1/models/claude-sonnet-4-5: %d %s", resp.StatusCode, got)
	}
}

// TestResponseFollowUpHidesNodesTheCallerCannotSee: a key limited to other
// nodes asking for a response created on secret-gpu gets the answer for an
// id the edge never saw, not one that names secret-gpu.
func TestResponseFollowUpHidesNodesTheCallerCannotSee(t *testing.T) {
	e := newEnv(t)
	created := `{"id":"resp_abc","object":"response","status":"completed"}`
	secret := e.node(t, "secret-gpu", serve(response(200, "application/json", created)...), provider("p", domain.ProviderOpenAI, "m"))
	e.node(t, "b", serve(response(200, "application/json", `{}`)...), provider("p", domain.ProviderOpenAI, "m"))
	e.node(t, "c", serve(response(200, "application/json", `{}`)...), provider("p", domain.ProviderOpenAI, "m"))
	resp := do(t, http.MethodPost, e.srv.URL+"/v1/responses", `{"model":"m"}`, "X-IOP-Node", "secret-gpu")
	if got := readAll(t, resp); got != created {
		t.Fatalf("create: %q", got)
	}
	limited := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := domain.Principal{Name: "team-b", Scopes: []string{domain.ScopeInference}, Nodes: []string{"b", "c"}}
		e.h.ServeHTTP(w, r.WithContext(domain.WithPrincipal(r.Context(), p)))
	}))
	defer limited.Close()
	before := secret.count()
	resp = do(t, http.MethodGet, limited.URL+"/v1/responses/resp_abc", "")
	got := readAll(t, resp)
	if resp.StatusCode != 404 || strings.Contains(got, "secret-gpu") || !strings.Contains(got, "was not created through this edge") {
		t.Fatalf("got %d %s, want the 404 of an unknown response", resp.StatusCode, got)
	}
	if secret.count() != before {
		t.Fatal("the follow-up reached secret-gpu")
	}
}

// A response is its creating key's: another key's follow-ups of it (whose
// id it may have seen on the event feed) and a create continuing it are
// answered as for an id the edge never saw, without reaching the provider,
// which would hand over its content. An admin key may follow up any. A
// node that later answers with the same id does not take its follow-ups.
// escapedPrev is "previous_response_id" spelled entirely in \u escapes.
const escapedPrev = `\u0070\u0072\u0065\u0076\u0069\u006f\u0075\u0073\u005f\u0072\u0065\u0073\u0070\u006f\u006e\u0073\u0065\u005f\u0069\u0064`

func TestResponsesBelongToTheirKey(t *testing.T) {
	e := newEnv(t)
	created := `{"id":"resp_x","object":"response","status":"completed"}`
	a := e.node(t, "a", serve(response(200, "application/json", created)...), provider("p", domain.ProviderOpenAI, "m"))
	e.node(t, "b", serve(response(200, "application/json", created)...), provider("p", domain.ProviderOpenAI, "m"))
	as := func(name string, scopes ...string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			e.h.ServeHTTP(w, r.WithContext(domain.WithPrincipal(r.Context(), domain.Principal{Name: name, Scopes: scopes})))
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	x, y, ops := as("x", domain.ScopeInference), as("y", domain.ScopeInference), as("ops", domain.ScopeAdmin)
	if got := readAll(t, do(t, http.MethodPost, x.URL+"/v1/responses", `{"model":"m"}`, "X-IOP-Node", "a")); got != created {
		t.Fatalf("create: %q", got)
	}
	// b claims the same id: ignored.
	if got := readAll(t, do(t, http.MethodPost, y.URL+"/v1/responses", `{"model":"m"}`, "X-IOP-Node", "b")); got != created {
		t.Fatalf("b's create: %q", got)
	}
	before := a.count()
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/responses/resp_x", ""},
		{http.MethodDelete, "/v1/responses/resp_x", ""},
		{http.MethodGet, "/v1/responses/resp_x/input_items", ""},
		{http.MethodPost, "/v1/responses", `{"model":"m","previous_response_id":"resp_x"}`},
		// The key spelled in escapes, as a provider's decoder reads it.
		{http.MethodPost, "/v1/responses", `{"model":"m","` + escapedPrev + `":"resp_x"}`},
		{http.MethodPost, "/v1/responses/compact", `{"model":"m","` + escapedPrev + `":"resp_x"}`},
		{http.MethodPost, "/v1/responses/input_tokens", `{"model":"m","` + escapedPrev + `":"resp_x"}`},
	} {
		resp := do(t, c.method, y.URL+c.path, c.body)
		if got := readAll(t, resp); resp.StatusCode != 404 || !strings.Contains(got, "was not created through this edge") {
			t.Errorf("y: %s %s = %d %s, want 404", c.method, c.path, resp.StatusCode, got)
		}
	}
	if a.count() != before {
		t.Fatal("another key's follow-up reached the provider")
	}
	for _, srv := range []*httptest.Server{x, ops} {
		readAll(t, do(t, http.MethodGet, srv.URL+"/v1/responses/resp_x", ""))
		if o := a.last(t); o.req.Path != "/v1/responses/resp_x" || a.count() != before+1 {
			t.Fatalf("follow-up went to %+v (%d calls on a)", o.req, a.count()-before)
		}
		before++
	}
}

// A stored response's usage is counted once: by its creation when that
// reported it, else by the first retrieval that does (a background
// response, polled until it completes); the retrievals a client polls
// with, each reporting the same usage, add nothing more. A retrieval of
// an id the edge does not remember counts nothing.
func TestStoredResponseUsageIsCountedOnce(t *testing.T) {
	e := newEnv(t)
	withUsage := func(js string, total int64) []step {
		return []step{status(200), header("Content-Type", "application/json"), body(js),
			{f: domain.TunnelFrame{Kind: domain.TunnelUsage, Usage: &domain.Usage{PromptTokens: total - 2, CompletionTokens: 2, TotalTokens: total, Model: "gpt-x-2025"}}},
			frame(domain.TunnelEnd)}
	}
	e.node(t, "a", func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		switch {
		case req.Method == http.MethodPost && strings.Contains(string(req.Body), "background"):
			return newFakeStream(response(200, "application/json", `{"id":"resp_bg","status":"queued"}`)...), nil
		case req.Method == http.MethodPost:
			return newFakeStream(withUsage(`{"id":"resp_now","status":"completed"}`, 10)...), nil
		case strings.HasSuffix(req.Path, "resp_bg"):
			return newFakeStream(withUsage(`{"id":"resp_bg","status":"completed"}`, 100)...), nil
		}
		return newFakeStream(withUsage(`{"id":"resp_now","status":"completed"}`, 10)...), nil
	}, provider("p", domain.ProviderOpenAI, "m"))
	readAll(t, do(t, http.MethodPost, e.srv.URL+"/v1/responses", `{"model":"m"}`))
	readAll(t, do(t, http.MethodPost, e.srv.URL+"/v1/responses", `{"model":"m","background":true}`))
	for range 3 {
		readAll(t, do(t, http.MethodGet, e.srv.URL+"/v1/responses/resp_now", ""))
		readAll(t, do(t, http.MethodGet, e.srv.URL+"/v1/responses/resp_bg", ""))
		readAll(t, do(t, http.MethodGet, e.srv.URL+"/v1/responses/resp_unknown", ""))
	}
	var requests, tokens int64
	var models []string
	for _, l := range e.ledger.Snapshot() {
		requests += l.Requests
		tokens += l.TotalTokens
		models = append(models, l.Model)
	}
	if requests != 11 || tokens != 110 {
		t.Fatalf("ledger: %d requests, %d tokens (lines of models %q); want 11 requests and 110 tokens (10 for resp_now's creation, 100 for resp_bg's first retrieval)", requests, tokens, models)
	}
}

// Asked by the Anthropic SDK, the models list names each model once (the
// same model on two nodes too) and pages as Anthropic's Models API does:
// limit (default 20), after_id, before_id, has_more, first_id, last_id.
func TestAnthropicModelsListPages(t *testing.T) {
	e := newEnv(t)
	for _, n := range []string{"a", "b"} {
		e.node(t, n, serve(), provider("claude", domain.ProviderAnthropic, "claude-a", "claude-b", "claude-c"))
	}
	get := func(query string) (ids []string, more bool, first, last string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/models"+query, nil)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
			HasMore bool   `json:"has_more"`
			FirstID string `json:"first_id"`
			LastID  string `json:"last_id"`
		}
		if body := readAll(t, resp); resp.StatusCode != 200 || json.Unmarshal([]byte(body), &page) != nil {
			t.Fatalf("GET /v1/models%s: %d %s", query, resp.StatusCode, body)
		}
		for _, d := range page.Data {
			ids = append(ids, d.ID)
		}
		return ids, page.HasMore, page.FirstID, page.LastID
	}
	if ids, more, _, _ := get(""); strings.Join(ids, " ") != "claude-a claude-b claude-c" || more {
		t.Fatalf("whole list: %v more=%v, want each model once", ids, more)
	}
	ids, more, first, last := get("?limit=2")
	if strings.Join(ids, " ") != "claude-a claude-b" || !more || first != "claude-a" || last != "claude-b" {
		t.Fatalf("limit=2: %v more=%v %s..%s", ids, more, first, last)
	}
	if ids, more, _, _ := get("?limit=2&after_id=" + last); strings.Join(ids, " ") != "claude-c" || more {
		t.Fatalf("after_id: %v more=%v", ids, more)
	}
	if ids, more, _, _ := get("?limit=1&before_id=claude-c"); strings.Join(ids, " ") != "claude-b" || !more {
		t.Fatalf("before_id: %v more=%v", ids, more)
	}
	// Bad paging is a 400 in Anthropic's shape: a limit out of range, or
	// both cursors (which once answered a page past limit).
	for _, q := range []string{"?limit=0", "?limit=1&after_id=claude-a&before_id=claude-c"} {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/models"+q, nil)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != 400 || !strings.Contains(body, `"type":"invalid_request_error"`) {
			t.Fatalf("%s: %d %s", q, resp.StatusCode, body)
		}
	}
}

// The answers the surface makes itself in Anthropic's shape carry a
// request id as Anthropic's API does (request-id: req_…; an error's body
// names the same one as request_id); the OpenAI and Ollama shapes have none,
// and a relayed answer keeps the provider's.
func TestAnthropicAnswersTheEdgeMakesCarryARequestID(t *testing.T) {
	e := newEnv(t)
	e.node(t, "gpu", serve(status(200), header("Content-Type", "application/json", "Request-Id", "req_fromProvider"), body(`{}`), frame(domain.TunnelEnd)),
		provider("ant", domain.ProviderAnthropic, "claude-x"), provider("vllm", domain.ProviderOpenAI, "qwen"), provider("ol", domain.ProviderOllama, "tiny"))
	shape := regexp.MustCompile(`^req_[0-9A-Za-z]{24}$`)
	var prev string
	for _, c := range []struct {
		method, path, body string
		status             int
		hdr                []string
	}{
		{"POST", "/v1/messages", `{"model":"nope","messages":[]}`, 404, nil},
		{"POST", "/v1/messages", `{"x":` + strings.Repeat("[", 200), 400, nil},
		{"POST", "/v1/messages/count_tokens", `{"model":"nope"}`, 404, nil},
		{"GET", "/v1/messages", "", 405, nil},
		{"GET", "/v1/models/nope", "", 404, []string{"Anthropic-Version", "2023-06-01"}},
	} {
		resp := do(t, c.method, e.srv.URL+c.path, c.body, c.hdr...)
		got := readAll(t, resp)
		var body struct {
			Type      string `json:"type"`
			RequestID string `json:"request_id"`
		}
		id := resp.Header.Get("request-id")
		if resp.StatusCode != c.status || json.Unmarshal([]byte(got), &body) != nil || body.Type != "error" {
			t.Fatalf("%s %s: %d %s", c.method, c.path, resp.StatusCode, got)
		}
		if !shape.MatchString(id) || body.RequestID != id || id == prev {
			t.Fatalf("%s %s: request-id %q, body's request_id %q (previous answer's %q): want one new req_ id in both", c.method, c.path, id, body.RequestID, prev)
		}
		prev = id
	}
	for _, path := range []string{"/v1/models", "/v1/models/claude-x"} {
		resp := do(t, "GET", e.srv.URL+path, "", "Anthropic-Version", "2023-06-01")
		if got := readAll(t, resp); resp.StatusCode != 200 || !shape.MatchString(resp.Header.Get("request-id")) {
			t.Fatalf("GET %s from the Anthropic SDK: %d request-id %q %s", path, resp.StatusCode, resp.Header.Get("request-id"), got)
		}
	}
	for _, c := range [][2]string{{"/v1/responses", `{"model":"nope"}`}, {"/api/chat", `{"model":"nope"}`}} {
		resp := do(t, "POST", e.srv.URL+c[0], c[1])
		if got := readAll(t, resp); resp.StatusCode != 404 || resp.Header.Get("request-id") != "" || strings.Contains(got, "request_id") {
			t.Fatalf("%s: %d request-id %q %s (only Anthropic's shape has one)", c[0], resp.StatusCode, resp.Header.Get("request-id"), got)
		}
	}
	resp := do(t, "POST", e.srv.URL+"/v1/messages", `{"model":"claude-x","messages":[]}`)
	if got := readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get("request-id") != "req_fromProvider" {
		t.Fatalf("relayed: %d request-id %q %s", resp.StatusCode, resp.Header.Get("request-id"), got)
	}
}

// TestModelListsNameWhatTheirClientCanUse: the OpenAI client's model list
// and lookup name only the models of providers that answer OpenAI requests
// (as routing does), so an anthropic provider's model is not offered to a
// client that could not use it; the Anthropic client's list names those of
// the providers that answer the Messages API.
func TestModelListsNameWhatTheirClientCanUse(t *testing.T) {
	e := newEnv(t)
	e.node(t, "gpu", serve(response(200, "application/json", `{}`)...),
		provider("ant", domain.ProviderAnthropic, "claude-x"), provider("vllm", domain.ProviderOpenAI, "qwen"), provider("ol", domain.ProviderOllama, "tiny"))
	ids := func(hdr ...string) string {
		t.Helper()
		resp := do(t, http.MethodGet, e.srv.URL+"/v1/models", "", hdr...)
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if got := readAll(t, resp); resp.StatusCode != 200 || json.Unmarshal([]byte(got), &list) != nil {
			t.Fatalf("GET /v1/models %v: %d %s", hdr, resp.StatusCode, got)
		}
		var out []string
		for _, d := range list.Data {
			out = append(out, d.ID)
		}
		return strings.Join(out, " ")
	}
	if got := ids(); got != "qwen tiny" {
		t.Fatalf("OpenAI list: %s, want qwen tiny (claude-x is an anthropic provider's)", got)
	}
	if got := ids("X-IOP-Node", "gpu"); got != "qwen tiny" {
		t.Fatalf("OpenAI list pinned to the node: %s, want qwen tiny", got)
	}
	if got := ids("Anthropic-Version", "2023-06-01"); got != "claude-x qwen tiny" {
		t.Fatalf("Anthropic list: %s, want every provider that speaks the Messages API", got)
	}

	resp := do(t, http.MethodGet, e.srv.URL+"/v1/models/claude-x", "")
	var oe struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if got := readAll(t, resp); resp.StatusCode != 404 || json.Unmarshal([]byte(got), &oe) != nil || oe.Error.Code != "model_not_found" || oe.Error.Type != "invalid_request_error" || !strings.Contains(oe.Error.Message, "claude-x") {
		t.Fatalf("GET /v1/models/claude-x from an OpenAI client: %d %s, want OpenAI's 404 as its chat request gets", resp.StatusCode, got)
	}
	resp = do(t, http.MethodPost, e.srv.URL+"/v1/chat/completions", `{"model":"claude-x","messages":[]}`)
	if got := readAll(t, resp); resp.StatusCode != 404 {
		t.Fatalf("chat with claude-x: %d %s (the list must agree with routing)", resp.StatusCode, got)
	}
	for _, c := range []struct{ path, hdr string }{{"/v1/models/qwen", ""}, {"/v1/models/tiny", ""}, {"/v1/models/claude-x", "2023-06-01"}, {"/v1/models/qwen", "2023-06-01"}} {
		var hdr []string
		if c.hdr != "" {
			hdr = []string{"Anthropic-Version", c.hdr}
		}
		resp := do(t, http.MethodGet, e.srv.URL+c.path, "", hdr...)
		if got := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("GET %s %v: %d %s", c.path, hdr, resp.StatusCode, got)
		}
	}
}

// TestResponsesCompactAndInputTokensPassThrough: POST /v1/responses/compact
// and /v1/responses/input_tokens are routed as creates are (by model, and
// to the node holding a previous_response_id the edge saw created), not
// taken for follow-ups of a response named "compact", and reach the
// provider at the same path with the same body.
func TestResponsesCompactAndInputTokensPassThrough(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	made := 0
	answer := func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		switch req.Path {
		case "/v1/responses/compact":
			return newFakeStream(response(200, "application/json", `{"id":"cmp_1","object":"response.compaction","created_at":1,"output":[],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}`)...), nil
		case "/v1/responses/input_tokens":
			return newFakeStream(response(200, "application/json", `{"object":"response.input_tokens","input_tokens":42}`)...), nil
		}
		mu.Lock()
		defer mu.Unlock()
		made++
		return newFakeStream(response(200, "application/json", fmt.Sprintf(`{"id":"resp_%s%d","object":"response"}`, req.Provider, made))...), nil
	}
	a := e.node(t, "a", answer, provider("pa", domain.ProviderOpenAI, "m"))
	b := e.node(t, "b", answer, provider("pb", domain.ProviderOpenAI, "m"))

	for _, c := range []struct{ path, body, want string }{
		{"/v1/responses/compact", `{"model":"m","input":"a long chat"}`, `"object":"response.compaction"`},
		{"/v1/responses/input_tokens", `{"input":"count me","model":"m"}`, `"input_tokens":42`},
	} {
		na, nb := a.count(), b.count()
		resp := do(t, http.MethodPost, e.srv.URL+c.path, c.body, "Content-Type", "application/json")
		got := readAll(t, resp)
		if resp.StatusCode != 200 || !strings.Contains(got, c.want) || a.count()+b.count() != na+nb+1 {
			t.Fatalf("POST %s: %d %s", c.path, resp.StatusCode, got)
		}
		link := a
		if b.count() > nb {
			link = b
		}
		if o := link.last(t); o.req.Method != http.MethodPost || o.req.Path != c.path || string(o.body) != c.body {
			t.Fatalf("POST %s forwarded as %s %s %q", c.path, o.req.Method, o.req.Path, o.body)
		}
	}

	// Continuing a response created on b: to b's provider, over a pin
	// elsewhere; counting may name no model then.
	resp := do(t, http.MethodPost, e.srv.URL+"/v1/responses", `{"model":"m","input":"hi"}`, "X-IOP-Node", "b")
	created := readAll(t, resp)
	var id struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != 200 || json.Unmarshal([]byte(created), &id) != nil || id.ID == "" {
		t.Fatalf("create on b: %d %s", resp.StatusCode, created)
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/responses/compact", `{"model":"m","previous_response_id":"` + id.ID + `"}`},
		{"/v1/responses/input_tokens", `{"model":"m","previous_response_id":"` + id.ID + `"}`},
		{"/v1/responses/input_tokens", `{"previous_response_id":"` + id.ID + `","input":"and this"}`},
	} {
		before := b.count()
		resp := do(t, http.MethodPost, e.srv.URL+c.path, c.body, "X-IOP-Node", "a")
		if got := readAll(t, resp); resp.StatusCode != 200 || b.count() != before+1 {
			t.Fatalf("POST %s %s: %d %s; b's tunnels %d (was %d)", c.path, c.body, resp.StatusCode, got, b.count(), before)
		}
		if o := b.last(t); o.req.Path != c.path || o.req.Provider != "pb" || string(o.body) != c.body {
			t.Fatalf("POST %s forwarded as %+v %q", c.path, o.req, o.body)
		}
	}

	// Neither a model nor a response the edge saw: a clear 400, no tunnel.
	before := a.count() + b.count()
	for _, c := range []struct{ path, body string }{
		{"/v1/responses/input_tokens", `{"input":"hi"}`},
		{"/v1/responses/input_tokens", `{"input":"hi","previous_response_id":"resp_unknown"}`},
		{"/v1/responses/compact", `{"previous_response_id":"` + id.ID + `"}`},
	} {
		resp := do(t, http.MethodPost, e.srv.URL+c.path, c.body)
		if got := readAll(t, resp); resp.StatusCode != 400 || !strings.Contains(got, `\"model\" is required`) || a.count()+b.count() != before {
			t.Fatalf("POST %s %s: %d %s", c.path, c.body, resp.StatusCode, got)
		}
	}
}

// Errors the edge raises on /v1/messages carry the error type Anthropic's
// API gives their status (its errors documentation and SDK types): a
// provider that sends no headers in time is 504 timeout_error, not the
// api_error of other 5xx.
func TestAnthropicErrorTypeFollowsTheStatus(t *testing.T) {
	e := newEnv(t)
	e.node(t, "gpu", func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		code := domain.CodeTimeout
		if req.Provider == "down" {
			code = domain.CodeProviderUnreachable
		}
		return newFakeStream(step{f: domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: code, Message: "upstream"}}}), nil
	}, provider("slow", domain.ProviderAnthropic, "claude-slow"), provider("down", domain.ProviderAnthropic, "claude-down"))
	for _, c := range []struct {
		model  string
		status int
		typ    string
	}{
		{"claude-slow", 504, "timeout_error"},
		{"claude-down", 502, "api_error"},
		{"claude-none", 404, "not_found_error"},
	} {
		resp := do(t, http.MethodPost, e.srv.URL+"/v1/messages", `{"model":"`+c.model+`","max_tokens":5,"messages":[]}`, "Anthropic-Version", "2023-06-01")
		got := readAll(t, resp)
		var ae struct {
			Type  string `json:"type"`
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		if resp.StatusCode != c.status || json.Unmarshal([]byte(got), &ae) != nil || ae.Type != "error" || ae.Error.Type != c.typ {
			t.Errorf("%s: %d %s, want %d with type %s", c.model, resp.StatusCode, got, c.status, c.typ)
		}
	}
}

// An Anthropic stream states its prompt's tokens in message_start, and the
// provider bills them however the stream then ends. The node reports usage
// only at a stream's end; when the caller leaves first (Claude Code's Esc)
// or the node's link breaks, the edge records the prompt it read at the
// start of the stream it relayed.
func TestAnthropicStreamCutShortRecordsItsPrompt(t *testing.T) {
	const start = "event: message_start\ndata: " +
		`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"usage":{"input_tokens":20,"cache_creation_input_tokens":1000,"cache_read_input_tokens":30000,"output_tokens":1}}}` + "\n\n"
	const delta = "event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}` + "\n\n"
	for _, tc := range []struct {
		name string
		last []step // after the caller read the first bytes
		left bool   // the caller leaves
	}{
		{"caller left", nil, true},
		{"link lost", []step{{err: domain.Errorf(domain.CodeNodeDisconnected, "connection closed")}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			st := newFakeStream(status(200), header("Content-Type", "text/event-stream; charset=utf-8"), body(start), body(delta))
			e.node(t, "gpu", serveStream(st), provider("ant", domain.ProviderAnthropic, "claude-x"))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/messages", strings.NewReader(`{"model":"claude-x","max_tokens":64,"stream":true,"messages":[]}`))
			req.Header.Set("Anthropic-Version", "2023-06-01")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(start)+len(delta))
			if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != start+delta {
				t.Fatalf("caller read %q, %v", got, err)
			}
			st.push(tc.last...)
			if tc.left {
				cancel()
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			waitFor(t, "tunnel.completed", func() bool { return e.bus.count() == 1 })
			e.bus.mu.Lock()
			ev := e.bus.evs[0]
			e.bus.mu.Unlock()
			if ev.Tunnel == nil || ev.Tunnel.Error == "" || ev.Tunnel.Usage == nil || ev.Tunnel.Usage.PromptTokens != 31020 {
				t.Fatalf("tunnel.completed = %+v (usage %+v), want the prompt's 31020 tokens recorded with the tunnel's error", ev.Tunnel, ev.Tunnel.Usage)
			}
			if lines := e.ledger.Snapshot(); len(lines) != 1 || lines[0].PromptTokens != 31020 || lines[0].Errors != 1 {
				t.Fatalf("ledger = %+v", lines)
			}
		})
	}
}

// A node with two Ollamas (one per GPU, say): `ollama list` and `ollama ps`
// pinned to it with X-IOP-Node list what both have, as the unpinned lists
// do, rather than whatever one of them happened to answer; a model both
// have is listed once in the tags. A node with one Ollama still answers
// itself, byte for byte.
func TestPinnedOllamaListsMergeTheNodesProviders(t *testing.T) {
	e := newEnv(t)
	answer := func(tags, ps string) func(domain.TunnelRequest) (ports.TunnelStream, error) {
		return func(req domain.TunnelRequest) (ports.TunnelStream, error) {
			b := tags
			if req.Path == "/api/ps" {
				b = ps
			}
			return newFakeStream(response(200, "application/json; charset=utf-8", b)...), nil
		}
	}
	gpu0 := `{"models":[{"name":"tiny:latest","model":"tiny:latest","digest":"aaa"},{"name":"both:latest","model":"both:latest","digest":"bbb"}]}`
	gpu1 := `{"models":[{"name":"big:latest","model":"big:latest","digest":"ccc"},{"name":"both:latest","model":"both:latest","digest":"ddd"}]}`
	e.node(t, "two", func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		if req.Provider == "gpu1" {
			return answer(gpu1, `{"models":[{"name":"big:latest","size_vram":2}]}`)(req)
		}
		return answer(gpu0, `{"models":[{"name":"tiny:latest","size_vram":1}]}`)(req)
	}, provider("gpu0", domain.ProviderOllama), provider("gpu1", domain.ProviderOllama))
	one := `{"models":[{"name":"solo:latest"}]}`
	e.node(t, "one", answer(one, `{"models":[]}`), provider("ol", domain.ProviderOllama))
	e.node(t, "vllm", serve(), provider("vllm", domain.ProviderOpenAI, "qwen"))

	get := func(path, node string) (int, string) {
		t.Helper()
		resp := do(t, http.MethodGet, e.srv.URL+path, "", "X-IOP-Node", node)
		return resp.StatusCode, readAll(t, resp)
	}
	if code, got := get("/api/tags", "two"); code != 200 || got != `{"models":[{"name":"tiny:latest","model":"tiny:latest","digest":"aaa"},{"name":"both:latest","model":"both:latest","digest":"bbb"},{"name":"big:latest","model":"big:latest","digest":"ccc"}]}`+"\n" {
		t.Fatalf("pinned tags of a node with two Ollamas: %d %s", code, got)
	}
	if code, got := get("/api/ps", "two"); code != 200 || got != `{"models":[{"name":"tiny:latest","size_vram":1},{"name":"big:latest","size_vram":2}]}`+"\n" {
		t.Fatalf("pinned ps of a node with two Ollamas: %d %s", code, got)
	}
	if code, got := get("/api/tags", "one"); code != 200 || got != one {
		t.Fatalf("pinned tags of a node with one Ollama: %d %q", code, got)
	}
	// Refusals stay those of a pinned request.
	if code, got := get("/api/tags", "vllm"); code != 404 || !strings.Contains(got, "no provider for the ollama API") {
		t.Fatalf("pinned to a node without Ollama: %d %s", code, got)
	}
	if code, got := get("/api/ps", "gone"); code != 404 || !strings.Contains(got, `node \"gone\" is not connected`) {
		t.Fatalf("pinned to a node not connected: %d %s", code, got)
	}
}

// `ollama pull` of a model a node has goes to that node even when the
// catalog does not know it yet (the model was pulled there with iop ollama
// pull, or with Ollama's own CLI on the node, since the last refresh): with
// several Ollama nodes the edge looks again before asking for X-IOP-Node,
// as it does before answering model not found.
func TestOllamaPullFindsAModelTheCatalogHasNotSeenYet(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	aHas := `{"models":[{"name":"tiny:latest"}]}`
	node := func(tags *string) func(domain.TunnelRequest) (ports.TunnelStream, error) {
		return func(req domain.TunnelRequest) (ports.TunnelStream, error) {
			if req.Path == "/api/tags" {
				mu.Lock()
				defer mu.Unlock()
				return newFakeStream(response(200, "application/json; charset=utf-8", *tags)...), nil
			}
			return newFakeStream(response(200, "application/x-ndjson", `{"status":"success"}`+"\n")...), nil
		}
	}
	bHas := `{"models":[{"name":"other:latest"}]}`
	a := e.node(t, "a", node(&aHas), provider("ol", domain.ProviderOllama))
	b := e.node(t, "b", node(&bHas), provider("ol", domain.ProviderOllama))
	for _, n := range []string{"a", "b"} {
		if err := e.catalog.Refresh(context.Background(), n); err != nil {
			t.Fatal(err)
		}
	}
	// Pulled on node a behind the edge's back.
	mu.Lock()
	aHas = `{"models":[{"name":"tiny:latest"},{"name":"new:1b"}]}`
	mu.Unlock()
	before := len(b.calls)
	resp := do(t, http.MethodPost, e.srv.URL+"/api/pull", `{"model":"new:1b"}`)
	if got := readAll(t, resp); resp.StatusCode != 200 || got != `{"status":"success"}`+"\n" {
		t.Fatalf("pull of a model node a has: %d %s", resp.StatusCode, got)
	}
	if o := a.last(t); o.req.Path != "/api/pull" || string(o.body) != `{"model":"new:1b"}` {
		t.Fatalf("the pull went to %+v", o.req)
	}
	b.mu.Lock()
	pulledOnB := false
	for _, c := range b.calls[before:] {
		pulledOnB = pulledOnB || c.req.Path == "/api/pull"
	}
	b.mu.Unlock()
	if pulledOnB {
		t.Fatal("node b got the pull too")
	}
	// A model no node has still needs a pin, after the same look.
	resp = do(t, http.MethodPost, e.srv.URL+"/api/pull", `{"model":"nowhere"}`)
	if got := readAll(t, resp); resp.StatusCode != 400 || !strings.Contains(got, "X-IOP-Node") {
		t.Fatalf("pull of a model no node has: %d %s", resp.StatusCode, got)
	}
}

// A model one node's Ollama lists and another node only declares is shown
// in the merged /api/tags as the Ollama listed it (size, digest, details),
// not as the edge's made-up entry, whichever node id sorts first.
func TestOllamaTagsPreferAListedEntryToAMadeUpOne(t *testing.T) {
	e := newEnv(t)
	listed := `{"name":"llama3.2:latest","model":"llama3.2:latest","modified_at":"2025-01-01T00:00:00Z","size":2019393189,"digest":"a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72","details":{"family":"llama"}}`
	e.node(t, "a-declares", serve(), provider("ol", domain.ProviderOllama, "llama3.2"))
	e.node(t, "b-lists", serve(response(200, "application/json; charset=utf-8", `{"models":[`+listed+`]}`)...), provider("ol", domain.ProviderOllama))
	if err := e.catalog.Refresh(context.Background(), "b-lists"); err != nil {
		t.Fatal(err)
	}
	resp := do(t, http.MethodGet, e.srv.URL+"/api/tags", "")
	if got := readAll(t, resp); resp.StatusCode != 200 || got != `{"models":[`+listed+`]}`+"\n" {
		t.Fatalf("merged tags: %d %s", resp.StatusCode, got)
	}
}
