package openaiapi_test

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	openaiapi "iop/adapters/http/openai"
	"iop/adapters/provider/models"
	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// wait bounds every wait in these tests.
const wait = 5 * time.Second

// step is one scripted answer of a tunnel stream.
type step struct {
	f   domain.TunnelFrame
	err error
}

// fakeStream is a ports.TunnelStream fed through a channel; Recv blocks
// until a step is queued, ctx ends or the stream is closed.
type fakeStream struct {
	ch     chan step
	closed chan struct{}
	once   sync.Once
}

func newFakeStream(steps ...step) *fakeStream {
	s := &fakeStream{ch: make(chan step, 1024), closed: make(chan struct{})}
	for _, st := range steps {
		s.ch <- st
	}
	return s
}

func (s *fakeStream) Recv(ctx context.Context) (domain.TunnelFrame, error) {
	select { // a ready step wins over an ended ctx (ports.ReadyOnly)
	case st := <-s.ch:
		return st.f, st.err
	default:
	}
	select {
	case st := <-s.ch:
		return st.f, st.err
	case <-ctx.Done():
		return domain.TunnelFrame{}, ctx.Err()
	case <-s.closed:
		return domain.TunnelFrame{}, errors.New("closed")
	}
}

func (s *fakeStream) Close() { s.once.Do(func() { close(s.closed) }) }

func (s *fakeStream) push(steps ...step) {
	for _, st := range steps {
		s.ch <- st
	}
}

func frame(kind domain.TunnelFrameKind) step { return step{f: domain.TunnelFrame{Kind: kind}} }
func status(code int) step {
	return step{f: domain.TunnelFrame{Kind: domain.TunnelStatus, Status: code}}
}
func header(kv ...string) step {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return step{f: domain.TunnelFrame{Kind: domain.TunnelHeader, Header: domain.Header(h)}}
}
func body(s string) step {
	return step{f: domain.TunnelFrame{Kind: domain.TunnelBody, Body: []byte(s)}}
}

// response scripts a whole provider response, its body cut into chunks.
func response(code int, contentType string, chunks ...string) []step {
	out := []step{status(code), header("Content-Type", contentType)}
	for _, c := range chunks {
		out = append(out, body(c))
	}
	return append(out, frame(domain.TunnelEnd))
}

// opened is one OpenTunnel call as the node would see it.
type opened struct {
	req  domain.TunnelRequest
	body []byte // req.Body followed by the streamed rest
}

// fakeLink is a ports.NodeLink whose OpenTunnel hands out the stream open
// returns, after reading the request body like the transport would.
type fakeLink struct {
	open func(req domain.TunnelRequest) (ports.TunnelStream, error)

	mu    sync.Mutex
	calls []opened
}

func (l *fakeLink) OpenTunnel(_ context.Context, req domain.TunnelRequest, rest io.Reader) (ports.TunnelStream, error) {
	b := append([]byte(nil), req.Body...)
	if rest != nil {
		more, err := io.ReadAll(rest)
		if err != nil {
			return nil, domain.Errorf(domain.CodeStreamReset, "body: %v", err)
		}
		b = append(b, more...)
	}
	l.mu.Lock()
	l.calls = append(l.calls, opened{req: req, body: b})
	l.mu.Unlock()
	return l.open(req)
}

func (l *fakeLink) last(t *testing.T) opened {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.calls) == 0 {
		t.Fatal("no tunnel was opened")
	}
	return l.calls[len(l.calls)-1]
}

func (l *fakeLink) StartRun(context.Context, domain.RunRequest) (ports.RunStream, error) {
	return nil, errors.New("no runs")
}
func (l *fakeLink) CancelRun(context.Context, string, string) error                { return nil }
func (l *fakeLink) TerminateSession(context.Context, string, string, string) error { return nil }
func (l *fakeLink) Command(context.Context, string, []byte) (ports.CommandStream, error) {
	return nil, errors.New("no commands")
}
func (l *fakeLink) PushConfig(context.Context, domain.NodeConfig) error { return nil }
func (l *fakeLink) Close(string)                                        {}

type fakeBus struct {
	mu  sync.Mutex
	evs []domain.BusEvent
}

func (b *fakeBus) Publish(ev domain.BusEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.evs = append(b.evs, ev)
}

func (b *fakeBus) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.evs)
}

// env is an edge with fake nodes behind the handler, served over HTTP.
type env struct {
	reg     *edge.Registry
	ledger  *edge.UsageLedger
	catalog *edge.ModelCatalog
	bus     *fakeBus
	tunnels *edge.SubmitProviderTunnelHandler
	h       *openaiapi.Handler
	srv     *httptest.Server
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{reg: edge.NewRegistry(), ledger: edge.NewUsageLedger(), bus: &fakeBus{}}
	e.catalog = edge.NewModelCatalog(e.reg, models.Lists{}, nil)
	e.tunnels = edge.NewSubmitProviderTunnelHandler(e.reg, e.bus, e.catalog, e.ledger, nil)
	e.h = openaiapi.New(openaiapi.Deps{Tunnels: e.tunnels, Models: e.catalog}, nil)
	e.srv = httptest.NewServer(e.h)
	t.Cleanup(e.srv.Close)
	return e
}

