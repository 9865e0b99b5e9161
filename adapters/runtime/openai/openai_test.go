package openai_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/adapters/runtime/internal/standin"
	"iop/adapters/runtime/openai"
	"iop/adapters/runtime/runtimetest"
	"iop/adapters/store/memory"
	"iop/domain"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const deadline = 20 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

func sse(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		standin.Split(w, body)
	}
}

func status(code int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

// events joins SSE events: each payload becomes "data: payload" plus a
// blank line; payloads starting with ":" or "event:" are sent as they are.
func events(sep string, payloads ...string) string {
	var b strings.Builder
	for _, p := range payloads {
		if strings.HasPrefix(p, ":") || strings.HasPrefix(p, "event:") {
			b.WriteString(p + sep)
			continue
		}
		b.WriteString("data: " + p + sep + sep)
	}
	return b.String()
}

func chunk(delta string, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"served-model","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + `}],"usage":null}`
}

const usageChunk = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"served-model","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}`

var stream = events("\n",
	": OPENROUTER PROCESSING",
	chunk(`{"role":"assistant","content":""}`, ""),
	chunk(`{"reasoning":"Think"}`, ""),
	chunk(`{"reasoning_content":"ing… 🤔"}`, ""),
	chunk(`{"content":"Héllo"}`, ""),
	"event: ignored",
	"not json at all",
	chunk(`{"content":", wörld 😀","reasoning":null}`, ""),
	chunk(`{"content":null}`, "stop"),
	usageChunk,
	"[DONE]",
)

func newAdapter(t *testing.T, cfg domain.AdapterConfig, chats *memory.ChatStore) *openai.Adapter {
	t.Helper()
	cfg.Name, cfg.Type = "llm", domain.AdapterOpenAI
	var a *openai.Adapter
	var err error
	if chats == nil {
		a, err = openai.New(cfg, nil)
	} else {
		a, err = openai.New(cfg, chats)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func run(t *testing.T, a *openai.Adapter, req domain.RunRequest) (*runtimetest.Sink, error) {
	t.Helper()
	req.RunID, req.Adapter = "r1", "llm"
	sink := &runtimetest.Sink{}
	err := a.Execute(testContext(t), req, sink)
	return sink, err
}

func requireTerminal(t *testing.T, sink *runtimetest.Sink, typ domain.EventType, code string) domain.RunEvent {
	t.Helper()
	events := sink.Events()
	if len(events) == 0 {
		t.Fatal("no events")
	}
	last := events[len(events)-1]
	if last.Type != typ {
		t.Fatalf("last event = %+v, want %s (events %v)", last, typ, sink.Types())
	}
	if code != "" && (last.Error == nil || last.Error.Code != code) {
		t.Fatalf("last event error = %+v, want code %s", last.Error, code)
	}
	for _, ev := range events[:len(events)-1] {
		if ev.Type.Terminal() || ev.Type == domain.EventStart {
			t.Fatalf("unexpected %s event before the end: %v", ev.Type, sink.Types())
		}
	}
	return last
}

func reasoning(sink *runtimetest.Sink) string {
	var b strings.Builder
	for _, ev := range sink.Events() {
		if ev.Type == domain.EventReasoningDelta {
			b.WriteString(ev.Text)
		}
	}
	return b.String()
}

func TestStreamMappingUsageAndRequest(t *testing.T) {
	t.Setenv("IOP_TEST_OPENAI_KEY", "sk-secret")
	srv := standin.NewServer(t, sse(stream))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL, APIKeyEnv: "IOP_TEST_OPENAI_KEY"}, nil)
	sink, err := run(t, a, domain.RunRequest{
		Target:  "my-model",
		Input:   []byte("Say hello"),
		Options: []byte(`{"temperature":0.5,"max_tokens":64,"model":"other","stream":false,"messages":[],"stream_options":{"include_usage":false}}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	if got := sink.Text(); got != "Héllo, wörld 😀" {
		t.Errorf("text = %q", got)
	}
	if got := reasoning(sink); got != "Thinking… 🤔" {
		t.Errorf("reasoning = %q", got)
	}
	u := done.Usage
	if u == nil || u.PromptTokens != 12 || u.CompletionTokens != 7 || u.TotalTokens != 19 || u.StopReason != "stop" || u.Model != "served-model" || u.DurationMS < 0 {
		t.Errorf("usage = %+v", u)
	}
	for _, ev := range sink.Events() {
		if strings.Contains(ev.Text+string(ev.Metadata), "sk-secret") {
			t.Errorf("the API key leaked into an event: %+v", ev)
		}
	}

	req := srv.Request(t, 0)
	if req.Method+" "+req.Path != "POST /v1/chat/completions" {
		t.Errorf("request = %s %s", req.Method, req.Path)
	}
	if got := req.Header.Get("Authorization"); got != "Bearer sk-secret" {
		t.Errorf("Authorization = %q", got)
	}
	want := map[string]string{
		"model":          `"my-model"`,
		"stream":         "true",
		"stream_options": `{"include_usage":true}`,
		"messages":       `[{"role":"user","content":"Say hello"}]`,
		"temperature":    "0.5",
		"max_tokens":     "64",
	}
	for k, v := range want {
		if string(req.Body[k]) != v {
			t.Errorf("%s = %s, want %s", k, req.Body[k], v)
		}
	}
	if len(req.Body) != len(want) {
		t.Errorf("body has keys %v", req.Body)
	}
}

func TestCRLFAndNoKey(t *testing.T) {
	t.Setenv("IOP_TEST_OPENAI_KEY", "")
	srv := standin.NewServer(t, sse(events("\r\n", chunk(`{"content":"ok"}`, "length"), "[DONE]")))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL, APIKeyEnv: "IOP_TEST_OPENAI_KEY", Models: []string{"m1"}}, nil)
	sink, err := run(t, a, domain.RunRequest{Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	if sink.Text() != "ok" || done.Usage.StopReason != "length" || done.Usage.PromptTokens != 0 {
		t.Errorf("text %q, usage %+v", sink.Text(), done.Usage)
	}
	req := srv.Request(t, 0)
	if req.Header.Get("Authorization") != "" {
		t.Error("Authorization sent without a key")
	}
	if string(req.Body["model"]) != `"m1"` {
		t.Errorf("model = %s, want the first configured model", req.Body["model"])
	}
}

func TestPathPrefix(t *testing.T) {
	for prefix, path := range map[string]string{"": "/v1/chat/completions", "/api/v1": "/api/v1/chat/completions", "openai/": "/openai/chat/completions", "/": "/chat/completions"} {
		srv := standin.NewServer(t, sse(events("\n", chunk(`{"content":"ok"}`, "stop"), "[DONE]")))
		a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL + "/", PathPrefix: prefix}, nil)
		if _, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")}); err != nil {
			t.Fatal(err)
		}
		if got := srv.Request(t, 0).Path; got != path {
			t.Errorf("path_prefix %q: request path %s, want %s", prefix, got, path)
		}
	}
}

func TestToolCallsAndWholeJSONAnswer(t *testing.T) {
	srv := standin.NewServer(t, sse(events("\n",
		chunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"ci"}}]}`, ""),
		chunk(`{}`, "tool_calls"), "[DONE]")))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("weather?")})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if ev := sink.Events()[0]; ev.Type != domain.EventMetadata || !strings.Contains(string(ev.Metadata), `"tool_calls":[{"index":0,"id":"call_1"`) {
		t.Errorf("first event = %+v", ev)
	}

	whole := standin.NewServer(t, status(200, `{"id":"c","object":"chat.completion","model":"m2","choices":[{"index":0,"message":{"role":"assistant","content":"Whole answer","reasoning_content":"why"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`))
	a = newAdapter(t, domain.AdapterConfig{BaseURL: whole.URL}, nil)
	sink, err = run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	if sink.Text() != "Whole answer" || reasoning(sink) != "why" || done.Usage.TotalTokens != 5 || done.Usage.Model != "m2" {
		t.Errorf("text %q reasoning %q usage %+v", sink.Text(), reasoning(sink), done.Usage)
	}
}

