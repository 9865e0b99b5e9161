package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/test/standin"
	"iop/test/standin/anthropic"
	"iop/test/standin/responses"
)

// tap sits between a node and a stand-in provider and keeps, per request,
// what the provider received and the exact bytes it answered, and when the
// node's side of the request went away.
type tap struct {
	*httptest.Server
	mu   sync.Mutex
	seen []tapped
}

type tapped struct {
	method, path, query string
	header              http.Header
	body                []byte // as the provider received it
	answer              []byte // as the provider sent it
	closed              time.Time
}

func newTap(t testing.TB, upstream string) *tap {
	tp := &tap{}
	tp.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header = r.Header.Clone()
		tp.mu.Lock()
		i := len(tp.seen)
		tp.seen = append(tp.seen, tapped{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery, header: r.Header.Clone(), body: body})
		tp.mu.Unlock()
		defer func() {
			tp.mu.Lock()
			tp.seen[i].closed = time.Now()
			tp.mu.Unlock()
		}()
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				tp.mu.Lock()
				tp.seen[i].answer = append(tp.seen[i].answer, buf[:n]...)
				tp.mu.Unlock()
				if _, werr := w.Write(buf[:n]); werr != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(tp.Close)
	return tp
}

// last returns the last request the provider saw on path.
func (tp *tap) last(t *testing.T, path string) tapped {
	t.Helper()
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for i := len(tp.seen) - 1; i >= 0; i-- {
		if tp.seen[i].path == path {
			s := tp.seen[i]
			s.answer = append([]byte(nil), s.answer...)
			return s
		}
	}
	t.Fatalf("the provider saw no request on %s", path)
	return tapped{}
}