// node connects a node whose every tunnel is answered by open.
func (e *env) node(t *testing.T, id string, open func(domain.TunnelRequest) (ports.TunnelStream, error), providers ...domain.ProviderConfig) *fakeLink {
	t.Helper()
	l := &fakeLink{open: open}
	if err := e.reg.Admit(&edge.LiveNode{ID: id, Link: l, ConnectedAt: time.Unix(1700000000, 0), Config: domain.NodeConfig{NodeID: id, Providers: providers}}); err != nil {
		t.Fatal(err)
	}
	return l
}

// serve answers every tunnel with a fresh stream of steps.
func serve(steps ...step) func(domain.TunnelRequest) (ports.TunnelStream, error) {
	return func(domain.TunnelRequest) (ports.TunnelStream, error) { return newFakeStream(steps...), nil }
}

// serveStream answers every tunnel with st.
func serveStream(st *fakeStream) func(domain.TunnelRequest) (ports.TunnelStream, error) {
	return func(domain.TunnelRequest) (ports.TunnelStream, error) { return st, nil }
}

func provider(name, typ string, models ...string) domain.ProviderConfig {
	return domain.ProviderConfig{Name: name, Type: typ, BaseURL: "http://" + name, Models: models}
}

func post(t *testing.T, url, payload string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

// sseChunks is a provider's SSE answer cut at awkward places.
var sseChunks = []string{
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
	": keep-alive\n\ndata: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel",
	"lo\"},\"finish_reason\":null}],\"usage\":null}\n\ndata: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n",
	"\ndata: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
	"data: [DONE]\n\n",
}

func TestSSEPassthroughIsByteIdentical(t *testing.T) {
	e := newEnv(t)
	steps := []step{status(200), header("Content-Type", "text/event-stream", "X-Request-Id", "req-1", "Connection", "close")}
	for i, c := range sseChunks {
		steps = append(steps, body(c))
		if i == 2 {
			steps = append(steps, step{f: domain.TunnelFrame{Kind: domain.TunnelMetadata, Metadata: []byte(`{"sideband":"METADATA-MUST-NOT-LEAK"}`)}})
		}
	}
	steps = append(steps, step{f: domain.TunnelFrame{Kind: domain.TunnelUsage, Usage: &domain.Usage{PromptTokens: 9, CompletionTokens: 2, TotalTokens: 11}}}, frame(domain.TunnelEnd))
	link := e.node(t, "gpu", serve(steps...), provider("vllm", domain.ProviderOpenAI, "qwen"))

	reqBody := `{"model":"qwen","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	resp := post(t, e.srv.URL+"/v1/chat/completions?api-version=1", reqBody, "Authorization", "Bearer edge-token", "X-IOP-Trace", "t")
	got := readAll(t, resp)
	want := strings.Join(sseChunks, "")
	if sha256.Sum256([]byte(got)) != sha256.Sum256([]byte(want)) {
		t.Fatalf("body differs from the provider's:\n got %q\nwant %q", got, want)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Request-Id") != "req-1" {
		t.Fatalf("status %d header %v", resp.StatusCode, resp.Header)
	}
	if strings.Contains(got, "METADATA-MUST-NOT-LEAK") {
		t.Fatal("a metadata frame reached the body")
	}

	c := link.last(t)
	if string(c.body) != reqBody || c.req.Method != http.MethodPost || c.req.Path != "/v1/chat/completions" || c.req.Query != "api-version=1" || c.req.Provider != "vllm" {
		t.Fatalf("tunnel request = %+v body %q", c.req, c.body)
	}
	if c.req.Header.Get("Authorization") != "" || c.req.Header.Get("X-Iop-Trace") != "" || c.req.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("forwarded header = %v", c.req.Header)
	}
	waitFor(t, "ledger entry", func() bool {
		l := e.ledger.Snapshot()
		return len(l) == 1 && l[0].TotalTokens == 11 && l[0].BodyBytes == int64(len(want))
	})
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFirstChunkIsFlushedAtOnce(t *testing.T) {
	e := newEnv(t)
	st := newFakeStream(status(200), header("Content-Type", "text/event-stream"), body("data: {\"first\":true}\n\n"))
	e.node(t, "gpu", serveStream(st), provider("vllm", domain.ProviderOpenAI, "qwen"))

	resp := post(t, e.srv.URL+"/v1/chat/completions", `{"model":"qwen","stream":true}`)
	defer resp.Body.Close()
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(resp.Body).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if l != "data: {\"first\":true}\n" {
			t.Fatalf("first line = %q", l)
		}
	case <-time.After(wait):
		t.Fatal("the first SSE chunk did not reach the caller while the stream was still open")
	}
	st.push(body("data: [DONE]\n\n"), frame(domain.TunnelEnd))
}

func TestUpstreamErrorReachesCallerUnchanged(t *testing.T) {
	cases := []struct {
		code int
		body string
	}{
		{429, `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`},
		{500, `{"error":"model runner crashed"}`},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.code), func(t *testing.T) {
			e := newEnv(t)
			e.node(t, "gpu", serve(status(c.code), header("Content-Type", "application/json", "Retry-After", "7"), body(c.body[:10]), body(c.body[10:]), frame(domain.TunnelEnd)),
				provider("vllm", domain.ProviderOpenAI, "qwen"))
			resp := post(t, e.srv.URL+"/v1/chat/completions", `{"model":"qwen"}`)
			got := readAll(t, resp)
			if resp.StatusCode != c.code || got != c.body || resp.Header.Get("Retry-After") != "7" {
				t.Fatalf("got %d %q Retry-After=%q", resp.StatusCode, got, resp.Header.Get("Retry-After"))
			}
		})
	}
}

func TestMidStreamFailureBreaksTheCallersStream(t *testing.T) {
	for _, tc := range []struct {
		name string
		last step
	}{
		{"link lost", step{err: domain.Errorf(domain.CodeNodeDisconnected, "connection closed")}},
		{"provider reset", step{f: domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderError, Message: "upstream reset"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.node(t, "gpu", serve(status(200), header("Content-Type", "text/event-stream"), body(sseChunks[0]), body(sseChunks[1]), tc.last),
				provider("vllm", domain.ProviderOpenAI, "qwen"))
			resp := post(t, e.srv.URL+"/v1/chat/completions", `{"model":"qwen","stream":true}`)
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if err == nil {
				t.Fatalf("the caller's stream ended cleanly after %q", got)
			}
			if !strings.HasPrefix(string(got), sseChunks[0]) || strings.Contains(string(got), "[DONE]") {
				t.Fatalf("caller got %q", got)
			}
			waitFor(t, "tunnel.completed", func() bool { return e.bus.count() == 1 })
		})
	}
}

// The relay holds back a flush only while more frames are ready: headers
// reach the caller while the provider is quiet, and each chunk as it comes.
func TestRelayFlushesWhenTheProviderPauses(t *testing.T) {
	e := newEnv(t)
	st := newFakeStream(status(200), header("Content-Type", "text/event-stream"))
	e.node(t, "gpu", serveStream(st), provider("vllm", domain.ProviderOpenAI, "qwen"))
	// A held-back flush would leave this client waiting: bound it.
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Post(e.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"qwen","stream":true}`))
	if err != nil {
		t.Fatalf("headers while the provider is quiet: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for _, chunk := range sseChunks[:2] {
		st.push(body(chunk))
		got := make([]byte, len(chunk))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != chunk {
			t.Fatalf("chunk %q before the stream ended: %q, %v", chunk, got, err)
		}
	}
	st.push(frame(domain.TunnelEnd))
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the end: %q, %v", rest, err)
	}
}