// TestReasoningFields: a server may name the reasoning delta.reasoning or
// delta.reasoning_content, and some vLLM versions send the same text in both
// in one chunk; each text must come out once.
func TestReasoningFields(t *testing.T) {
	streamed := func(deltas ...string) string {
		payloads := make([]string, 0, len(deltas)+2)
		for _, d := range deltas {
			payloads = append(payloads, chunk(d, ""))
		}
		return events("\n", append(payloads, chunk(`{"content":"ok"}`, "stop"), "[DONE]")...)
	}
	whole := func(msg string) string {
		return `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":` + msg + `,"finish_reason":"stop"}]}`
	}
	for name, h := range map[string]http.HandlerFunc{
		"both fields":              sse(streamed(`{"reasoning":"Let ","reasoning_content":"Let "}`, `{"reasoning":"me think","reasoning_content":"me think"}`)),
		"reasoning_content only":   sse(streamed(`{"reasoning_content":"Let "}`, `{"reasoning_content":"me think"}`)),
		"reasoning only":           sse(streamed(`{"reasoning":"Let "}`, `{"reasoning":"me think","reasoning_content":null}`)),
		"whole answer, both":       status(200, whole(`{"role":"assistant","content":"ok","reasoning":"Let me think","reasoning_content":"Let me think"}`)),
		"whole answer, one of two": status(200, whole(`{"role":"assistant","content":"ok","reasoning":"","reasoning_content":"Let me think"}`)),
	} {
		t.Run(name, func(t *testing.T) {
			srv := standin.NewServer(t, h)
			a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
			sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
			if err != nil {
				t.Fatal(err)
			}
			requireTerminal(t, sink, domain.EventComplete, "")
			if got := reasoning(sink); got != "Let me think" || sink.Text() != "ok" {
				t.Errorf("reasoning %q text %q, want %q and %q", got, sink.Text(), "Let me think", "ok")
			}
		})
	}
}

