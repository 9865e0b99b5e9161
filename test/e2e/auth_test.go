package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// API keys of the auth tests; runsKey reaches the edge through key_env,
// the others as key_sha256.
const (
	readKey      = "e2e-read-key-0123456789"
	runsKey      = "e2e-runs-key-0123456789"
	inferenceKey = "e2e-inference-key-0123456"
	adminKey     = "e2e-admin-key-0123456789"
	n2Key        = "e2e-n2-only-key-01234567"
	wrongKey     = "e2e-wrong-key-0123456789"

	providerSecret = "sk-e2e-provider-secret-value"
)

var allTestKeys = []string{readKey, runsKey, inferenceKey, adminKey, n2Key, wrongKey}

func keyHash(k string) string {
	s := sha256.Sum256([]byte(k))
	return hex.EncodeToString(s[:])
}

// authHTTP is the http section's api_keys of the auth edge.
func authHTTP() string {
	return fmt.Sprintf(`  api_keys:
    - {name: reader, key_sha256: %s, scopes: [read]}
    - {name: runner, key_env: IOP_E2E_RUNS_KEY, scopes: [runs]}
    - {name: inferer, key_sha256: %s, scopes: [inference]}
    - {name: operator, key_sha256: %s, scopes: [admin]}
    - {name: n2-only, key_sha256: %s, scopes: [read, runs, inference], nodes: [n2]}
`, keyHash(readKey), keyHash(inferenceKey), keyHash(adminKey), keyHash(n2Key))
}