func TestClientDisconnectClosesTunnel(t *testing.T) {
	e := newEnv(t)
	st := newFakeStream(status(200), header("Content-Type", "text/event-stream"), body("data: {}\n\n"))
	e.node(t, "gpu", serveStream(st), provider("vllm", domain.ProviderOpenAI, "qwen"))

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"qwen","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	_ = resp.Body.Close()
	select {
	case <-st.closed:
	case <-time.After(time.Second):
		t.Fatal("tunnel not closed within 1s of the caller leaving")
	}
	waitFor(t, "slot release", func() bool { v, _ := e.reg.Get("gpu"); return v.TunnelsInFlight == 0 })
	waitFor(t, "tunnel.completed", func() bool { return e.bus.count() == 1 })
}

func TestErrorsBeforeStreaming(t *testing.T) {
	e := newEnv(t)
	e.node(t, "gpu", func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		switch req.Provider {
		case "down":
			return newFakeStream(step{f: domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderUnreachable, Message: "connection refused"}}}), nil
		case "slow":
			return newFakeStream(step{f: domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeTimeout, Message: "no headers"}}}), nil
		}
		return newFakeStream(response(200, "application/json", `{}`)...), nil
	}, provider("down", domain.ProviderOpenAI, "down-model"), provider("slow", domain.ProviderOpenAI, "slow-model"), provider("ol", domain.ProviderOllama, "llama3.2:latest"))

	cases := []struct {
		name, path, body string
		hdr              []string
		status           int
		typ, code        string
	}{
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9"}`, nil, 404, "invalid_request_error", "model_not_found"},
		{"bad json", "/v1/chat/completions", `{"model":`, nil, 400, "invalid_request_error", "invalid_request"},
		{"not an object", "/v1/embeddings", `["x"]`, nil, 400, "invalid_request_error", "invalid_request"},
		{"no model", "/v1/completions", `{"prompt":"x"}`, nil, 400, "invalid_request_error", "invalid_request"},
		{"unreachable provider", "/v1/chat/completions", `{"model":"down-model"}`, nil, 502, "server_error", "provider_unreachable"},
		{"provider timeout", "/v1/chat/completions", `{"model":"slow-model"}`, nil, 504, "server_error", "timeout"},
		{"pinned unknown node", "/v1/chat/completions", `{"model":"down-model"}`, []string{"X-IOP-Node", "nope"}, 404, "invalid_request_error", "node_not_found"},
		{"unknown route", "/v1/nothing", `{}`, nil, 404, "invalid_request_error", "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := post(t, e.srv.URL+c.path, c.body, c.hdr...)
			got := readAll(t, resp)
			var doc struct {
				Error struct {
					Message *string `json:"message"`
					Type    string  `json:"type"`
					Code    string  `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(got), &doc); err != nil {
				t.Fatalf("body %q: %v", got, err)
			}
			if resp.StatusCode != c.status || doc.Error.Type != c.typ || doc.Error.Code != c.code || doc.Error.Message == nil || *doc.Error.Message == "" {
				t.Fatalf("got %d %s", resp.StatusCode, got)
			}
		})
	}

	// No node speaks the family at all.
	e2 := newEnv(t)
	resp := post(t, e2.srv.URL+"/v1/chat/completions", `{"model":"x"}`)
	if got := readAll(t, resp); resp.StatusCode != 503 || !strings.Contains(got, `"code":"no_node_available"`) || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("no node: %d %s (Retry-After %q)", resp.StatusCode, got, resp.Header.Get("Retry-After"))
	}

	// Ollama routes answer in Ollama's own error shape.
	resp = post(t, e.srv.URL+"/api/chat", `{"model":"qwen3"}`)
	got := readAll(t, resp)
	var odoc struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(got), &odoc); err != nil || resp.StatusCode != 404 || !strings.Contains(odoc.Error, "qwen3") {
		t.Fatalf("ollama unknown model: %d %s", resp.StatusCode, got)
	}

	// Wrong method.
	resp, err := http.Get(e.srv.URL + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" || !strings.Contains(got, "method_not_allowed") {
		t.Fatalf("GET chat: %d %s", resp.StatusCode, got)
	}
}

func TestRequestBodies(t *testing.T) {
	e := newEnv(t)
	link := e.node(t, "gpu", serve(response(200, "application/json", `{}`)...), provider("vllm", domain.ProviderOpenAI, "qwen"), provider("ol", domain.ProviderOllama, "llama3.2:latest"))
	big := strings.Repeat(`{"role":"user","content":"`+strings.Repeat("x", 1000)+`"},`, 3000) // ~3 MB
	big = big[:len(big)-1]
	cases := []struct {
		name    string
		path    string
		payload string
		chunked bool
	}{
		{"small", "/v1/chat/completions", `{"messages":[],"model":"qwen"}`, false},
		{"large, model first", "/v1/chat/completions", `{"model":"qwen","messages":[` + big + `]}`, false},
		{"large, model last", "/v1/chat/completions", `{"messages":[` + big + `],"temperature":0.5,"model":"qwen"}`, false},
		{"chunked", "/v1/embeddings", `{"input":["a","b"],"model":"qwen"}`, true},
		{"ollama legacy name", "/api/show", `{"name":"llama3.2"}`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var rd io.Reader = strings.NewReader(c.payload)
			if c.chunked {
				rd = io.MultiReader(rd) // unknown length: sent chunked
			}
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+c.path, rd)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, resp); resp.StatusCode != 200 || got != "{}" {
				t.Fatalf("got %d %q", resp.StatusCode, got)
			}
			o := link.last(t)
			if sha256.Sum256(o.body) != sha256.Sum256([]byte(c.payload)) {
				t.Fatalf("forwarded body differs (%d vs %d bytes)", len(o.body), len(c.payload))
			}
			wantCL := fmt.Sprint(len(c.payload))
			if c.chunked {
				wantCL = ""
			}
			if got := o.req.Header.Get("Content-Length"); got != wantCL {
				t.Fatalf("forwarded Content-Length = %q, want %q", got, wantCL)
			}
		})
	}
}

func TestBodyTooLarge(t *testing.T) {
	e := newEnv(t)
	e.h.MaxBody = 1000
	e.node(t, "gpu", serve(response(200, "application/json", `{}`)...), provider("vllm", domain.ProviderOpenAI, "qwen"))
	resp := post(t, e.srv.URL+"/v1/chat/completions", `{"model":"qwen","input":"`+strings.Repeat("x", 2000)+`"}`)
	if got := readAll(t, resp); resp.StatusCode != 413 || !strings.Contains(got, "request_too_large") {
		t.Fatalf("got %d %s", resp.StatusCode, got)
	}
}

func TestModelsList(t *testing.T) {
	e := newEnv(t)
	e.node(t, "b", serve(), provider("vllm", domain.ProviderOpenAI, "qwen", "shared"))
	e.node(t, "a", serve(), provider("ol", domain.ProviderOllama, "llama3.2:latest", "shared"), provider("ol2", domain.ProviderOllama, "shared"))

	get := func(path string, hdr ...string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, readAll(t, resp)
	}
	code, got := get("/v1/models")
	want := `{"object":"list","data":[` +
		`{"id":"llama3.2:latest","object":"model","created":1700000000,"owned_by":"a"},` +
		`{"id":"qwen","object":"model","created":1700000000,"owned_by":"b"},` +
		`{"id":"shared","object":"model","created":1700000000,"owned_by":"a"},` +
		`{"id":"shared","object":"model","created":1700000000,"owned_by":"b"}]}` + "\n"
	if code != 200 || got != want {
		t.Fatalf("GET /v1/models = %d\n%s\nwant\n%s", code, got, want)
	}
	code, got = get("/v1/models", "X-IOP-Node", "b")
	if code != 200 || got != `{"object":"list","data":[{"id":"qwen","object":"model","created":1700000000,"owned_by":"b"},{"id":"shared","object":"model","created":1700000000,"owned_by":"b"}]}`+"\n" {
		t.Fatalf("pinned: %d %s", code, got)
	}
	if code, got = get("/v1/models", "X-IOP-Node", "zz"); code != 404 || !strings.Contains(got, "node_not_found") {
		t.Fatalf("pinned to unknown node: %d %s", code, got)
	}
	if code, got = get("/v1/models/qwen"); code != 200 || got != `{"id":"qwen","object":"model","created":1700000000,"owned_by":"b"}`+"\n" {
		t.Fatalf("GET /v1/models/qwen = %d %s", code, got)
	}
	if code, got = get("/v1/models/gpt-9"); code != 404 || !strings.Contains(got, "model_not_found") {
		t.Fatalf("GET /v1/models/gpt-9 = %d %s", code, got)
	}

	// Empty catalog: data is an empty list, not null.
	e2 := newEnv(t)
	resp, err := http.Get(e2.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != `{"object":"list","data":[]}`+"\n" {
		t.Fatalf("empty list = %s", got)
	}
}

func TestOllamaTags(t *testing.T) {
	e := newEnv(t)
	var calls int
	var mu sync.Mutex
	discovered := `{"models":[{"name":"qwen3:8b","model":"qwen3:8b","modified_at":"2025-01-01T00:00:00Z","size":5,"digest":"abc","details":{"family":"qwen3"}}]}`
	e.node(t, "a", func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		return newFakeStream(response(200, "application/json; charset=utf-8", discovered)...), nil
	}, provider("ol", domain.ProviderOllama), provider("vllm", domain.ProviderOpenAI, "not-ollama"))
	e.node(t, "b", serve(), provider("ol", domain.ProviderOllama, "llama3.2:latest", "qwen3:8b"))
	if err := e.catalog.Refresh(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(e.srv.URL + "/api/tags")
	if err != nil {
		t.Fatal(err)
	}
	got := readAll(t, resp)
	// llama3.2 is only declared on b: its entry is made up, with the digest
	// sha256("b/ol/llama3.2:latest") in hex, the same on every call.
	want := `{"models":[{"name":"llama3.2:latest","model":"llama3.2:latest","modified_at":"2023-11-14T22:13:20Z","size":0,"digest":"84316ea19939fef4446db6df2f979344a0cdfa70a982c68eda7d6e42af61676a","details":{}},` +
		`{"name":"qwen3:8b","model":"qwen3:8b","modified_at":"2025-01-01T00:00:00Z","size":5,"digest":"abc","details":{"family":"qwen3"}}]}` + "\n"
	if resp.StatusCode != 200 || got != want {
		t.Fatalf("merged tags = %d\n%s\nwant\n%s", resp.StatusCode, got, want)
	}
	// Read the made-up entry as `ollama list` does (api.ListResponse): the
	// time must parse, and it prints Digest[:12].
	var cli struct {
		Models []struct {
			Name       string    `json:"name"`
			ModifiedAt time.Time `json:"modified_at"`
			Size       int64     `json:"size"`
			Digest     string    `json:"digest"`
			Details    struct {
				Family string `json:"family"`
			} `json:"details"`
		} `json:"models"`
	}
	if err := json.Unmarshal([]byte(got), &cli); err != nil {
		t.Fatalf("the Ollama CLI could not read the merged tags: %v", err)
	}
	if m := cli.Models[0]; len(m.Digest) < 12 || m.ModifiedAt.IsZero() {
		t.Fatalf("made-up entry %+v: ollama list needs a digest of 12+ characters and a modified_at", m)
	}

	// Pinned: the node's own answer, byte for byte.
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/api/tags", nil)
	req.Header.Set("X-IOP-Node", "a")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != discovered || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Fatalf("pinned tags = %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 3 {
		t.Fatalf("%d tunnels, want 3 (discovery, the refresh before the merged list, the pinned call)", calls)
	}
}

func TestOllamaNDJSONPassthrough(t *testing.T) {
	e := newEnv(t)
	lines := []string{
		`{"model":"llama3.2","created_at":"t","message":{"role":"assistant","content":"Hi"},"done":false}` + "\n",
		`{"model":"llama3.2","created_at":"t","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":5,"eval_count":1}` + "\n",
	}
	link := e.node(t, "a", serve(response(200, "application/x-ndjson", lines[0][:7], lines[0][7:], lines[1])...), provider("ol", domain.ProviderOllama, "llama3.2:latest"))
	resp := post(t, e.srv.URL+"/api/chat", `{"model":"llama3.2","messages":[{"role":"user","content":"hi"}]}`)
	got := readAll(t, resp)
	if got != strings.Join(lines, "") || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("got %q", got)
	}
	if p := link.last(t).req.Path; p != "/api/chat" {
		t.Fatalf("forwarded path %q", p)
	}
}

func TestNewRefusesNil(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	openaiapi.New(openaiapi.Deps{}, nil)
}

// TestBadStreamedBody: a chunked body that turns malformed after its model
// gets a 400 in the surface's error format — the caller's body is the
// problem — not an empty 200 or the tunnel's internal error.
func TestBadStreamedBody(t *testing.T) {
	e := newEnv(t)
	e.node(t, "gpu", serve(response(200, "application/json", `{}`)...), provider("vllm", domain.ProviderOpenAI, "qwen"))
	nc, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	first := `{"model":"qwen","messages":[`
	fmt.Fprintf(nc, "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\nzz\r\n", len(first), first)
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := readAll(t, resp)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, "invalid_request") || strings.Contains(got, "stream closed") {
		t.Fatalf("got %d %s, want 400 invalid_request", resp.StatusCode, got)
	}
}

// TestModelNamedTwice: a body naming its model twice (the edge routes on
// the first, a provider reads the last) is refused with a 400, small or
// streamed, and never reaches the provider whole.
func TestModelNamedTwice(t *testing.T) {
	e := newEnv(t)
	link := e.node(t, "gpu", serve(response(200, "application/json", `{}`)...), provider("vllm", domain.ProviderOpenAI, "qwen"))
	big := strings.Repeat(`{"role":"user","content":"hello"},`, 4000) + `{"role":"user","content":"x"}`
	for name, body := range map[string]string{
		"small":                `{"model":"qwen","messages":[],"model":"gpt-expensive"}`,
		"escaped":              `{"model":"qwen","mod\u0065l":"gpt-expensive"}`,
		"streamed, at its end": `{"model":"qwen","messages":[` + big + `],"model":"gpt-expensive"}`,
	} {
		t.Run(name, func(t *testing.T) {
			before := link.count()
			resp := post(t, e.srv.URL+"/v1/chat/completions", body)
			got := readAll(t, resp)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, "invalid_request") || !strings.Contains(got, "more than once") {
				t.Fatalf("got %d %s, want 400 naming the key twice", resp.StatusCode, got)
			}
			if link.count() != before {
				t.Fatal("a tunnel carried the whole body to the provider")
			}
		})
	}
}

// TestModelSpelledTwoWays: a body whose model Go's encoding/json (Ollama's
// binding) reads differently from the edge's scan — a key in another case
// or escaped, or Ollama's "name" naming another model — is refused, or
// forwarded only when the provider would run the model the edge routed on.
func TestModelSpelledTwoWays(t *testing.T) {
	e := newEnv(t)
	link := e.node(t, "ol", serve(response(200, "application/json", `{}`)...), provider("ol", domain.ProviderOllama, "llama3.2"))
	for _, path := range []string{"/api/chat", "/v1/chat/completions"} {
		for _, body := range []string{
			`{"model":"llama3.2","MODEL":"undeclared-70b"}`,
			`{"model":"llama3.2","Model":"undeclared-70b"}`,
			`{"MODEL":"undeclared-70b","model":"llama3.2"}`,
			`{"name":"llama3.2","mod\u0065l":"undeclared-70b"}`,
			`{"model":"llama3.2","name":"undeclared-70b"}`,
			`{"name":"undeclared-70b","model":"llama3.2"}`,
		} {
			before := link.count()
			resp := post(t, e.srv.URL+path, body)
			got := readAll(t, resp)
			if resp.StatusCode >= 400 && resp.StatusCode < 500 {
				if link.count() != before {
					t.Fatalf("%s %s: refused (%d) after a tunnel carried the whole body", path, body, resp.StatusCode)
				}
				continue
			}
			if resp.StatusCode != 200 || link.count() == before {
				t.Fatalf("%s %s: got %d %s", path, body, resp.StatusCode, got)
			}
			// What a Go server (Ollama) runs: the last key of any case,
			// "model" before the legacy "name".
			var req struct{ Model, Name string }
			if err := json.Unmarshal(link.last(t).body, &req); err != nil {
				t.Fatal(err)
			}
			if runs := cmp.Or(req.Model, req.Name); path == "/api/chat" && runs != "llama3.2" || req.Model != "llama3.2" {
				t.Fatalf("%s %s: forwarded, and the provider runs %q/%q", path, body, req.Model, req.Name)
			}
		}
	}
}

// count is the number of tunnels opened with their whole body read.
func (l *fakeLink) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.calls)
}

// Ollama lists every model with its tag: a model declared without one
// ("llama3.2") is listed as "llama3.2:latest", the name clients look for in
// /api/tags, and once, however many providers declare it either way.
func TestOllamaTagsNameTheTag(t *testing.T) {
	e := newEnv(t)
	e.node(t, "b", serve(), provider("ol", domain.ProviderOllama, "llama3.2", "hf.co/org/model"))
	e.node(t, "c", serve(), provider("ol", domain.ProviderOllama, "llama3.2:latest"))
	resp, err := http.Get(e.srv.URL + "/api/tags")
	if err != nil {
		t.Fatal(err)
	}
	var tags struct {
		Models []struct {
			Name  string `json:"name"`
			Model string `json:"model"`
		} `json:"models"`
	}
	if err := json.Unmarshal([]byte(readAll(t, resp)), &tags); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range tags.Models {
		if m.Name != m.Model {
			t.Errorf("entry %+v: name and model differ", m)
		}
		names = append(names, m.Name)
	}
	if got := strings.Join(names, " "); got != "hf.co/org/model:latest llama3.2:latest" {
		t.Fatalf("/api/tags names %q", got)
	}
}

// A model name an Ollama server resolves to the same model reaches the
// node serving it: Ollama fills in its registry, namespace and tag and
// matches names case-insensitively, and the body goes on as the caller
// wrote it. Other providers match as before (an openai one exactly).
func TestOllamaNameForms(t *testing.T) {
	e := newEnv(t)
	ok := `{"done":true}` + "\n"
	e.node(t, "gpu", func(domain.TunnelRequest) (ports.TunnelStream, error) {
		return newFakeStream(response(200, "application/x-ndjson", ok)...), nil
	}, provider("ol", domain.ProviderOllama, "llama3.2:latest"), provider("vllm", domain.ProviderOpenAI, "Qwen3"))
	for _, m := range []string{"llama3.2", "library/llama3.2", "registry.ollama.ai/library/llama3.2:latest", "Llama3.2", "LIBRARY/llama3.2:LATEST"} {
		resp := post(t, e.srv.URL+"/api/chat", `{"model":"`+m+`","messages":[]}`)
		if got := readAll(t, resp); resp.StatusCode != 200 || got != ok {
			t.Errorf("model %q: %d %s", m, resp.StatusCode, got)
		}
	}
	for _, m := range []string{"llama3.2:8b", "other/llama3.2", "llama3"} {
		if resp := post(t, e.srv.URL+"/api/chat", `{"model":"`+m+`","messages":[]}`); resp.StatusCode != 404 {
			t.Errorf("model %q: %d %s, want 404", m, resp.StatusCode, readAll(t, resp))
		}
	}
	if resp := post(t, e.srv.URL+"/v1/chat/completions", `{"model":"qwen3","messages":[]}`); resp.StatusCode != 404 {
		t.Errorf("openai provider matched another case: %d %s", resp.StatusCode, readAll(t, resp))
	}
}

// A provider response without a Content-Type reaches the caller without
// one: net/http would otherwise guess one from the body.
func TestNoContentTypeIsMadeUp(t *testing.T) {
	e := newEnv(t)
	e.node(t, "gpu", serve(status(200), header("X-A", "1"), body(`{"ok":true}`), frame(domain.TunnelEnd)), provider("vllm", domain.ProviderOpenAI, "qwen"))
	resp := post(t, e.srv.URL+"/v1/embeddings", `{"model":"qwen","input":"x"}`)
	if got := readAll(t, resp); resp.StatusCode != 200 || got != `{"ok":true}` {
		t.Fatalf("%d %q", resp.StatusCode, got)
	}
	if ct, ok := resp.Header["Content-Type"]; ok {
		t.Fatalf("Content-Type %q, which the provider did not send", ct)
	}
	if resp.Header.Get("X-A") != "1" {
		t.Fatalf("headers %v", resp.Header)
	}
}

// A status that is not a final one (a node's 101 or other 1xx, or one out
// of range) reaches the caller as 502: a 101 would tell a proxy in front
// that the connection switched protocols while the edge reads HTTP on.
func TestNonFinalStatusFromANodeIs502(t *testing.T) {
	for _, code := range []int{101, 103, 42, 1000} {
		e := newEnv(t)
		e.node(t, "gpu", serve(status(code), header("Upgrade", "websocket"), body(`RAW`), frame(domain.TunnelEnd)), provider("vllm", domain.ProviderOpenAI, "qwen"))
		resp := post(t, e.srv.URL+"/v1/chat/completions", `{"model":"qwen"}`)
		readAll(t, resp)
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("node status %d: caller got %d, want 502", code, resp.StatusCode)
		}
	}
}

// A compressed body cannot be routed (the model is read from its bytes):
// it is refused with 415 naming the encoding, in the route's dialect, not
// with a scan error about a body that "is not a JSON object". Identity is
// no encoding.
func TestCompressedBodyIsRefusedClearly(t *testing.T) {
	e := newEnv(t)
	link := e.node(t, "gpu", serve(response(200, "application/json", `{}`)...), provider("vllm", domain.ProviderOpenAI, "qwen"), provider("ol", domain.ProviderOllama, "llama3.2:latest"))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(`{"model":"qwen","input":"hi"}`))
	_ = zw.Close()
	send := func(path, encoding string, body []byte) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", encoding)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp, readAll(t, resp)
	}

	resp, got := send("/v1/responses", "gzip", gz.Bytes())
	var doc struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(got), &doc); err != nil || resp.StatusCode != http.StatusUnsupportedMediaType ||
		doc.Error.Code != "unsupported_content_encoding" || !strings.Contains(doc.Error.Message, `"gzip"`) {
		t.Fatalf("gzip on /v1/responses: %d %s", resp.StatusCode, got)
	}

	resp, got = send("/api/chat", "zstd", []byte{0x28, 0xb5, 0x2f, 0xfd})
	var odoc struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(got), &odoc); err != nil || resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(odoc.Error, `"zstd"`) {
		t.Fatalf("zstd on /api/chat: %d %s", resp.StatusCode, got)
	}

	resp, got = send("/v1/chat/completions", "identity", []byte(`{"model":"qwen"}`))
	if resp.StatusCode != 200 || got != "{}" {
		t.Fatalf("identity: %d %s", resp.StatusCode, got)
	}
	if o := link.last(t); string(o.body) != `{"model":"qwen"}` {
		t.Fatalf("forwarded %q", o.body)
	}
}

// A 405's Allow lists every method the route serves: HEAD too wherever GET
// is served (as the rest of the edge's API lists it), in the route's
// error dialect.
func TestMethodNotAllowedListsHead(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodPost, "/api/tags", "GET, HEAD"},
		{http.MethodOptions, "/api/version", "GET, HEAD"},
		{http.MethodPut, "/v1/responses/resp_1", "DELETE, GET, HEAD"},
		{http.MethodPost, "/v1/models", "GET, HEAD"},
		{http.MethodGet, "/api/blobs/sha256:00", "HEAD, POST"},
		{http.MethodGet, "/v1/responses", "POST"},
	} {
		req, _ := http.NewRequest(c.method, e.srv.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got := readAll(t, resp)
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != c.allow || !strings.Contains(got, "(allowed: "+c.allow+")") {
			t.Errorf("%s %s: %d Allow %q %s, want Allow %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), got, c.allow)
		}
	}
}

// The edge's answer names the node that served it (X-IOP-Node, as a run's
// does), so a caller, and the access log, can tell which node a request
// went to; a provider's own X-IOP-Node never stands in for it.
func TestRelayedAnswerNamesItsNode(t *testing.T) {
	e := newEnv(t)
	steps := []step{status(200), header("Content-Type", "application/json", "X-Iop-Node", "spoofed"), body(`{}`), frame(domain.TunnelEnd)}
	e.node(t, "gpu", serve(steps...), provider("vllm", domain.ProviderOpenAI, "qwen"))

	resp := post(t, e.srv.URL+"/v1/chat/completions", `{"model":"qwen"}`)
	if got := readAll(t, resp); got != `{}` {
		t.Fatalf("body %q", got)
	}
	if got := resp.Header.Values("X-IOP-Node"); len(got) != 1 || got[0] != "gpu" {
		t.Fatalf("X-IOP-Node = %q, want the serving node [gpu]", got)
	}
}
