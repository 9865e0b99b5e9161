package e2e

import (
	"bufio"
	"bytes"
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
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// provider is a local stand-in for an OpenAI-compatible / Ollama server.
// The model in the request picks the behaviour. It keeps the exact bytes
// it sent per request id (X-Req header) and notices closed requests.
type provider struct {
	*httptest.Server
	mu     sync.Mutex
	sent   map[string][]byte
	closed map[string]time.Time
}

func sseStream(model string, n int) []byte {
	var b bytes.Buffer
	b.WriteString(": OPENROUTER PROCESSING\n\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"},\"finish_reason\":null}],\"usage\":null}\n\n", model, i)
	}
	fmt.Fprintf(&b, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n", model)
	fmt.Fprintf(&b, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", model, n, 7+n)
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

func newProvider(t testing.TB) *provider {
	p := &provider{sent: map[string][]byte{}, closed: map[string]time.Time{}}
	handle := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		_ = json.Unmarshal(body, &req)
		id := r.Header.Get("X-Req")
		f := w.(http.Flusher)
		write := func(b []byte) bool {
			if _, err := w.Write(b); err != nil {
				return false
			}
			f.Flush()
			p.mu.Lock()
			p.sent[id] = append(p.sent[id], b...)
			p.mu.Unlock()
			return true
		}
		switch req.Model {
		case "m-429":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(429)
			write([]byte(`{"error":{"message":"Rate limit reached for m-429","type":"requests","param":null,"code":"rate_limit_exceeded"}}`))
		case "m-500":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(500)
			write([]byte(`{"error":{"message":"upstream exploded","type":"server_error","param":null,"code":null}}`))
		case "m-slow", "m-big":
			// Streams until the client goes away; m-big in large chunks.
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			chunk := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
			if req.Model == "m-big" {
				chunk = bytes.Repeat([]byte("data: "+strings.Repeat("y", 1000)+"\n\n"), 64)
			}
			for i := 0; i < 100000; i++ {
				if !write(chunk) {
					break
				}
				if req.Model == "m-slow" {
					select {
					case <-r.Context().Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
				if r.Context().Err() != nil {
					break
				}
			}
			p.mu.Lock()
			p.closed[id] = time.Now()
			p.mu.Unlock()
		case "m-die":
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			write(sseStream(req.Model, 3)[:200])
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			conn.Close()
		default:
			if !req.Stream {
				w.Header().Set("Content-Type", "application/json")
				write([]byte(fmt.Sprintf(`{"id":"c2","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"whole"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`, req.Model)))
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("X-Provider", "stand-in")
			all := sseStream(req.Model, 40)
			for len(all) > 0 { // odd-sized pieces, flushed
				n := min(97, len(all))
				write(all[:n])
				all = all[n:]
			}
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", handle)
	mux.HandleFunc("POST /api/chat", func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Req")
		w.Header().Set("Content-Type", "application/x-ndjson")
		var b bytes.Buffer
		for i := 0; i < 5; i++ {
			fmt.Fprintf(&b, "{\"model\":\"llama3.2\",\"created_at\":\"2026-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"w%d \"},\"done\":false}\n", i)
		}
		b.WriteString("{\"model\":\"llama3.2\",\"created_at\":\"2026-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"total_duration\":1000000,\"prompt_eval_count\":12,\"eval_count\":5}\n")
		w.Write(b.Bytes())
		p.mu.Lock()
		p.sent[id] = b.Bytes()
		p.mu.Unlock()
	})
	p.Server = httptest.NewServer(mux)
	t.Cleanup(p.Close)
	return p
}

func (p *provider) sentBytes(id string) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.sent[id]...)
}

func (p *provider) closedAt(id string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.closed[id]
	return t, ok
}

func tunnelEdge(t testing.TB, p *provider) (*edge, *node) {
	nodes := fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: oai, type: openai, base_url: %q, models: [m-sse, m-429, m-500, m-slow, m-big, m-die]}
      - {name: oll, type: ollama, base_url: %q, models: ["llama3.2"]}
`, testToken, p.URL, p.URL)
	e := startEdge(t, nodes)
	n := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	return e, n
}

func chatBody(model string, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "stream": stream, "stream_options": map[string]any{"include_usage": true},
		"messages": []map[string]string{{"role": "user", "content": "hi"}}})
	return b
}

func postTunnel(t *testing.T, ctx context.Context, url, id string, body []byte) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Req", id)
	req.Header.Set("Authorization", "Bearer caller-key-must-not-leak")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

func TestTunnelIsByteFaithful(t *testing.T) {
	p := newProvider(t)
	e, _ := tunnelEdge(t, p)
	bus := watchBus(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, tc := range []struct{ id, path, model string }{
		{"sse", "/v1/chat/completions", "m-sse"},
		{"json", "/v1/chat/completions", "m-json"},
		{"ndjson", "/api/chat", "llama3.2"},
	} {
		model := tc.model
		if model == "m-json" {
			model = "m-sse"
		}
		resp := postTunnel(t, ctx, e.url+tc.path, tc.id, chatBody(model, tc.id != "json"))
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", tc.id, resp.StatusCode, err)
		}
		want := p.sentBytes(tc.id)
		if len(want) == 0 || sha256.Sum256(got) != sha256.Sum256(want) {
			t.Fatalf("%s: body differs from the provider's (%d vs %d bytes)\n%q", tc.id, len(got), len(want), got)
		}
		if tc.id == "sse" && (resp.Header.Get("X-Provider") != "stand-in" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")) {
			t.Fatalf("headers not passed through: %v", resp.Header)
		}
	}
	ev := bus.waitFor(t, 5*time.Second, "tunnel.completed with usage", func(m map[string]any) bool {
		tn, _ := m["tunnel"].(map[string]any)
		u, _ := tn["usage"].(map[string]any)
		return m["type"] == "tunnel.completed" && u != nil && u["completion_tokens"] == float64(40)
	})
	if strings.Contains(fmt.Sprint(ev), "tok1") {
		t.Fatalf("body bytes leaked onto the bus: %v", ev)
	}

	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	if err := getJSON(e.url+"/v1/models", &models); err != nil || models.Object != "list" {
		t.Fatalf("/v1/models: %v %+v", err, models)
	}
	found := false
	for _, m := range models.Data {
		found = found || (m.ID == "m-sse" && m.OwnedBy == "n1")
	}
	if !found {
		t.Fatalf("/v1/models lacks m-sse owned by n1: %+v", models)
	}
}

func TestTunnelWithOfficialOpenAIClient(t *testing.T) {
	p := newProvider(t)
	e, _ := tunnelEdge(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	client := openai.NewClient(option.WithBaseURL(e.url+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "m-sse",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var text strings.Builder
	var usage openai.CompletionUsage
	for stream.Next() {
		c := stream.Current()
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
		if c.Usage.TotalTokens > 0 {
			usage = c.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if !strings.HasPrefix(text.String(), "tok0 tok1 ") || !strings.HasSuffix(text.String(), "tok39 ") {
		t.Fatalf("deltas = %q", text.String())
	}
	if usage.PromptTokens != 7 || usage.CompletionTokens != 40 || usage.TotalTokens != 47 {
		t.Fatalf("usage = %+v", usage)
	}

	// Upstream errors reach the SDK with their own status and body.
	_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "m-429", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Message != "Rate limit reached for m-429" || apiErr.Code != "rate_limit_exceeded" {
		t.Fatalf("429: %v", err)
	}
	for _, tc := range []struct {
		model  string
		status int
		body   string
	}{{"m-429", 429, "Rate limit reached"}, {"m-500", 500, "upstream exploded"}} {
		resp := postTunnel(t, ctx, e.url+"/v1/chat/completions", tc.model, chatBody(tc.model, true))
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !bytes.Equal(got, p.sentBytes(tc.model)) || !strings.Contains(string(got), tc.body) {
			t.Fatalf("%s: %d %s", tc.model, resp.StatusCode, got)
		}
	}
	resp := postTunnel(t, ctx, e.url+"/v1/chat/completions", "x", chatBody("no-such-model", true))
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(got), `"code":"model_not_found"`) {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, got)
	}
}

func TestTunnelFailuresEndTheStreamWithoutDone(t *testing.T) {
	p := newProvider(t)
	e, n := tunnelEdge(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The provider dies mid-stream: the client's stream breaks, no [DONE].
	resp := postTunnel(t, ctx, e.url+"/v1/chat/completions", "die", chatBody("m-die", true))
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || bytes.Contains(got, []byte("[DONE]")) {
		t.Fatalf("provider death: err %v, body %q", err, got)
	}
	// The aborted relay still has its access line.
	accessLine := `msg="http request" method=POST route=/v1/chat/completions`
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(e.out.String(), accessLine); {
		if time.Now().After(deadline) {
			t.Fatalf("no access line for the relay that broke mid-stream:\n%s", e.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A client that disconnects: the provider sees its request closed within 1 s.
	cctx, ccancel := context.WithCancel(ctx)
	resp = postTunnel(t, cctx, e.url+"/v1/chat/completions", "leave", chatBody("m-slow", true))
	buf := make([]byte, 16)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatalf("first bytes: %v", err)
	}
	left := time.Now()
	ccancel()
	resp.Body.Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		if at, ok := p.closedAt("leave"); ok {
			if at.Sub(left) > time.Second {
				t.Fatalf("provider saw the close after %v", at.Sub(left))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("provider never saw the client's disconnect")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The node dies mid-stream: the client's stream ends with an error, no [DONE].
	resp = postTunnel(t, ctx, e.url+"/v1/chat/completions", "kill", chatBody("m-slow", true))
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatalf("first bytes: %v", err)
	}
	n.stop(syscall.SIGKILL, time.Second)
	got, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || bytes.Contains(got, []byte("[DONE]")) {
		t.Fatalf("node death: err %v, tail %q", err, got[max(0, len(got)-100):])
	}
}

func TestStalledTunnelReaderDoesNotSlowOthers(t *testing.T) {
	p := newProvider(t)
	e, _ := tunnelEdge(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// One caller opens a bulk stream and stops reading after the first bytes.
	stalled := postTunnel(t, ctx, e.url+"/v1/chat/completions", "stalled", chatBody("m-big", true))
	defer stalled.Body.Close()
	if _, err := io.ReadFull(stalled.Body, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	// Meanwhile complete streams and runs on the same node still flow in full.
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("ok%d", i)
		resp := postTunnel(t, ctx, e.url+"/v1/chat/completions", id, chatBody("m-sse", true))
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(got, p.sentBytes(id)) {
			t.Fatalf("stream %d beside a stalled one: err %v, %d bytes", i, err, len(got))
		}
	}
	// The stalled stream pinned a bounded amount: the provider could only
	// push what the windows and socket buffers hold, not an unbounded amount.
	if n := len(p.sentBytes("stalled")); n > 32<<20 {
		t.Fatalf("provider pushed %d bytes into a stalled stream", n)
	}
}

// A header value may hold bytes 0x80-0xFF that are not UTF-8 (obs-text:
// legal HTTP, passed by Go's net/http both ways). Relayed through the real
// edge and node, the caller's value reaches the provider and the
// provider's reaches the caller byte for byte, and the node's link stays
// up. Before, one such value failed to encode, the peer rejected the frame
// and closed the link, failing the request and every run and tunnel on it.
func TestTunnelRelaysHeaderBytesThatAreNotUTF8(t *testing.T) {
	const obsText = "caf\xe9"
	callerValue := make(chan string, 1)
	prov := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case callerValue <- r.Header.Get("X-Caller"):
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Upstream", obsText)
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(prov.Close)
	e := startEdge(t, fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: oai, type: openai, base_url: %q, models: [m-hdr]}
`, testToken, prov.URL))
	n := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for i := range 2 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/chat/completions", bytes.NewReader(chatBody("m-hdr", false)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Caller", obsText)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(body) != `{"ok":true}` {
			t.Fatalf("request %d: %d %q %v", i, resp.StatusCode, body, err)
		}
		if got := resp.Header.Get("X-Upstream"); got != obsText {
			t.Errorf("request %d: caller got X-Upstream %q, want %q", i, got, obsText)
		}
		select {
		case got := <-callerValue:
			if got != obsText {
				t.Errorf("request %d: provider got X-Caller %q, want %q", i, got, obsText)
			}
		default:
			t.Errorf("request %d: provider saw no request", i)
		}
	}
	if out := n.out.String(); strings.Contains(out, "link to edge lost") {
		t.Fatalf("the node's link dropped:\n%s", out)
	}
}