func TestErrors(t *testing.T) {
	cases := []struct {
		name    string
		handle  http.HandlerFunc
		code    string
		message string
		text    string
	}{
		{"404", status(404, `{"error":{"message":"The model 'nope' does not exist","type":"invalid_request_error","param":"model","code":"model_not_found"}}`),
			domain.CodeModelNotFound, "The model 'nope' does not exist", ""},
		{"400 model code", status(400, `{"error":{"message":"invalid model ID","code":"model_not_found"}}`), domain.CodeModelNotFound, "invalid model ID", ""},
		{"429", status(429, `{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}`),
			domain.CodeProviderError, "Rate limit reached for requests", ""},
		{"401", status(401, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`),
			domain.CodeProviderError, "Incorrect API key provided", ""},
		{"500 text", status(500, "Internal Server Error"), domain.CodeProviderError, "HTTP 500 Internal Server Error", ""},
		{"mid-stream error", sse(events("\n", chunk(`{"content":"par"}`, ""), `{"error":{"message":"Upstream provider overloaded","code":502}}`)),
			domain.CodeProviderError, "Upstream provider overloaded", "par"},
		{"ends without DONE", sse(events("\n", chunk(`{"content":"par"}`, ""))), domain.CodeProviderError, "", "par"},
		// A server whose non-streamed answer is no completion has failed;
		// the run did not complete with nothing.
		{"200 JSON type, not JSON", status(200, "<html>oops</html>"), domain.CodeProviderError, "the server's response is not JSON: <html>oops</html>", ""},
		{"500 HTML, cut inside no character", status(500, "<html>"+strings.Repeat("a", 1017)+strings.Repeat("é", 50)),
			domain.CodeProviderError, "HTTP 500 Internal Server Error: <html>" + strings.Repeat("a", 1017) + "…", ""},
		// An event whose data lines never end with a blank line must not
		// grow the node's memory: past 16 MiB the run fails.
		{"endless event", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			line := "data: " + strings.Repeat("x", 1<<10) + "\n"
			for range 17 << 10 {
				if _, err := io.WriteString(w, line); err != nil {
					return
				}
			}
		}, domain.CodeProviderError, fmt.Sprintf("the server sent an event of more than %d bytes", 16<<20), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := standin.NewServer(t, tc.handle)
			a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
			sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
			if err != nil {
				t.Fatal(err)
			}
			ev := requireTerminal(t, sink, domain.EventError, tc.code)
			if tc.message != "" && ev.Error.Message != tc.message {
				t.Errorf("message = %q, want %q", ev.Error.Message, tc.message)
			}
			if sink.Text() != tc.text {
				t.Errorf("text = %q, want %q", sink.Text(), tc.text)
			}
		})
	}
}

func TestEndWithoutDoneAfterFinishCompletes(t *testing.T) {
	srv := standin.NewServer(t, sse(events("\n", chunk(`{"content":"all"}`, "stop"), usageChunk)))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	if done := requireTerminal(t, sink, domain.EventComplete, ""); done.Usage.TotalTokens != 19 {
		t.Errorf("usage = %+v", done.Usage)
	}
}

func TestConnectRefused(t *testing.T) {
	a := newAdapter(t, domain.AdapterConfig{BaseURL: standin.RefusedURL(t)}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventError, domain.CodeProviderUnreachable)
}

func TestCancelClosesTheUpstreamRequest(t *testing.T) {
	gone := make(chan struct{})
	srv := standin.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, events("\n", chunk(`{"content":"Hi"}`, "")))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(gone)
		case <-time.After(deadline):
		}
	})
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	sink := &runtimetest.Sink{}
	exited := make(chan error, 1)
	go func() {
		exited <- a.Execute(ctx, domain.RunRequest{RunID: "r1", Adapter: "llm", Target: "m", Input: []byte("hi")}, sink)
	}()
	if err := sink.WaitFor(testContext(t), func(evs []domain.RunEvent) bool { return len(evs) > 0 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-exited; !errors.Is(err, context.Canceled) {
		t.Fatalf("Execute = %v, want context.Canceled", err)
	}
	select {
	case <-gone:
	case <-time.After(deadline):
		t.Fatal("the server never saw the request end")
	}
	if _, ok := sink.Terminal(); ok {
		t.Errorf("terminal event after cancel: %v", sink.Types())
	}
}

func TestSessions(t *testing.T) {
	var mu sync.Mutex
	n := 0
	srv := standin.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		if i == 2 {
			status(429, `{"error":{"message":"slow down"}}`)(w, r)
			return
		}
		reply, _ := json.Marshal(fmt.Sprintf("reply %d", i))
		sse(events("\n", chunk(`{"content":`+string(reply)+`}`, "stop"), "[DONE]"))(w, r)
	})
	chats := memory.NewChatStore()
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, chats)
	turn := func(input string) *runtimetest.Sink {
		t.Helper()
		sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte(input), SessionID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		return sink
	}
	sent := func(i int) string {
		var msgs []struct{ Role, Content string }
		if err := json.Unmarshal(srv.Request(t, i).Body["messages"], &msgs); err != nil {
			t.Fatal(err)
		}
		parts := []string{}
		for _, m := range msgs {
			parts = append(parts, m.Role+":"+m.Content)
		}
		return strings.Join(parts, " | ")
	}
	requireTerminal(t, turn("one"), domain.EventComplete, "")
	requireTerminal(t, turn("two"), domain.EventError, domain.CodeProviderError)
	requireTerminal(t, turn(`{"messages":[{"role":"user","content":[{"type":"text","text":"three"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`), domain.EventComplete, "")
	if got, want := sent(1), "user:one | assistant:reply 1 | user:two"; got != want {
		t.Errorf("second turn sent %q, want %q", got, want)
	}
	// The failed turn was not kept; the parts message went upstream whole.
	var third []json.RawMessage
	_ = json.Unmarshal(srv.Request(t, 2).Body["messages"], &third)
	if len(third) != 3 || !strings.Contains(string(third[2]), "image_url") {
		t.Errorf("third turn sent %s", srv.Request(t, 2).Body["messages"])
	}
	msgs, _ := chats.LoadChat(context.Background(), "llm", "s1", 0)
	if len(msgs) != 4 || msgs[2].Content != "three" || msgs[3].Content != "reply 3" {
		t.Errorf("stored %+v", msgs)
	}
	if err := a.TerminateSession(context.Background(), "m", "s1"); err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, turn("fresh"), domain.EventComplete, "")
	if got := sent(3); got != "user:fresh" {
		t.Errorf("after terminate sent %q", got)
	}
	if list, err := a.ListSessions(context.Background(), domain.SessionQuery{}); err != nil || len(list) != 1 || list[0].Turns != 1 {
		t.Errorf("ListSessions = %+v, %v", list, err)
	}
}

// A session that uses tool calls stays valid: the reply's tool calls
// (merged from their streamed fragments) are stored with it, and the
// caller's tool messages keep their tool_call_id, so every later turn
// replays tool messages right after the assistant message that made the
// call.
func TestSessionToolCalls(t *testing.T) {
	var mu sync.Mutex
	n := 0
	srv := standin.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		if i == 1 {
			sse(events("\n",
				chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_time","arguments":""}}]}`, ""),
				chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"tz\":"}}]}`, ""),
				chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"\"UTC\"}"}}]}`, "tool_calls"),
				"[DONE]"))(w, r)
			return
		}
		sse(events("\n", chunk(`{"content":"It is noon."}`, "stop"), "[DONE]"))(w, r)
	})
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, memory.NewChatStore())
	for _, input := range []string{"what time is it?", `{"messages":[{"role":"tool","tool_call_id":"call_1","content":"12:00"}]}`, "thanks"} {
		sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte(input), SessionID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		requireTerminal(t, sink, domain.EventComplete, "")
	}
	for i := 1; i <= 2; i++ {
		var msgs []struct {
			Role       string `json:"role"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct{ Name, Arguments string }
			} `json:"tool_calls"`
		}
		raw := srv.Request(t, i).Body["messages"]
		if err := json.Unmarshal(raw, &msgs); err != nil {
			t.Fatal(err)
		}
		if len(msgs) < 3 {
			t.Fatalf("request %d sent %s", i+1, raw)
		}
		call := msgs[1].ToolCalls
		if msgs[1].Role != "assistant" || len(call) != 1 || call[0].ID != "call_1" || call[0].Type != "function" ||
			call[0].Function.Name != "get_time" || call[0].Function.Arguments != `{"tz":"UTC"}` {
			t.Errorf("request %d: the tool-calling reply was replayed as %s", i+1, raw)
		}
		if msgs[2].Role != "tool" || msgs[2].ToolCallID != "call_1" {
			t.Errorf("request %d: the tool message was replayed without its tool_call_id: %s", i+1, raw)
		}
	}
}

// A run without a session keeps no tool calls, so their size is no limit:
// a 1.5 MiB argument and 129 parallel calls complete as before.
func TestSessionlessToolCallsAreNotBounded(t *testing.T) {
	args := strings.Repeat("x", 3<<19)
	var many []string
	for i := range 129 {
		many = append(many, fmt.Sprintf(`{"index":%d,"id":"call_%d","type":"function","function":{"name":"f","arguments":"{}"}}`, i, i))
	}
	for name, calls := range map[string]string{
		"large": `[{"index":0,"id":"call_1","type":"function","function":{"name":"write_file","arguments":"` + args + `"}}]`,
		"many":  "[" + strings.Join(many, ",") + "]",
	} {
		body := events("\n", chunk(`{"role":"assistant","tool_calls":`+calls+`}`, "tool_calls"), "[DONE]")
		srv := standin.NewServer(t, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, body) // at once: 1.5 MiB in small paced pieces takes too long
		})
		a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
		sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("go")})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		requireTerminal(t, sink, domain.EventComplete, "")
	}
}

// A configured max_history_bytes bounds what a session turn replays: the
// history sent upstream (all but the turn's own message) fits in it, its
// oldest turns dropped, though the default bound would have kept them all.
func TestSessionHistoryBound(t *testing.T) {
	srv := standin.NewServer(t, sse(events("\n", chunk(`{"content":"ok"}`, "stop"), "[DONE]")))
	const bound = 4 << 10
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL, MaxHistoryBytes: bound}, memory.NewChatStore())
	big := strings.Repeat("x", 1500)
	for i := range 6 {
		sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte(fmt.Sprintf("turn %d %s", i, big)), SessionID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		requireTerminal(t, sink, domain.EventComplete, "")
	}
	sent, size := runtimetest.ReplayedHistory(t, srv.Request(t, 5).Body["messages"])
	// Two earlier turns of about 1.5 KiB fit in 4 KiB; a third does not.
	if size > bound || len(sent) != 2*2+1 || !strings.Contains(string(sent[0]), "turn 3") {
		t.Errorf("the last turn replayed %d messages, %d bytes of history (bound %d), starting %.30s", len(sent), size, bound, sent[0])
	}
}

// max_history_bytes outside 1 KiB to 64 MiB is a config error of its own.
func TestMaxHistoryBytesChecked(t *testing.T) {
	for _, n := range []int{-1, 100, 64<<20 + 1} {
		_, err := openai.New(domain.AdapterConfig{Name: "llm", Type: domain.AdapterOpenAI, BaseURL: "http://127.0.0.1:1", MaxHistoryBytes: n}, memory.NewChatStore())
		if !errors.Is(err, domain.ErrConfig) || !strings.Contains(err.Error(), "max_history_bytes") {
			t.Errorf("max_history_bytes %d: New = %v, want a config_error naming max_history_bytes", n, err)
		}
	}
}

// A turn whose run is cancelled as its answer ends (the run manager's
// Finish fails) is not written to its session: the run ends cancelled, and
// the next turn must not replay it to the model.
func TestCancelAtTheEndStoresNoTurn(t *testing.T) {
	srv := standin.NewServer(t, sse(events("\n", chunk(`{"content":"hello"}`, "stop"), "[DONE]")))
	chats := memory.NewChatStore()
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, chats)
	errCancelled := errors.New("cancelled by request")
	sink := &runtimetest.Sink{FinishErr: errCancelled}
	err := a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "llm", Target: "m", Input: []byte("hi"), SessionID: "s"}, sink)
	if !errors.Is(err, errCancelled) {
		t.Fatalf("err = %v, want Finish's", err)
	}
	if msgs, _ := chats.LoadChat(context.Background(), "llm", "s", 0); len(msgs) != 0 {
		t.Errorf("a turn cancelled at its end was stored: %v", msgs)
	}
	if _, ok := sink.Terminal(); ok {
		t.Errorf("events %v: a terminal event after Finish failed", sink.Types())
	}
}

// A run asks for one answer: its events and a session's stored reply have
// no room for several choices, whose text and tool calls would be joined
// into one. An "n" other than 1 is refused before anything is sent, in a
// session or not; 1 and null pass, as does what is no number (the
// server's to judge).
func TestSeveralChoicesAreRefused(t *testing.T) {
	srv := standin.NewServer(t, sse(events("\n", chunk(`{"content":"one"}`, "stop"), "[DONE]")))
	chats := memory.NewChatStore()
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, chats)
	for _, session := range []string{"s1", ""} {
		for _, n := range []string{"2", "0", "1.5", `"2"`, `" 3 "`} {
			req := domain.RunRequest{Target: "m", Input: []byte("hi"), SessionID: session, Options: []byte(`{"n":` + n + `}`)}
			// Refused at admission (the caller gets 400, no started run
			// that fails), and by Execute alike.
			if err := a.Admit(req); domain.CodeOf(err) != domain.CodeInvalidRequest || !strings.Contains(err.Error(), `"n"`) {
				t.Fatalf("admitting n %s, session %q: %v, want invalid_request naming n", n, session, err)
			}
			_, err := run(t, a, req)
			if domain.CodeOf(err) != domain.CodeInvalidRequest || !strings.Contains(err.Error(), `"n"`) {
				t.Fatalf("n %s, session %q: %v, want invalid_request naming n", n, session, err)
			}
		}
	}
	if got := srv.Count(); got != 0 {
		t.Fatalf("%d requests reached the server", got)
	}
	if msgs, _ := chats.LoadChat(context.Background(), "llm", "s1", 0); len(msgs) != 0 {
		t.Fatalf("a refused run stored %+v", msgs)
	}
	for _, n := range []string{"1", "null", `"1"`} {
		req := domain.RunRequest{Target: "m", Input: []byte("hi"), SessionID: "s1", Options: []byte(`{"n":` + n + `}`)}
		if err := a.Admit(req); err != nil {
			t.Fatalf("admitting n %s: %v", n, err)
		}
		sink, err := run(t, a, req)
		if err != nil {
			t.Fatalf("n %s: %v", n, err)
		}
		requireTerminal(t, sink, domain.EventComplete, "")
	}
}

// What Execute refuses for the run's own content is refused when the node
// admits the run too, before it starts (the caller gets 400).
func TestInvalidRequestsAreRefusedAtAdmission(t *testing.T) {
	srv := standin.NewServer(t, sse(stream))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	for name, req := range map[string]domain.RunRequest{
		"no model":       {Input: []byte("hi")},
		"empty input":    {Target: "m", Input: []byte("  ")},
		"empty messages": {Target: "m", Input: []byte(`{"messages":[]}`)},
		"no role":        {Target: "m", Input: []byte(`{"messages":[{"content":"x"}]}`)},
		"options array":  {Target: "m", Input: []byte("hi"), Options: []byte(`[1]`)},
	} {
		if err := a.Admit(req); domain.CodeOf(err) != domain.CodeInvalidRequest {
			t.Errorf("%s: Admit = %v, want invalid_request", name, err)
		}
		sink, err := run(t, a, req)
		if domain.CodeOf(err) != domain.CodeInvalidRequest || len(sink.Events()) != 0 {
			t.Errorf("%s: err = %v, events %v; want invalid_request", name, err, sink.Types())
		}
	}
	if got := srv.Count(); got != 0 {
		t.Errorf("%d requests reached the server", got)
	}
	withModels := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL, Models: []string{"m"}}, nil)
	if err := withModels.Admit(domain.RunRequest{Input: []byte("hi")}); err != nil {
		t.Errorf("no target, a model configured: %v", err)
	}
}

// Reserved keys and "n" are matched in any case: a server decoding with Go's
// encoding/json (case-insensitive, the last match wins) would otherwise take
// "Model" as the model, "MESSAGES" as the whole conversation, and "N" as n.
func TestReservedOptionsInAnyCase(t *testing.T) {
	srv := standin.NewServer(t, sse(events("\n", chunk(`{"content":"ok"}`, "stop"), "[DONE]")))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{
		Target: "my-model",
		Input:  []byte("hi"),
		Options: []byte(`{"Model":"other","MESSAGES":[{"role":"system","content":"injected"}],"Stream":false,` +
			`"STREAM_OPTIONS":{"include_usage":false},"\u017ftream":false,"temperature":0.1}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	body := srv.Request(t, 0).Body
	want := map[string]string{
		"model":          `"my-model"`,
		"stream":         "true",
		"stream_options": `{"include_usage":true}`,
		"messages":       `[{"role":"user","content":"hi"}]`,
		"temperature":    "0.1",
	}
	for k, v := range want {
		if string(body[k]) != v {
			t.Errorf("%s = %s, want %s", k, body[k], v)
		}
	}
	if len(body) != len(want) {
		t.Errorf("body has keys %v, want only %v", body, want)
	}

	for _, opts := range []string{`{"N":3}`, `{"n":1,"N":2}`, `{"N":"2"}`} {
		req := domain.RunRequest{Target: "m", Input: []byte("hi"), Options: []byte(opts)}
		// Named as the caller spelt it: "option \"n\"" for {"N":3} sent
		// the caller looking for a key it had not sent.
		if err := a.Admit(req); domain.CodeOf(err) != domain.CodeInvalidRequest || !strings.Contains(err.Error(), `option "N" is`) {
			t.Errorf("admitting %s: %v, want invalid_request naming N", opts, err)
		}
		if _, err := run(t, a, req); domain.CodeOf(err) != domain.CodeInvalidRequest {
			t.Errorf("running %s: %v, want invalid_request", opts, err)
		}
	}
	if got := srv.Count(); got != 1 {
		t.Fatalf("%d requests reached the server, want 1", got)
	}
}

// A server reporting absurd counts without a total: the total the run
// reports saturates at the int64 maximum rather than wrapping negative
// (which the node's store then summed into usage_status failing).
func TestAbsurdUsageTotalSaturates(t *testing.T) {
	srv := standin.NewServer(t, status(200, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9223372036854775800,"completion_tokens":100}}`))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	if done.Usage == nil || done.Usage.PromptTokens != 9223372036854775800 || done.Usage.TotalTokens != math.MaxInt64 {
		t.Fatalf("usage %+v; want the total saturated at MaxInt64", done.Usage)
	}
}

// A provider's redirect is not followed: Go would re-send the request with
// its Authorization to the same host on another port (or from https to
// http). The run ends with an error naming the status and the Location,
// without its credentials or query.
func TestRedirectIsNotFollowed(t *testing.T) {
	t.Setenv("IOP_TEST_OPENAI_KEY", "sk-secret")
	other := standin.NewServer(t, sse(events("\n", chunk(`{"content":"elsewhere"}`, "stop"), "[DONE]")))
	loc := strings.Replace(other.URL, "http://", "http://user:hunter2@", 1) + "/v1/chat/completions?sig=s3cr3t"
	srv := standin.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, loc, http.StatusTemporaryRedirect)
	})
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL, APIKeyEnv: "IOP_TEST_OPENAI_KEY"}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
	want := "the provider answered HTTP 307 Temporary Redirect with Location " + strings.Replace(other.URL, "http://", "http://user:xxxxx@", 1) + "/v1/chat/completions?…; redirects are not followed"
	if !strings.HasPrefix(ev.Error.Message, want) {
		t.Errorf("message = %q, want it to start with %q", ev.Error.Message, want)
	}
	for _, secret := range []string{"hunter2", "s3cr3t", "sk-secret"} {
		if strings.Contains(ev.Error.Message, secret) {
			t.Errorf("message %q shows %q", ev.Error.Message, secret)
		}
	}
	if n := other.Count(); n != 0 {
		t.Errorf("the redirect target got %d requests (Authorization %q)", n, other.Request(t, 0).Header.Get("Authorization"))
	}
	if n := srv.Count(); n != 1 || srv.Request(t, 0).Header.Get("Authorization") != "Bearer sk-secret" {
		t.Errorf("the provider got %d requests", n)
	}
}

// A refused base_url is quoted without its password (the node logs it).
func TestBadBaseURLErrorHidesThePassword(t *testing.T) {
	for _, u := range []string{"ftp://ops:hunter2@gpu", "ops:hunter2@gpu:8000", "http://ops:hunter2@gpu:bad port"} {
		_, err := openai.New(domain.AdapterConfig{Name: "x", Type: domain.AdapterOpenAI, BaseURL: u}, nil)
		if !errors.Is(err, domain.ErrConfig) || !strings.Contains(err.Error(), "ops:xxxxx@gpu") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("New with base_url %q: %v", u, err)
		}
	}
}

// llama.cpp's server (llama-server) reports a failure after the stream
// started, such as a prompt longer than the context, as an "error:" field
// of its own, then ends the stream with data: [DONE] as usual. The run
// failed with the server's message; it did not complete with no answer.
func TestLlamaCppErrorFieldFailsTheRun(t *testing.T) {
	const errLine = `error: {"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}`
	cases := map[string]string{
		"before any chunk": errLine + "\n\n" + "data: [DONE]\n\n",
		"after a delta":    events("\n", chunk(`{"content":"par"}`, "")) + errLine + "\n\n" + "data: [DONE]\n\n",
		"CRLF, no blank":   events("\r\n", chunk(`{"content":"par"}`, "")) + errLine + "\r\n",
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			srv := standin.NewServer(t, sse(body))
			a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
			sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
			if err != nil {
				t.Fatal(err)
			}
			ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
			if want := "the request exceeds the available context size, try increasing it"; ev.Error.Message != want {
				t.Errorf("message = %q, want %q", ev.Error.Message, want)
			}
		})
	}
}