// waitClosed waits until the provider's last request on path has ended.
func (tp *tap) waitClosed(t *testing.T, path string, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if at := tp.last(t, path).closed; !at.IsZero() {
			return at
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the provider's request on %s never ended", path)
	return time.Time{}
}

// surfaceEdge is an edge and one node whose providers are an Anthropic
// Messages stand-in (type anthropic, keyed by the node) and an OpenAI
// Responses stand-in, each behind a tap.
type surfaceEdge struct {
	e        *edge
	n        *node
	ant, oai *tap
	antS     *anthropic.Server
	oaiS     *responses.Server
}

const nodeAnthropicKey = "sk-ant-node-only-0001"

// agentKey is the edge API key of the agent CLI tests (read to watch the
// node arrive, inference for the CLIs).
const agentKey = "e2e-agent-key-0123456789"

func startAgentEdge(t *testing.T, antModels, oaiModels string) *surfaceEdge {
	return startAgentEdgeKeyed(t, antModels, oaiModels, false)
}

// startAgentEdgeKeyed is startAgentEdge, with the edge requiring agentKey
// when keyed.
func startAgentEdgeKeyed(t *testing.T, antModels, oaiModels string, keyed bool) *surfaceEdge {
	a := &surfaceEdge{antS: anthropic.Start(t), oaiS: responses.Start(t)}
	a.ant, a.oai = newTap(t, a.antS.URL), newTap(t, a.oaiS.URL)
	nodes := fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: ant, type: anthropic, base_url: %q, api_key_env: IOP_E2E_ANT_KEY%s}
      - {name: oai, type: openai, base_url: %q%s}
`, testToken, a.ant.URL, antModels, a.oai.URL, oaiModels)
	if !keyed {
		a.e = startEdge(t, nodes)
		a.n = startNode(t, a.e, testToken, "IOP_E2E_ANT_KEY="+nodeAnthropicKey)
		waitNode(t, a.e, "n1")
		return a
	}
	a.e = startEdgeHTTP(t, fmt.Sprintf("  api_keys:\n    - {name: agent, key_sha256: %s, scopes: [read, inference]}\n", keyHash(agentKey)), nodes)
	a.n = startNode(t, a.e, testToken, "IOP_E2E_ANT_KEY="+nodeAnthropicKey)
	waitNodeKey(t, a.e, "n1", agentKey)
	return a
}

func post(t *testing.T, ctx context.Context, url, body string, hdr ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

func TestResponsesAndMessagesPassThrough(t *testing.T) {
	t.Parallel()
	a := startAgentEdge(t, ", models: [claude-standin]", ", models: [gpt-standin]")
	a.antS.Reply(standin.Reply{Text: "Bonjour from the stand-in ✓", Thinking: "hmm", Usage: standin.Usage{Input: 31, Output: 7}})
	a.oaiS.Reply(standin.Reply{Text: "Hello from the stand-in ✓", Usage: standin.Usage{Input: 23, Output: 5}})
	bus := watchBus(t, a.e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Claude Code's probe.
	req, _ := http.NewRequestWithContext(ctx, http.MethodHead, a.e.url+"/", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("HEAD /: %v %v", resp, err)
	}

	msgBody := `{"model":"claude-standin","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	resp := post(t, ctx, a.e.url+"/v1/messages?beta=true", msgBody,
		"X-Api-Key", "sk-caller-key-for-the-edge", "Anthropic-Version", "2023-06-01", "Anthropic-Beta", "fine-grained-tool-streaming-2025-05-14")
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("/v1/messages: %d %v %v", resp.StatusCode, err, resp.Header)
	}
	seen := a.ant.last(t, "/v1/messages")
	if len(seen.answer) == 0 || sha256.Sum256(got) != sha256.Sum256(seen.answer) || !bytes.Contains(got, []byte("message_stop")) {
		t.Fatalf("/v1/messages body differs from the provider's (%d vs %d bytes)", len(got), len(seen.answer))
	}
	if string(seen.body) != msgBody || seen.query != "beta=true" || seen.header.Get("Anthropic-Beta") != "fine-grained-tool-streaming-2025-05-14" {
		t.Fatalf("the provider got %q ?%s %v", seen.body, seen.query, seen.header)
	}
	if k := seen.header.Values("X-Api-Key"); len(k) != 1 || k[0] != nodeAnthropicKey || seen.header.Get("Authorization") != "" {
		t.Fatalf("the provider got credentials %v / %q, want only the node's key", k, seen.header.Get("Authorization"))
	}

	respBody := `{"model":"gpt-standin","stream":true,"input":"hi"}`
	resp = post(t, ctx, a.e.url+"/v1/responses", respBody, "Authorization", "Bearer caller-key-must-not-leak")
	got, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/v1/responses: %d %v", resp.StatusCode, err)
	}
	seen = a.oai.last(t, "/v1/responses")
	if len(seen.answer) == 0 || sha256.Sum256(got) != sha256.Sum256(seen.answer) || !bytes.Contains(got, []byte("response.completed")) {
		t.Fatalf("/v1/responses body differs from the provider's (%d vs %d bytes)", len(got), len(seen.answer))
	}
	if string(seen.body) != respBody || seen.header.Get("Authorization") != "" {
		t.Fatalf("the provider got %q, Authorization %q", seen.body, seen.header.Get("Authorization"))
	}

	// Usage is recorded like Chat Completions usage, per route.
	for _, want := range []struct {
		path         string
		prompt, comp float64
	}{{"/v1/messages", 31, 7}, {"/v1/responses", 23, 5}} {
		bus.waitFor(t, 5*time.Second, "tunnel.completed with usage on "+want.path, func(m map[string]any) bool {
			tn, _ := m["tunnel"].(map[string]any)
			u, _ := tn["usage"].(map[string]any)
			return m["type"] == "tunnel.completed" && tn["path"] == want.path && u != nil &&
				u["prompt_tokens"] == want.prompt && u["completion_tokens"] == want.comp
		})
	}
	var usage map[string]any
	if err := getJSON(a.e.url+"/v1/usage", &usage); err != nil || !strings.Contains(fmt.Sprint(usage), "claude-standin") {
		t.Fatalf("/v1/usage does not show the Messages usage: %v %v", err, usage)
	}

	// The created response's follow-ups reach the provider that made it.
	var id string
	for _, line := range strings.Split(string(got), "\n") {
		if strings.HasPrefix(line, "data: ") && id == "" {
			var ev struct {
				Response struct {
					ID string `json:"id"`
				} `json:"response"`
			}
			if json.Unmarshal([]byte(line[6:]), &ev) == nil {
				id = ev.Response.ID
			}
		}
	}
	if id == "" {
		t.Fatalf("no response id in %q", got)
	}
	greq, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.e.url+"/v1/responses/"+id, nil)
	if gresp, err := http.DefaultClient.Do(greq); err != nil {
		t.Fatal(err)
	} else {
		gresp.Body.Close()
	}
	if s := a.oai.last(t, "/v1/responses/"+id); s.method != http.MethodGet {
		t.Fatalf("follow-up reached the provider as %s", s.method)
	}

	// Unknown models: 404 in each route's dialect.
	resp = post(t, ctx, a.e.url+"/v1/messages", `{"model":"claude-none","max_tokens":5,"messages":[]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ae struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if resp.StatusCode != 404 || json.Unmarshal(b, &ae) != nil || ae.Type != "error" || ae.Error.Type != "not_found_error" {
		t.Fatalf("/v1/messages unknown model: %d %s", resp.StatusCode, b)
	}
	resp = post(t, ctx, a.e.url+"/v1/responses", `{"model":"gpt-none","input":"x"}`)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var oe struct {
		Error struct{ Message, Type, Code string }
	}
	if resp.StatusCode != 404 || json.Unmarshal(b, &oe) != nil || oe.Error.Code != "model_not_found" || oe.Error.Type != "invalid_request_error" {
		t.Fatalf("/v1/responses unknown model: %d %s", resp.StatusCode, b)
	}

	// /v1/models for an Anthropic client: the same list, in a shape it reads.
	mreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.e.url+"/v1/models", nil)
	mreq.Header.Set("Anthropic-Version", "2023-06-01")
	mresp, err := http.DefaultClient.Do(mreq)
	if err != nil {
		t.Fatal(err)
	}
	var ml struct {
		Data []struct {
			ID, Type string
		}
		HasMore *bool `json:"has_more"`
	}
	json.NewDecoder(mresp.Body).Decode(&ml)
	mresp.Body.Close()
	ids := map[string]bool{}
	for _, m := range ml.Data {
		ids[m.ID] = m.Type == "model"
	}
	if !ids["claude-standin"] || !ids["gpt-standin"] || ml.HasMore == nil {
		t.Fatalf("/v1/models with anthropic-version: %+v", ml)
	}
}

func TestResponsesAndMessagesStreamsEndWithTheirCaller(t *testing.T) {
	t.Parallel()
	a := startAgentEdge(t, ", models: [claude-standin]", ", models: [gpt-standin]")
	a.antS.Reply(standin.Reply{Text: "one two three four five six", Hang: true, Usage: standin.Usage{Input: 40, Output: 9}})
	a.oaiS.Reply(standin.Reply{Text: "one two three four five six", Hang: true})
	bus := watchBus(t, a.e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	routes := []struct{ path, body string }{
		{"/v1/messages", `{"model":"claude-standin","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{"model":"gpt-standin","stream":true,"input":"hi"}`},
	}
	// A caller that leaves: the provider's request ends within a second.
	for _, r := range routes {
		cctx, ccancel := context.WithCancel(ctx)
		resp := post(t, cctx, a.e.url+r.path, r.body)
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatalf("%s: first line: %v", r.path, err)
		}
		left := time.Now()
		ccancel()
		resp.Body.Close()
		tp := a.oai
		if r.path == "/v1/messages" {
			tp = a.ant
		}
		if d := tp.waitClosed(t, r.path, 3*time.Second).Sub(left); d > time.Second {
			t.Fatalf("%s: the provider saw the caller leave after %v", r.path, d)
		}
	}
	// The Messages stream stated its prompt in message_start before the
	// caller left: that much is recorded.
	bus.waitFor(t, 5*time.Second, "tunnel.completed with the prompt of the /v1/messages stream its caller left", func(m map[string]any) bool {
		tn, _ := m["tunnel"].(map[string]any)
		u, _ := tn["usage"].(map[string]any)
		return m["type"] == "tunnel.completed" && tn["path"] == "/v1/messages" && u != nil && u["prompt_tokens"] == float64(40)
	})
	// The node dies mid-stream: each stream breaks, without its clean end.
	var resps []*http.Response
	for _, r := range routes {
		resp := post(t, ctx, a.e.url+r.path, r.body)
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatalf("%s: first line: %v", r.path, err)
		}
		resps = append(resps, resp)
	}
	a.n.stop(syscall.SIGKILL, time.Second)
	for i, resp := range resps {
		rest, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil || bytes.Contains(rest, []byte("message_stop")) || bytes.Contains(rest, []byte("response.completed")) {
			t.Fatalf("%s after the node died: err %v, tail %q", routes[i].path, err, rest)
		}
	}
}