// startEdgeHTTP starts an edge whose http section gets the extra lines
// httpExtra (indented two spaces), with env added to its environment.
func startEdgeHTTP(t testing.TB, httpExtra, nodes string, env ...string) *edge {
	t.Helper()
	e := &edge{transport: freeAddr(t), config: filepath.Join(t.TempDir(), "edge.yaml")}
	httpAddr := freeAddr(t)
	e.url = "http://" + httpAddr
	cfg := edgeConfig(e.transport, httpAddr, nodes)
	listen := fmt.Sprintf("  listen: %q\n", httpAddr)
	i := strings.Index(cfg, "http:\n"+listen)
	if i < 0 {
		t.Fatalf("edge config has no http listen line:\n%s", cfg)
	}
	at := i + len("http:\n"+listen)
	cfg = cfg[:at] + httpExtra + cfg[at:]
	if err := os.WriteFile(e.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// The node-link CA pin nodes get (printCAPin, with the env key_env needs).
	pinCmd := exec.Command(filepath.Join(binDir, "iop-edge"), "--config", e.config, "--print-ca-pin")
	pinCmd.Env = append(os.Environ(), env...)
	out, err := pinCmd.CombinedOutput()
	if e.pin = strings.TrimSpace(string(out)); err != nil || !strings.HasPrefix(e.pin, "sha256:") {
		t.Fatalf("iop-edge --print-ca-pin: %v: %q", err, out)
	}
	e.proc = start(t, "iop-edge", env, "--config", e.config)
	waitHealthy(t, e.url, e.proc)
	return e
}

// request sends method url with key (as Bearer; "" sends none) and returns
// the status and body.
func request(t *testing.T, ctx context.Context, method, url, key string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp.StatusCode, resp.Header, nil // a stream that stays open: the status is the answer
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func waitNodeKey(t testing.TB, e *edge, id, key string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodGet, e.url+"/v1/nodes/"+id, nil)
		req.Header.Set("x-api-key", key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("node %s never connected; edge output:\n%s", id, e.out.String())
}

// cliEnv runs the iop CLI against e with env added.
func cliEnv(t *testing.T, e *edge, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "iop"), args...)
	cmd.Env = append(append(os.Environ(), "IOP_EDGE="+e.url, "IOP_API_KEY="), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("iop %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

// authEdge is an edge with API keys, a provider stand-in and two nodes;
// node n1 has secrets in its environment.
func authEdge(t *testing.T) (*edge, *node, *node, string) {
	p := newProvider(t)
	dead := freeAddr(t) // nothing listens there
	nodes := fmt.Sprintf(`
  - id: n1
    token: %s
    adapters:
      - name: exec
        type: exec
        inherit_env: [E2E_INHERITED]
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
          env: {command: ["env"], env: {E2E_DECLARED: declared-value}}
      - {name: deadllm, type: openai, base_url: "http://%s", models: [m-dead]}
    providers:
      - {name: oai, type: openai, base_url: %q, api_key_env: OPENAI_API_KEY, models: [m-sse, m-500]}
      - {name: oll, type: ollama, base_url: %q, models: ["llama3.2"]}
      - {name: dead, type: openai, base_url: "http://%s", models: [m-dead]}
  - id: n2
    token: e2e-token-0002
    adapters:
      - name: exec
        type: exec
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
`, testToken, dead, p.URL, p.URL, dead)
	e := startEdgeHTTP(t, authHTTP(), nodes, "IOP_E2E_RUNS_KEY="+runsKey)
	n1 := startNode(t, e, testToken, "IOP_NODE_TOKEN="+testToken, "OPENAI_API_KEY="+providerSecret, "E2E_INHERITED=inherited-value")
	n2 := startNode(t, e, "e2e-token-0002")
	waitNodeKey(t, e, "n1", adminKey)
	waitNodeKey(t, e, "n2", adminKey)
	return e, n1, n2, dead
}

type dialect int

const (
	iopDialect dialect = iota
	openaiDialect
	ollamaDialect
)

// checkRefusal asserts a 401/403 body is in the route's dialect.
func checkRefusal(t *testing.T, d dialect, status int, body []byte) {
	t.Helper()
	switch d {
	case iopDialect:
		var b struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		want := map[int]string{401: "unauthorized", 403: "forbidden"}[status]
		if json.Unmarshal(body, &b) != nil || b.Error.Code != want || b.Error.Message == "" {
			t.Fatalf("iop %d body %s, want code %q", status, body, want)
		}
	case openaiDialect:
		var b struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		want := map[int]string{401: "invalid_api_key", 403: "insufficient_permissions"}[status]
		if json.Unmarshal(body, &b) != nil || b.Error.Code != want || b.Error.Type != "invalid_request_error" || b.Error.Message == "" {
			t.Fatalf("openai %d body %s, want code %q", status, body, want)
		}
	case ollamaDialect:
		var b struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &b) != nil || b.Error == "" {
			t.Fatalf("ollama %d body %s, want {\"error\":\"…\"}", status, body)
		}
	}
}

func TestAPIKeys(t *testing.T) {
	t.Parallel()
	e, n1, n2, dead := authEdge(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var bodies [][]byte // every API answer, checked for keys at the end
	var mu sync.Mutex
	keep := func(b []byte) {
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
	}

	t.Run("scope matrix", func(t *testing.T) {
		chat, _ := json.Marshal(map[string]any{"model": "m-sse", "messages": []map[string]string{{"role": "user", "content": "hi"}}})
		ollamaChat, _ := json.Marshal(map[string]any{"model": "llama3.2", "stream": false, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
		run, _ := json.Marshal(map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "hi", "background": true})
		routes := []struct {
			method, path string
			body         []byte
			dialect      dialect
			allowed      map[string]bool // keys that may call it
		}{
			{"POST", "/v1/runs", run, iopDialect, map[string]bool{runsKey: true, adminKey: true}},
			{"POST", "/v1/chat/completions", chat, openaiDialect, map[string]bool{inferenceKey: true, adminKey: true}},
			{"POST", "/api/chat", ollamaChat, ollamaDialect, map[string]bool{inferenceKey: true, adminKey: true}},
			{"POST", "/v1/admin/reload", nil, iopDialect, map[string]bool{adminKey: true}},
			{"GET", "/v1/events", nil, iopDialect, map[string]bool{readKey: true, adminKey: true}},
		}
		for _, rt := range routes {
			for _, key := range []string{"", wrongKey, readKey, runsKey, inferenceKey, adminKey} {
				name := fmt.Sprintf("%s %s with %q", rt.method, rt.path, key)
				rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
				status, hdr, body := request(t, rctx, rt.method, e.url+rt.path, key, rt.body)
				rcancel()
				keep(body)
				switch {
				case key == "" || key == wrongKey:
					if status != 401 {
						t.Fatalf("%s: status %d %s, want 401", name, status, body)
					}
					if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
						t.Fatalf("%s: 401 without WWW-Authenticate", name)
					}
					checkRefusal(t, rt.dialect, status, body)
				case !rt.allowed[key]:
					if status != 403 {
						t.Fatalf("%s: status %d %s, want 403", name, status, body)
					}
					checkRefusal(t, rt.dialect, status, body)
				default:
					if status == 401 || status == 403 || status >= 500 {
						t.Fatalf("%s: status %d %s, want the route's own answer", name, status, body)
					}
				}
			}
		}
	})

	t.Run("healthz needs no key and x-api-key works", func(t *testing.T) {
		status, _, body := request(t, ctx, "GET", e.url+"/healthz", "", nil)
		if status != 200 || !strings.Contains(string(body), `"ok"`) {
			t.Fatalf("healthz: %d %s", status, body)
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/nodes", nil)
		req.Header.Set("x-api-key", readKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		keep(b)
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"n1"`) {
			t.Fatalf("x-api-key: %d %s", resp.StatusCode, b)
		}
		status, _, body = request(t, ctx, "GET", e.url+"/no/such/route", "", nil)
		if status != 401 {
			t.Fatalf("unknown route without key: %d %s (must not reveal routes)", status, body)
		}
	})

	t.Run("node limit", func(t *testing.T) {
		status, _, body := request(t, ctx, "GET", e.url+"/v1/nodes", n2Key, nil)
		keep(body)
		if status != 200 || strings.Contains(string(body), `"n1"`) || !strings.Contains(string(body), `"n2"`) {
			t.Fatalf("nodes for an n2-only key: %d %s", status, body)
		}
		status, _, body = request(t, ctx, "GET", e.url+"/v1/nodes/n1", n2Key, nil)
		if status != 404 || !strings.Contains(string(body), "node_not_found") {
			t.Fatalf("n1 for an n2-only key: %d %s", status, body)
		}
		run, _ := json.Marshal(map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "hi"})
		status, _, body = request(t, ctx, "POST", e.url+"/v1/runs", n2Key, run)
		if status != 404 || !strings.Contains(string(body), "node_not_found") {
			t.Fatalf("run on n1 with an n2-only key: %d %s", status, body)
		}
		// Without a node the run goes where the key may go.
		run, _ = json.Marshal(map[string]any{"adapter": "exec", "target": "upper", "input": "hi"})
		resp := startRunKey(t, ctx, e, n2Key, run)
		evs := collectRun(t, resp)
		checkWellFormed(t, evs)
		if evs[0].Node != "n2" {
			t.Fatalf("run without node for an n2-only key went to %s", evs[0].Node)
		}
		// Runs listed for it are n2's only.
		status, _, body = request(t, ctx, "GET", e.url+"/v1/runs", n2Key, nil)
		if status != 200 || strings.Contains(string(body), `"node":"n1"`) {
			t.Fatalf("runs for an n2-only key: %d %s", status, body)
		}
	})

	t.Run("run events name the key", func(t *testing.T) {
		ectx, ecancel := context.WithCancel(ctx)
		defer ecancel()
		req, _ := http.NewRequestWithContext(ectx, http.MethodGet, e.url+"/v1/events?type=run.event", nil)
		req.Header.Set("Authorization", "Bearer "+readKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("events: %v %v", err, resp)
		}
		defer resp.Body.Close()
		run, _ := json.Marshal(map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "hi"})
		evs := collectRun(t, startRunKey(t, ctx, e, runsKey, run))
		r := newSSE(resp.Body)
		for {
			ev, err := r.Next()
			if err != nil {
				t.Fatalf("event feed ended before run %s: %v", evs[0].RunID, err)
			}
			var m struct {
				Key string `json:"key"`
				Run struct {
					RunID string `json:"run_id"`
				} `json:"run"`
			}
			if json.Unmarshal([]byte(ev.Data), &m) == nil && m.Run.RunID == evs[0].RunID {
				if m.Key != "runner" {
					t.Fatalf("run.event of a run started with the runner key has key %q: %s", m.Key, ev.Data)
				}
				break
			}
		}
		if out := e.out.String(); !strings.Contains(out, "run="+evs[0].RunID) || !strings.Contains(out, "key=runner") {
			t.Fatal("the edge log does not name the key that started the run")
		}
	})

	t.Run("clean child environment", func(t *testing.T) {
		run, _ := json.Marshal(map[string]any{"node": "n1", "adapter": "exec", "target": "env", "input": ""})
		evs := collectRun(t, startRunKey(t, ctx, e, runsKey, run))
		checkWellFormed(t, evs)
		var out strings.Builder
		for _, ev := range evs {
			if ev.Type == "delta" {
				out.WriteString(ev.Text)
			}
		}
		env := out.String()
		for _, secret := range []string{testToken, "IOP_NODE_TOKEN", providerSecret, "OPENAI_API_KEY"} {
			if strings.Contains(env, secret) {
				t.Fatalf("exec target's environment holds %q:\n%s", secret, env)
			}
		}
		for _, want := range []string{"E2E_INHERITED=inherited-value", "E2E_DECLARED=declared-value", "PATH="} {
			if !strings.Contains(env, want) {
				t.Fatalf("exec target's environment lacks %q:\n%s", want, env)
			}
		}
	})

	t.Run("official openai client", func(t *testing.T) {
		bad := openai.NewClient(option.WithBaseURL(e.url+"/v1"), option.WithAPIKey(wrongKey), option.WithMaxRetries(0))
		_, err := bad.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: "m-sse", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
			t.Fatalf("bad key: %v", err)
		}
		good := openai.NewClient(option.WithBaseURL(e.url+"/v1"), option.WithAPIKey(inferenceKey), option.WithMaxRetries(0))
		stream := good.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model: "m-sse", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var text strings.Builder
		for stream.Next() {
			for _, ch := range stream.Current().Choices {
				text.WriteString(ch.Delta.Content)
			}
		}
		if err := stream.Err(); err != nil || !strings.HasPrefix(text.String(), "tok0 tok1 ") {
			t.Fatalf("good key stream: %v, text %q", err, text.String())
		}
	})

	t.Run("provider errors hide the upstream address", func(t *testing.T) {
		_, port, _ := strings.Cut(dead, ":")
		// Through the tunnel: the provider "dead" names a closed port.
		chat, _ := json.Marshal(map[string]any{"model": "m-dead", "messages": []map[string]string{{"role": "user", "content": "hi"}}})
		status, _, body := request(t, ctx, "POST", e.url+"/v1/chat/completions", inferenceKey, chat)
		keep(body)
		if status < 500 || !strings.Contains(string(body), "connection refused") || strings.Contains(string(body), port) {
			t.Fatalf("tunnel to a closed port: %d %s", status, body)
		}
		// Through a run of the openai runtime adapter.
		run, _ := json.Marshal(map[string]any{"node": "n1", "adapter": "deadllm", "target": "m-dead", "input": "hi"})
		evs := collectRun(t, startRunKey(t, ctx, e, runsKey, run))
		last := evs[len(evs)-1]
		if last.Type != "error" || last.Error == nil || !strings.Contains(last.Error.Message, "connection refused") || strings.Contains(last.Error.Message, port) {
			t.Fatalf("run against a closed port ended with %+v", last)
		}
	})

	t.Run("cli", func(t *testing.T) {
		_, stderr, code := cliEnv(t, e, nil, "nodes")
		if code != 1 || !strings.Contains(stderr, "refused the API key") || !strings.Contains(stderr, "--api-key") {
			t.Fatalf("iop nodes without a key: exit %d, stderr %q", code, stderr)
		}
		_, stderr, code = cliEnv(t, e, nil, "--api-key", wrongKey, "nodes")
		if code != 1 || !strings.Contains(stderr, "invalid API key") {
			t.Fatalf("iop nodes with a wrong key: exit %d, stderr %q", code, stderr)
		}
		_, stderr, code = cliEnv(t, e, []string{"IOP_API_KEY=" + readKey}, "reload")
		if code != 1 || !strings.Contains(stderr, "not allowed") || !strings.Contains(stderr, "admin") {
			t.Fatalf("iop reload with a read key: exit %d, stderr %q", code, stderr)
		}
		stdout, stderr, code := cliEnv(t, e, []string{"IOP_API_KEY=" + readKey}, "nodes")
		if code != 0 || !strings.Contains(stdout, "n1") {
			t.Fatalf("iop nodes with IOP_API_KEY: exit %d, %q %q", code, stdout, stderr)
		}
		stdout, stderr, code = cliEnv(t, e, nil, "--api-key", runsKey, "run", "--node", "n1", "--adapter", "exec", "--target", "upper", "hello")
		if code != 0 || !strings.Contains(stdout, "HELLO") {
			t.Fatalf("iop run --api-key: exit %d, %q %q", code, stdout, stderr)
		}
		keep([]byte(stdout + stderr))
	})

	// No key, token or provider secret in any answer or log line.
	secrets := append(append([]string(nil), allTestKeys...), testToken, providerSecret)
	for _, b := range bodies {
		for _, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Fatalf("an API answer holds a secret: %s", b)
			}
		}
	}
	for _, p := range []*proc{e.proc, n1.proc, n2.proc} {
		out := p.out.String()
		for _, s := range secrets {
			if strings.Contains(out, s) {
				t.Fatalf("%s logged a secret %q", p.name, s)
			}
		}
	}
	if out := e.out.String(); !strings.Contains(out, "key=operator") || !strings.Contains(out, "key=runner") {
		t.Fatalf("the edge's access log does not name the callers' keys:\n%s", out)
	}
}

func startRunKey(t *testing.T, ctx context.Context, e *edge, key string, body []byte) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/runs", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/runs: %v", err)
	}
	return resp
}

func TestFailedKeysAreThrottled(t *testing.T) {
	t.Parallel()
	e := startEdgeHTTP(t, authHTTP(), "", "IOP_E2E_RUNS_KEY="+runsKey)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var statuses []int
	for i := 0; i < 15; i++ {
		status, hdr, body := request(t, ctx, "GET", e.url+"/v1/nodes", fmt.Sprintf("%s-%d", wrongKey, i), nil)
		statuses = append(statuses, status)
		if status == 429 {
			var b struct {
				Error struct{ Code string } `json:"error"`
			}
			if json.Unmarshal(body, &b) != nil || b.Error.Code != "rate_limited" || hdr.Get("Retry-After") == "" {
				t.Fatalf("429 body %s, Retry-After %q", body, hdr.Get("Retry-After"))
			}
		}
	}
	if statuses[0] != 401 || statuses[len(statuses)-1] != 429 {
		t.Fatalf("statuses of 15 wrong keys: %v, want 401s then 429", statuses)
	}
	// Even the right key waits while the address is throttled.
	if status, _, _ := request(t, ctx, "GET", e.url+"/v1/nodes", readKey, nil); status != 429 {
		t.Fatalf("right key from a throttled address: %d", status)
	}
	// /healthz stays open.
	if status, _, _ := request(t, ctx, "GET", e.url+"/healthz", "", nil); status != 200 {
		t.Fatalf("healthz while throttled: %d", status)
	}
	// One aggregated line, not one per failure.
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(e.out.String(), "rejected invalid API keys") == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := strings.Count(e.out.String(), "rejected invalid API keys"); n != 1 {
		t.Fatalf("%d failure log lines for 15 failures, want 1 aggregated line", n)
	}
}

func TestPublicListenWithoutKeysRefusesToStart(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	doc := edgeConfig(freeAddr(t), "0.0.0.0:0", "")
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "iop-edge", nil, "--config", cfg)
	if code := p.waitExit(t, 10*time.Second); code == 0 {
		t.Fatalf("edge on 0.0.0.0 without keys exited 0:\n%s", p.out.String())
	}
	if out := p.out.String(); !strings.Contains(out, "not a loopback address") || !strings.Contains(out, "http.api_keys") {
		t.Fatalf("edge did not say why it refused to start:\n%s", out)
	}

	// Opting out explicitly starts the edge, with a warning. The port on
	// 0.0.0.0 is picked free but may be taken by a parallel test before the
	// edge binds it: then the edge exits, and another port is tried.
	var p2 *proc
	for attempt := 1; ; attempt++ {
		_, port, _ := strings.Cut(freeAddr(t), ":")
		cfg2 := filepath.Join(t.TempDir(), "edge.yaml")
		doc = strings.Replace(edgeConfig(freeAddr(t), "0.0.0.0:"+port, ""), "http:\n", "http:\n  allow_unauthenticated: true\n", 1)
		if err := os.WriteFile(cfg2, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		p2 = start(t, "iop-edge", nil, "--config", cfg2)
		if healthyOrExited(p2, "http://127.0.0.1:"+port, 10*time.Second) {
			break
		}
		if attempt == 3 {
			t.Fatalf("iop-edge with allow_unauthenticated did not start (3 tries):\n%s", p2.out.String())
		}
	}
	if out := p2.out.String(); !strings.Contains(out, "WARN") || !strings.Contains(out, "allow_unauthenticated") {
		t.Fatalf("edge with allow_unauthenticated did not warn:\n%s", out)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key as PEM files.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "iop e2e"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestHTTPSAPI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	e := &edge{transport: freeAddr(t), config: filepath.Join(dir, "edge.yaml")}
	httpAddr := freeAddr(t)
	e.url = "https://" + httpAddr
	cfg := edgeConfig(e.transport, httpAddr, "")
	listen := fmt.Sprintf("http:\n  listen: %q\n", httpAddr)
	cfg = strings.Replace(cfg, listen, listen+fmt.Sprintf("  tls: {cert_file: %q, key_file: %q}\n", certFile, keyFile)+authHTTP(), 1)
	if err := os.WriteFile(e.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	e.proc = start(t, "iop-edge", []string{"IOP_E2E_RUNS_KEY=" + runsKey}, "--config", e.config)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := hc.Get(e.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) || e.exited() {
			t.Fatalf("https edge not healthy: %v\n%s", err, e.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Plain HTTP on the HTTPS port gets nowhere.
	if resp, err := http.Get("http://" + httpAddr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain http answered on the https listener")
		}
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.Link(certFile, caFile); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := cliEnv(t, e, []string{"IOP_API_KEY=" + readKey}, "--ca-file", caFile, "nodes")
	if code != 0 {
		t.Fatalf("iop --ca-file over https: exit %d, %q %q", code, stdout, stderr)
	}
	_, stderr, code = cliEnv(t, e, []string{"IOP_API_KEY=" + readKey}, "nodes")
	if code != 1 || !strings.Contains(stderr, "certificate") {
		t.Fatalf("iop without the CA over https: exit %d, stderr %q", code, stderr)
	}
}

// healthyOrExited waits until the process answers /healthz (true) or exits
// (false), for at most d (false).
func healthyOrExited(p *proc, url string, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if p.exited() {
			return false
		}
		if resp, err := http.Get(url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
	}
	return false
}

// A session belongs to the key that first ran it, also after the edge
// restarted (the owner is then read from the history): another key may
// neither run it nor end it, an admin key may run it, and its owner goes
// on — also when the owner's newest turns were refused by its node. runner
// and n2-only both hold the runs scope.
func TestSessionsBelongToTheirKey(t *testing.T) {
	t.Parallel()
	nodes := `
  - id: n2
    token: e2e-token-0002
    adapters:
      - name: exec
        type: exec
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
`
	env := "IOP_E2E_RUNS_KEY=" + runsKey
	e := startEdgeHTTP(t, authHTTP(), nodes, env)
	startNode(t, e, "e2e-token-0002")
	waitNodeKey(t, e, "n2", adminKey)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run, _ := json.Marshal(map[string]any{"adapter": "exec", "target": "upper", "input": "hi", "session_id": "s1"})
	turn := func(key string) {
		t.Helper()
		evs := collectRun(t, startRunKey(t, ctx, e, key, run))
		if len(evs) == 0 || evs[len(evs)-1].Type != "complete" {
			t.Fatalf("turn with %s: %+v", key, evs)
		}
	}
	refused := func(method, path string, body []byte) {
		t.Helper()
		status, _, b := request(t, ctx, method, e.url+path, n2Key, body)
		if status != http.StatusForbidden || !strings.Contains(string(b), "belongs to another API key") {
			t.Fatalf("%s %s with n2-only's key: %d %s, want 403 (the session is runner's)", method, path, status, b)
		}
		checkRefusal(t, iopDialect, status, b)
	}

	turn(runsKey)
	refused("POST", "/v1/runs", run)
	refused("DELETE", "/v1/sessions/s1?adapter=exec", nil)
	_, stderr, code := cliEnv(t, e, nil, "--api-key", n2Key, "run", "--adapter", "exec", "--target", "upper", "--session", "s1", "hi")
	if code == 0 || !strings.Contains(stderr, "belongs to another API key") {
		t.Fatalf("iop run of runner's session with n2-only's key: exit %d, stderr %q", code, stderr)
	}
	turn(adminKey)
	turn(runsKey)
	// n2-only's own session is its own.
	own, _ := json.Marshal(map[string]any{"adapter": "exec", "target": "upper", "input": "hi", "session_id": "s2"})
	if evs := collectRun(t, startRunKey(t, ctx, e, n2Key, own)); len(evs) == 0 || evs[len(evs)-1].Type != "complete" {
		t.Fatalf("n2-only's own session: %+v", evs)
	}

	// The owner's turns its node refused (an unknown target here; a full
	// node's at_capacity alike), more than the edge reads to recall an
	// owner, are s1's newest runs in the history: they must not hide whose
	// it is after the restart.
	bad, _ := json.Marshal(map[string]any{"adapter": "exec", "target": "nope", "input": "hi", "session_id": "s1"})
	for range 9 {
		status, _, b := request(t, ctx, "POST", e.url+"/v1/runs", runsKey, bad)
		if status != http.StatusNotFound || !strings.Contains(string(b), "target_not_found") {
			t.Fatalf("runner's turn of an unknown target: %d %s, want the node's 404 target_not_found", status, b)
		}
	}

	// After a restart the edge remembers no session: the history names
	// the keys that ran s1 (it is written in batches; a stop flushes it).
	e.stop(syscall.SIGTERM, 10*time.Second)
	e.proc = start(t, "iop-edge", []string{env}, "--config", e.config)
	waitHealthy(t, e.url, e.proc)
	waitNodeKey(t, e, "n2", adminKey)
	refused("POST", "/v1/runs", run)
	refused("DELETE", "/v1/sessions/s1?adapter=exec", nil)
	turn(runsKey)
	// The owner may end it (exec keeps no sessions, so its node answers).
	status, _, b := request(t, ctx, "DELETE", e.url+"/v1/sessions/s1?adapter=exec", runsKey, nil)
	if status != http.StatusNotImplemented || !strings.Contains(string(b), "session_unsupported") {
		t.Fatalf("runner ending its session: %d %s, want the node's 501 session_unsupported", status, b)
	}
}
