package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// standIn is a local provider speaking the documented Ollama and OpenAI
// formats; it records every chat request body it receives.
type standIn struct {
	*httptest.Server
	mu       sync.Mutex
	requests []map[string]any
}

func newStandIn(t *testing.T) *standIn {
	s := &standIn{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/chat", func(w http.ResponseWriter, r *http.Request) {
		n := s.record(r)
		w.Header().Set("Content-Type", "application/x-ndjson")
		f := w.(http.Flusher)
		for _, line := range []string{
			`{"model":"qwen3","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"","thinking":"Let me"},"done":false}`,
			fmt.Sprintf(`{"model":"qwen3","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"reply %d"},"done":false}`, n),
			`{"model":"qwen3","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":182242375,"load_duration":41295167,"prompt_eval_count":11,"prompt_eval_duration":24573166,"eval_count":4,"eval_duration":115959084}`,
		} {
			io.WriteString(w, line+"\n")
			f.Flush()
		}
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		n := s.record(r)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for _, line := range []string{
			`: keep-alive`,
			`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"think"},"finish_reason":null}],"usage":null}`,
			fmt.Sprintf(`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"answer %d"},"finish_reason":null}],"usage":null}`, n),
			`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`,
			`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":6,"total_tokens":26}}`,
			`data: [DONE]`,
		} {
			io.WriteString(w, line+"\n\n")
			f.Flush()
		}
	})
	mux.HandleFunc("POST /api/pull", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		f := w.(http.Flusher)
		lines := []string{`{"status":"pulling manifest"}`}
		for c := 0; c <= 4; c++ {
			lines = append(lines, fmt.Sprintf(`{"status":"pulling 8eeb52dfb3bb","digest":"sha256:8eeb52dfb3bb","total":4000,"completed":%d}`, c*1000))
		}
		lines = append(lines, `{"status":"verifying sha256 digest"}`, `{"status":"writing manifest"}`, `{"status":"success"}`)
		for _, l := range lines {
			io.WriteString(w, l+"\n")
			f.Flush()
			time.Sleep(20 * time.Millisecond)
		}
	})
	mux.HandleFunc("GET /api/tags", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"models":[{"name":"qwen3:latest","model":"qwen3:latest","modified_at":"2026-01-01T00:00:00Z","size":5200000000,"digest":"abc","details":{"format":"gguf","family":"qwen3","parameter_size":"8B","quantization_level":"Q4_K_M"}}]}`)
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func (s *standIn) record(r *http.Request) int {
	var m map[string]any
	_ = json.NewDecoder(r.Body).Decode(&m)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, m)
	return len(s.requests)
}

func (s *standIn) last() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[len(s.requests)-1]
}

// messages returns role:content pairs of a recorded chat request.
func messages(req map[string]any) []string {
	var out []string
	list, _ := req["messages"].([]any)
	for _, m := range list {
		mm, _ := m.(map[string]any)
		out = append(out, fmt.Sprintf("%v:%v", mm["role"], mm["content"]))
	}
	return out
}

const fakeClaude = `#!/bin/sh
echo "$@" >> "$(dirname "$0")/argv.log"
cat > /dev/null
echo '{"type":"system","subtype":"init","session_id":"sess-abc","cwd":"/w","model":"claude-x","tools":[]}'
echo 'not json, skipped'
echo '{"type":"assistant","message":{"content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Hello from claude"}]}}'
echo '{"type":"result","subtype":"success","is_error":false,"result":"Hello from claude","session_id":"sess-abc","num_turns":1,"duration_ms":12,"total_cost_usd":0.0412,"usage":{"input_tokens":9,"output_tokens":77}}'
`

func TestRuntimeAdaptersWithStandIns(t *testing.T) {
	si := newStandIn(t)
	dir := t.TempDir()
	claude := filepath.Join(dir, "claude")
	if err := os.WriteFile(claude, []byte(fakeClaude), 0o755); err != nil {
		t.Fatal(err)
	}
	nodes := fmt.Sprintf(`
  - id: n1
    token: %s
    adapters:
      - {name: llm, type: ollama, base_url: %q}
      - {name: gpt, type: openai, base_url: %q}
      - {name: claude, type: claude-code, command: %q, work_dir: %q}