// SGLang, and vLLM before its errors moved under "error", answer a failed
// request with the error object itself at the top level. Its message is
// the run's error, not the body's JSON; its 404 is an unknown model.
func TestTopLevelErrorObject(t *testing.T) {
	cases := []struct {
		name, body, code, message string
		status                    int
	}{
		{"400", `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}`,
			domain.CodeProviderError, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.", 400},
		{"404", "{\"object\":\"error\",\"message\":\"The model `nope` does not exist.\",\"type\":\"NotFoundError\",\"param\":null,\"code\":404}",
			domain.CodeModelNotFound, "The model `nope` does not exist.", 404},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := standin.NewServer(t, status(tc.status, tc.body))
			a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
			sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
			if err != nil {
				t.Fatal(err)
			}
			ev := requireTerminal(t, sink, domain.EventError, tc.code)
			if ev.Error.Message != tc.message {
				t.Errorf("message = %q, want %q", ev.Error.Message, tc.message)
			}
		})
	}
}

// A 404 that carries no API error is the server saying it has no such
// endpoint (a base_url that already ends in /v1, a wrong path_prefix): the
// run fails with provider_error and a hint at the config, not with
// model_not_found, which sends the user looking at the model name.
func TestNotFoundEndpointIsNoUnknownModel(t *testing.T) {
	cases := []struct {
		name, ctype, body, code string
	}{
		{"FastAPI (vLLM)", "application/json", `{"detail":"Not Found"}`, domain.CodeProviderError},
		{"Go mux", "text/plain; charset=utf-8", "404 page not found\n", domain.CodeProviderError},
		{"nginx HTML", "text/html", "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n", domain.CodeProviderError},
		{"empty", "", "", domain.CodeProviderError},
		// An API error that names no model is no unknown model either.
		{"OpenAI invalid URL", "application/json", `{"error":{"message":"Invalid URL (POST /v1/v1/chat/completions)","type":"invalid_request_error","param":null,"code":null}}`, domain.CodeProviderError},
		{"llama.cpp", "application/json; charset=utf-8", `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`, domain.CodeProviderError},
		// A 404 that names the model is still an unknown model.
		{"detail naming the model", "application/json", `{"detail":"Model 'nope' not found"}`, domain.CodeModelNotFound},
		{"OpenAI unknown model", "application/json", `{"error":{"message":"The model 'nope' does not exist","type":"invalid_request_error","param":"model","code":"model_not_found"}}`, domain.CodeModelNotFound},
		{"vLLM unknown model", "application/json", "{\"object\":\"error\",\"message\":\"The model `nope` does not exist.\",\"type\":\"NotFoundError\",\"param\":null,\"code\":404}", domain.CodeModelNotFound},
		{"Ollama unknown model", "application/json", `{"error":"model \"nope\" not found, try pulling it first"}`, domain.CodeModelNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var path string
			srv := standin.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
				path = r.URL.Path
				if tc.ctype != "" {
					w.Header().Set("Content-Type", tc.ctype)
				}
				w.WriteHeader(http.StatusNotFound)
				_, _ = io.WriteString(w, tc.body)
			})
			a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL + "/v1"}, nil)
			sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
			if err != nil {
				t.Fatal(err)
			}
			if path != "/v1/v1/chat/completions" {
				t.Fatalf("path = %q", path)
			}
			ev := requireTerminal(t, sink, domain.EventError, tc.code)
			if tc.code == domain.CodeProviderError && !strings.Contains(ev.Error.Message, "base_url") {
				t.Errorf("message = %q, want a hint at base_url", ev.Error.Message)
			}
		})
	}
}