// The tunnel's edge cases answer the caller in its surface's shape, with
// nothing of the provider's URL in them, through the real edge and node:
// an escaped path reaches the provider as the caller escaped it; a blob
// body that breaks mid-stream is a 400 saying why; headers too large for
// the link are a 502 that says so (and the node logs it).
func TestTunnelEdgeCasesAnswerTheCaller(t *testing.T) {
	uris := make(chan string, 16)
	prov := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.HasPrefix(r.URL.Path, "/api/blobs/") {
			uris <- r.RequestURI
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Big", strings.Repeat("x", 100<<10))
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(prov.Close)
	// Credentials in the base URL: no answer or log may show them.
	base := strings.Replace(prov.URL, "http://", "http://admin:s3cret@", 1)
	e := startEdge(t, fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: oai, type: openai, base_url: %q, models: [m-hdr]}
      - {name: oll, type: ollama, base_url: %q, models: ["tiny"]}
`, testToken, base, base))
	n := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	send := func(method, path, body string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, method, e.url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	for _, path := range []string{"/api/blobs/sha256%3Fx=1", "/api/blobs/sha256%23frag", "/api/blobs/sha256%25zz"} {
		if code, got := send(http.MethodPost, path, "blob"); code != http.StatusCreated {
			t.Errorf("POST %s: %d %s", path, code, got)
			continue
		}
		if got := <-uris; got != path {
			t.Errorf("POST %s reached the provider as %q", path, got)
		}
	}

	nc, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fmt.Fprintf(nc, "POST /api/blobs/sha256:abc HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n", strings.TrimPrefix(e.url, "http://"))
	time.Sleep(50 * time.Millisecond) // the body streams to the node by then
	fmt.Fprint(nc, "zz\r\n")
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatalf("broken blob body: no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "request body") {
		t.Errorf("broken blob body: %d %s, want 400 saying the request body failed", resp.StatusCode, b)
	}

	code, got := send(http.MethodPost, "/v1/chat/completions", string(chatBody("m-hdr", false)))
	if code != http.StatusBadGateway || !strings.Contains(got, "provider_error") || !strings.Contains(got, "response headers are too large to relay") {
		t.Errorf("large headers: %d %s, want 502 provider_error saying why", code, got)
	}
	waitFor := time.Now().Add(5 * time.Second)
	for !strings.Contains(n.out.String(), "too large to relay") && time.Now().Before(waitFor) {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(n.out.String(), "too large to relay") {
		t.Errorf("the node did not log the headers too large to relay")
	}
	for name, out := range map[string]string{"edge": e.out.String(), "node": n.out.String()} {
		if strings.Contains(out, "s3cret") {
			t.Errorf("the %s log shows the provider's password", name)
		}
	}
}