`, testToken, si.URL, si.URL, claude, dir)
	e := startEdge(t, nodes)
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	run := func(adapter, target, session, input string) []runEvent {
		t.Helper()
		evs := collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": adapter, "target": target, "session_id": session, "input": input}))
		checkWellFormed(t, evs)
		if last := evs[len(evs)-1]; last.Type != "complete" {
			t.Fatalf("%s run ended %+v", adapter, last)
		}
		return evs
	}
	text := func(evs []runEvent, typ string) string {
		var b strings.Builder
		for _, ev := range evs {
			if ev.Type == typ {
				b.WriteString(ev.Text)
			}
		}
		return b.String()
	}

	// Ollama: a two-turn chat session; the second upstream request carries
	// the first turn's messages.
	evs := run("llm", "qwen3", "s1", "hi")
	if text(evs, "delta") != "reply 1" || text(evs, "reasoning_delta") != "Let me" {
		t.Fatalf("ollama events %+v", evs)
	}
	if u := evs[len(evs)-1].Usage; u == nil || u.PromptTokens != 11 || u.CompletionTokens != 4 {
		t.Fatalf("ollama usage %+v", evs[len(evs)-1])
	}
	run("llm", "qwen3", "s1", "again")
	if got := strings.Join(messages(si.last()), "|"); got != "user:hi|assistant:reply 1|user:again" {
		t.Fatalf("second turn sent %q", got)
	}

	// OpenAI-compatible: the same, with reasoning_content and include_usage.
	evs = run("gpt", "m", "s2", "q1")
	if text(evs, "delta") != "answer 3" || text(evs, "reasoning_delta") != "think" {
		t.Fatalf("openai events %+v", evs)
	}
	run("gpt", "m", "s2", "q2")
	if got := strings.Join(messages(si.last()), "|"); got != "user:q1|assistant:answer 3|user:q2" {
		t.Fatalf("openai second turn sent %q", got)
	}
	if so, _ := si.last()["stream_options"].(map[string]any); so["include_usage"] != true {
		t.Fatalf("include_usage not requested: %v", si.last())
	}
	// A run carries one answer: n=2 is refused before it starts, and
	// reaches neither the server nor the session.
	r, body := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "gpt", "target": "m", "session_id": "s2", "input": "q3", "options": map[string]any{"n": 2}})
	if r.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "invalid_request") || !strings.Contains(string(body), `\"n\"`) {
		t.Fatalf("openai run with n=2: %d %s, want 400 invalid_request naming n", r.StatusCode, body)
	}
	run("gpt", "m", "s2", "q4")
	if got := strings.Join(messages(si.last()), "|"); got != "user:q1|assistant:answer 3|user:q2|assistant:answer 4|user:q4" {
		t.Fatalf("openai third turn sent %q", got)
	}

	// session_list shows both; terminating s1 makes the next turn fresh.
	r, body = postJSON(t, e.url+"/v1/nodes/n1/commands", map[string]any{"command": "session_list"})
	if r.StatusCode != 200 || !strings.Contains(string(body), `"s1"`) || !strings.Contains(string(body), `"s2"`) {
		t.Fatalf("session_list: %d %s", r.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodDelete, e.url+"/v1/sessions/s1?node=n1&adapter=llm&target=qwen3", nil)
	dr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	dr.Body.Close()
	if dr.StatusCode != 200 {
		t.Fatalf("terminate session: %d", dr.StatusCode)
	}
	run("llm", "qwen3", "s1", "fresh")
	if got := strings.Join(messages(si.last()), "|"); got != "user:fresh" {
		t.Fatalf("after termination sent %q", got)
	}
	// A session the node does not keep (a typo, another adapter's) is not
	// reported ended: 404 session_not_found, and iop session end fails.
	for _, q := range []string{"/v1/sessions/typo?node=n1&adapter=llm", "/v1/sessions/s1?node=n1&adapter=gpt"} {
		status, _, b := request(t, ctx, http.MethodDelete, e.url+q, "", nil)
		if status != http.StatusNotFound || !strings.Contains(string(b), `"session_not_found"`) || !strings.Contains(string(b), `node \"n1\"`) {
			t.Fatalf("DELETE %s: %d %s, want 404 session_not_found naming the node", q, status, b)
		}
	}
	if out, errOut, code := cli(t, e, "", "session", "end", "typo", "--adapter", "llm", "--node", "n1"); code == 0 || !strings.Contains(errOut, `"typo"`) || !strings.Contains(errOut, "session_not_found") {
		t.Fatalf("iop session end typo: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if out, errOut, code := cli(t, e, "", "session", "end", "s1", "--adapter", "llm", "--node", "n1"); code != 0 || !strings.Contains(out, "session s1 of adapter llm ended on node n1") {
		t.Fatalf("iop session end s1: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}

	// Claude Code: documented stream-json; the second run resumes the session.
	evs = run("claude", "", "c1", "do it")
	if text(evs, "delta") != "Hello from claude" || text(evs, "reasoning_delta") != "hmm" {
		t.Fatalf("claude events %+v", evs)
	}
	run("claude", "", "c1", "and more")
	argv, _ := os.ReadFile(filepath.Join(dir, "argv.log"))
	lines := strings.Split(strings.TrimSpace(string(argv)), "\n")
	if len(lines) != 2 || strings.Contains(lines[0], "--resume") || !strings.Contains(lines[1], "--resume=sess-abc") ||
		!strings.Contains(lines[0], "--output-format stream-json") || !strings.Contains(lines[0], "--verbose") {
		t.Fatalf("claude argv:\n%s", argv)
	}

	// An agent session ends once; then it is unknown.
	if out, errOut, code := cli(t, e, "", "session", "end", "c1", "--adapter", "claude", "--node", "n1"); code != 0 {
		t.Fatalf("iop session end c1: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if out, errOut, code := cli(t, e, "", "session", "end", "c1", "--adapter", "claude", "--node", "n1"); code == 0 || !strings.Contains(errOut, "session_not_found") {
		t.Fatalf("iop session end c1 again: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}

	// usage_status sums tokens from the complete events of all adapters.
	r, body = postJSON(t, e.url+"/v1/nodes/n1/commands", map[string]any{"command": "usage_status"})
	var us struct {
		Adapters []struct {
			Adapter          string  `json:"adapter"`
			Succeeded        int     `json:"succeeded"`
			PromptTokens     int64   `json:"prompt_tokens"`
			CompletionTokens int64   `json:"completion_tokens"`
			CostUSD          float64 `json:"cost_usd"`
		} `json:"adapters"`
	}
	if r.StatusCode != 200 || json.Unmarshal(body, &us) != nil {
		t.Fatalf("usage_status %d %s", r.StatusCode, body)
	}
	got := map[string]string{}
	for _, a := range us.Adapters {
		got[a.Adapter] = fmt.Sprintf("%d/%d/%d/%.4f", a.Succeeded, a.PromptTokens, a.CompletionTokens, a.CostUSD)
	}
	want := map[string]string{"llm": "3/33/12/0.0000", "gpt": "3/60/18/0.0000", "claude": "2/18/154/0.0824"}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("usage_status %s = %s, want %s (all: %v)", k, got[k], v, got)
		}
	}

	// iop ollama pull shows progress from the stand-in and succeeds.
	out, errOut, code := cli(t, e, "", "ollama", "pull", "qwen3", "--node", "n1")
	if code != 0 || !strings.Contains(out+errOut, "success") || !strings.Contains(out+errOut, "100%") {
		t.Fatalf("iop ollama pull: %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	out, _, code = cli(t, e, "", "ollama", "list", "--node", "n1")
	if code != 0 || !strings.Contains(out, "qwen3:latest") {
		t.Fatalf("iop ollama list: %d %s", code, out)
	}
}

// An Ollama declared only as a tunnel provider still answers ollama.*.
func TestOllamaCommandsThroughProviderOnlyNode(t *testing.T) {
	si := newStandIn(t)
	e := startEdge(t, fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: local-ollama, type: ollama, base_url: %q, models: [qwen3]}
`, testToken, si.URL))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	out, errOut, code := cli(t, e, "", "ollama", "list", "--node", "n1")
	if code != 0 || !strings.Contains(out, "qwen3:latest") {
		t.Fatalf("iop ollama list: %d %s %s", code, out, errOut)
	}
	out, errOut, code = cli(t, e, "", "ollama", "pull", "qwen3", "--node", "n1")
	if code != 0 || !strings.Contains(out+errOut, "success") {
		t.Fatalf("iop ollama pull: %d %s %s", code, out, errOut)
	}
	r, body := postJSON(t, e.url+"/v1/nodes/n1/commands", map[string]any{"command": "capabilities"})
	if r.StatusCode != 200 || !strings.Contains(string(body), `"ollama.pull"`) {
		t.Fatalf("capabilities: %d %s", r.StatusCode, body)
	}
}

// An adapter's max_history_bytes travels from edge.yaml to the node: with
// the smallest bound (1 KiB) a session's fourth turn replays only the two
// turns before it, where the default 1 MiB would replay all three.
func TestChatHistoryBoundFromConfig(t *testing.T) {
	si := newStandIn(t)
	nodes := fmt.Sprintf(`
  - id: n1
    token: %s
    adapters:
      - {name: llm, type: ollama, base_url: %q, max_history_bytes: 1024}
`, testToken, si.URL)
	e := startEdge(t, nodes)
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	big := strings.Repeat("x", 400)
	for i := range 4 {
		evs := collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": "llm", "target": "qwen3", "session_id": "s1", "input": fmt.Sprintf("turn %d %s", i, big)}))
		if last := evs[len(evs)-1]; last.Type != "complete" {
			t.Fatalf("turn %d ended %+v", i, last)
		}
	}
	sent := messages(si.last())
	if len(sent) != 2*2+1 || !strings.HasPrefix(sent[0], "user:turn 1 ") || !strings.HasPrefix(sent[4], "user:turn 3 ") {
		t.Fatalf("the fourth turn sent %d messages, want turns 1 and 2 and its own: %.40q", len(sent), sent)
	}
}