// A server that quotes the credentials it was sent in its 401 (a gateway
// dumping the request's headers, "invalid API key sk-…") does not carry
// the node's key, or base_url's password, to the run's caller: the error
// event names neither, in any form it was sent in.
func TestProviderErrorQuotingTheKeyIsRedacted(t *testing.T) {
	echo := func(w http.ResponseWriter, r *http.Request) {
		msg := "invalid credentials: Authorization=" + r.Header.Get("Authorization")
		if u, p, ok := r.BasicAuth(); ok {
			msg += " user=" + u + " password=" + p
		}
		body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "code": "invalid_api_key"}})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write(body)
	}
	srv := standin.NewServer(t, echo)

	t.Setenv("IOP_TEST_OPENAI_KEY", "sk-node-secret-key")
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL, APIKeyEnv: "IOP_TEST_OPENAI_KEY"}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
	if strings.Contains(ev.Error.Message, "sk-node-secret-key") || !strings.Contains(ev.Error.Message, "Authorization=Bearer [redacted]") {
		t.Errorf("message = %q", ev.Error.Message)
	}

	// A key the quote cuts short loses what is left of it too: a plain
	// text answer is quoted to its first 1,024 bytes.
	key := "sk-proj-" + strings.Repeat("K", 100)
	cut := standin.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, strings.Repeat("x", 980)+" got "+r.Header.Get("Authorization"))
	})
	t.Setenv("IOP_TEST_OPENAI_KEY", key)
	a = newAdapter(t, domain.AdapterConfig{BaseURL: cut.URL, APIKeyEnv: "IOP_TEST_OPENAI_KEY"}, nil)
	sink, err = run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	ev = requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
	if m := ev.Error.Message; strings.Contains(m, "sk-proj-") || !strings.HasSuffix(m, "got Bearer [redacted]…") {
		t.Errorf("message = …%q", m[max(0, len(m)-80):])
	}

	withPassword := strings.Replace(srv.URL, "://", "://proxyuser:pw-in-base-url@", 1)
	a = newAdapter(t, domain.AdapterConfig{BaseURL: withPassword}, nil)
	sink, err = run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	ev = requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
	basic := base64.StdEncoding.EncodeToString([]byte("proxyuser:pw-in-base-url"))
	if m := ev.Error.Message; strings.Contains(m, "pw-in-base-url") || strings.Contains(m, basic) ||
		!strings.Contains(m, "Authorization=Basic [redacted] user=proxyuser password=[redacted]") {
		t.Errorf("message = %q", m)
	}
}