// hostileBody is n bytes of head followed by unit repeated, produced as it
// is read (the test holds none of it).
type hostileBody struct {
	head, unit []byte
	n, off     int64
}

func (h *hostileBody) Read(p []byte) (int, error) {
	if h.off >= h.n {
		return 0, io.EOF
	}
	i := 0
	for ; i < len(p) && h.off < h.n; i, h.off = i+1, h.off+1 {
		if h.off < int64(len(h.head)) {
			p[i] = h.head[h.off]
		} else {
			p[i] = h.unit[(h.off-int64(len(h.head)))%int64(len(h.unit))]
		}
	}
	return i, nil
}

// procStatusKB reads a field (VmRSS, VmHWM) of /proc/PID/status in KiB.
func procStatusKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field+":") {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, field+":")), "%d", &kb)
			return kb
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// Issue 9.1: hostile JSON bodies cost the edge a bounded prefix, not their
// size; nesting past 128 levels is 400 and a body past the cap is 413.
func TestHostileBodiesLeaveTheEdgeMemoryBounded(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	const capBytes = 4 << 20
	nodes := fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: oai, type: openai, base_url: %q, models: [m-sse]}
      - {name: oll, type: ollama, base_url: %q, models: ["llama3.2"]}
`, testToken, p.URL, p.URL)
	e := startEdgeHTTP(t, fmt.Sprintf("  max_body_bytes: %d\n", capBytes), nodes)
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	pid := e.cmd.Process.Pid

	// Warm up the paths once, then take the idle level.
	for range 3 {
		resp := postTunnel(t, context.Background(), e.url+"/v1/chat/completions", "warm", chatBody("m-sse", false))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	time.Sleep(200 * time.Millisecond)
	idle := procStatusKB(t, pid, "VmRSS")

	send := func(path string, body io.Reader, n int64) (int, string, error) {
		req, _ := http.NewRequest(http.MethodPost, e.url+path, body)
		req.ContentLength = n
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}

	// The dialects first, with small bodies.
	deep := `{"x":` + strings.Repeat("[", 300)
	for _, c := range []struct{ path, want string }{
		{"/v1/chat/completions", `"code":"invalid_request"`},
		{"/api/chat", `{"error":"request body nests`},
		{"/v1/messages", `"type":"invalid_request_error"`},
	} {
		code, b, err := send(c.path, strings.NewReader(deep), int64(len(deep)))
		if err != nil || code != 400 || !strings.Contains(b, c.want) || !strings.Contains(b, "deeper than 128") {
			t.Fatalf("%s, too deep: %d %s %v", c.path, code, b, err)
		}
	}
	flat := func() *hostileBody {
		return &hostileBody{head: []byte(`{"messages":"`), unit: []byte("xxxxxxxxxxxxxxxx"), n: 60 << 20}
	}
	code, b, err := send("/v1/chat/completions", flat(), 60<<20)
	if err == nil && (code != 413 || !strings.Contains(b, "request_too_large")) {
		t.Fatalf("60 MB body: %d %s", code, b)
	}

	// Eight 60 MB nested bodies at once, of both shapes, and four 60 MB
	// flat chunked ones whose model would come after the cap.
	var wg sync.WaitGroup
	results := make(chan string, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var body *hostileBody
			switch i % 3 {
			case 0:
				body = &hostileBody{head: []byte(`{"x":`), unit: []byte("["), n: 60 << 20}
			case 1:
				body = &hostileBody{head: []byte(`{"a":`), unit: []byte(`{"a":`), n: 60 << 20}
			default:
				body = flat()
			}
			n := body.n
			if i%3 == 2 {
				n = -1 // chunked: the edge must read up to its cap to know
			}
			code, b, err := send("/v1/chat/completions", body, n)
			// The edge may answer and close before the client has sent
			// everything; a write error on the client's side is fine.
			if err == nil && code != 400 && code != 413 {
				results <- fmt.Sprintf("status %d %s", code, b)
			}
		}()
	}
	wg.Wait()
	close(results)
	for r := range results {
		t.Errorf("hostile body answered %s", r)
	}
	peak := procStatusKB(t, pid, "VmHWM")
	limit := 2*idle + 6*capBytes/1024
	t.Logf("edge RSS idle %d KiB, peak %d KiB, limit %d KiB (2×idle + 6×cap)", idle, peak, limit)
	if peak > limit {
		t.Fatalf("edge peaked at %d KiB under hostile bodies; idle %d KiB, limit %d KiB", peak, idle, limit)
	}
	// And it still serves.
	resp := postTunnel(t, context.Background(), e.url+"/v1/chat/completions", "after", chatBody("m-sse", false))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after the hostile bodies: %d", resp.StatusCode)
	}
}
