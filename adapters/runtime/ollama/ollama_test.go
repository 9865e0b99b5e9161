package ollama_test

import (
	"context"
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
	"iop/adapters/runtime/ollama"
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

type server = standin.Server

func newServer(t *testing.T, handle func(w http.ResponseWriter, r *http.Request)) *server {
	t.Helper()
	return standin.NewServer(t, handle)
}

func ndjson(body string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		standin.Split(w, body)
	}
}

func status(code int, body string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

func newAdapter(t *testing.T, cfg domain.AdapterConfig, chats *memory.ChatStore) *ollama.Adapter {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "llm"
	}
	cfg.Type = domain.AdapterOllama
	var a *ollama.Adapter
	var err error
	if chats == nil {
		a, err = ollama.New(cfg, nil)
	} else {
		a, err = ollama.New(cfg, chats)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func run(t *testing.T, a *ollama.Adapter, req domain.RunRequest) (*runtimetest.Sink, error) {
	t.Helper()
	if req.RunID == "" {
		req.RunID = "r1"
	}
	req.Adapter = "llm"
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

// chatStream is a recorded /api/chat answer with thinking, multi-byte
// content, a blank line and a malformed line.
var chatStream = standin.Lines(
	`{"model":"qwen3","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":"","thinking":"Let me"},"done":false}`,
	`{"model":"qwen3","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":"","thinking":" think 🤔"},"done":false}`,
	``,
	`{"model":"qwen3","message":{"role":"assistant","content":"Héllo"},"done":false}`,
	`this line is not JSON`,
	`{"model":"qwen3","message":{"role":"assistant","content":", wörld 😀"},"done":false}`,
	`{"model":"qwen3","created_at":"2025-01-01T00:00:01Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":182242375,"load_duration":41295167,"prompt_eval_count":169,"prompt_eval_duration":24573166,"eval_count":15,"eval_duration":115959084}`,
)

func TestChatEventMappingAndUsage(t *testing.T) {
	srv := newServer(t, ndjson(chatStream))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{
		Target:  "qwen3",
		Input:   []byte("Say hello"),
		Options: []byte(`{"think":true,"options":{"temperature":0.2},"keep_alive":"5m","format":"json","bogus":1}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	if got := sink.Text(); got != "Héllo, wörld 😀" {
		t.Errorf("text = %q", got)
	}
	if got := reasoning(sink); got != "Let me think 🤔" {
		t.Errorf("reasoning = %q", got)
	}
	want := domain.Usage{PromptTokens: 169, CompletionTokens: 15, TotalTokens: 184, DurationMS: 182, StopReason: "stop", Model: "qwen3"}
	if done.Usage == nil || *done.Usage != want {
		t.Errorf("usage = %+v, want %+v", done.Usage, want)
	}
	types := sink.Types()
	if types[0] != domain.EventReasoningDelta {
		t.Errorf("first event = %s, want reasoning_delta", types[0])
	}

	body := srv.Request(t, 0).Body
	if string(body["model"]) != `"qwen3"` || string(body["stream"]) != "true" {
		t.Errorf("model/stream = %s/%s", body["model"], body["stream"])
	}
	if string(body["messages"]) != `[{"role":"user","content":"Say hello"}]` {
		t.Errorf("messages = %s", body["messages"])
	}
	for k, v := range map[string]string{"think": "true", "options": `{"temperature":0.2}`, "keep_alive": `"5m"`, "format": `"json"`} {
		if string(body[k]) != v {
			t.Errorf("%s = %s, want %s", k, body[k], v)
		}
	}
	if _, ok := body["bogus"]; ok {
		t.Error("an unknown option reached Ollama")
	}
	if p := pathOf(srv.Request(t, 0)); p != "POST /api/chat" {
		t.Errorf("request = %s", p)
	}
}

func TestModelDefaultsAndMessagesInput(t *testing.T) {
	srv := newServer(t, ndjson(chatStream))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL + "/", Models: []string{"llama3.2", "qwen3"}}, nil)
	input := `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi","images":["aGk="]}]}`
	sink, err := run(t, a, domain.RunRequest{Input: []byte(input)})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	body := srv.Request(t, 0).Body
	if string(body["model"]) != `"llama3.2"` {
		t.Errorf("model = %s, want the first configured model", body["model"])
	}
	if string(body["messages"]) != `[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi","images":["aGk="]}]` {
		t.Errorf("messages = %s, want the input's list as is", body["messages"])
	}
}

func TestInvalidRequests(t *testing.T) {
	srv := newServer(t, ndjson(chatStream))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	for name, req := range map[string]domain.RunRequest{
		"no model":       {Input: []byte("hi")},
		"empty input":    {Target: "m", Input: []byte("  ")},
		"empty messages": {Target: "m", Input: []byte(`{"messages":[]}`)},
		"no role":        {Target: "m", Input: []byte(`{"messages":[{"content":"x"}]}`)},
		"options array":  {Target: "m", Input: []byte("hi"), Options: []byte(`[1]`)},
		"tools object":   {Target: "m", Input: []byte("hi"), Options: []byte(`{"tools":{"type":"function"}}`)},
	} {
		// Refused when the node admits the run (before it starts, so the
		// caller gets 400), and by Execute alike.
		if err := a.Admit(req); !errors.Is(err, domain.ErrInvalidRequest) {
			t.Errorf("%s: Admit = %v, want invalid_request", name, err)
		}
		sink, err := run(t, a, req)
		if !errors.Is(err, domain.ErrInvalidRequest) {
			t.Errorf("%s: err = %v, want invalid_request", name, err)
		}
		if len(sink.Events()) != 0 {
			t.Errorf("%s: events %v", name, sink.Types())
		}
	}
	if got := srv.Count(); got != 0 {
		t.Errorf("%d requests reached Ollama", got)
	}
	for _, req := range []domain.RunRequest{
		{Target: "m", Input: []byte("hi"), Options: []byte(`{"tools":[],"think":true}`)},
		{Target: "m", Input: []byte(`{"messages":[{"role":"user","content":"hi"}]}`), Options: []byte(`{"tools":null}`)},
	} {
		if err := a.Admit(req); err != nil {
			t.Errorf("admitting %s / %s: %v", req.Input, req.Options, err)
		}
	}
	s2, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi"), SessionID: "s"})
	if !errors.Is(err, domain.ErrSessionUnsupported) || len(s2.Events()) != 0 {
		t.Errorf("session without a store: err = %v", err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []domain.AdapterConfig{
		{Name: "x"},
		{Name: "x", BaseURL: "127.0.0.1:11434"},
		{Name: "x", BaseURL: "ftp://host"},
		{Name: "x", BaseURL: "http://h", MaxConcurrency: -1},
	} {
		if _, err := ollama.New(cfg, nil); !errors.Is(err, domain.ErrConfig) {
			t.Errorf("New(%+v) err = %v, want config_error", cfg, err)
		}
	}
}

func TestCapabilities(t *testing.T) {
	a := newAdapter(t, domain.AdapterConfig{BaseURL: "http://127.0.0.1:11434"}, memory.NewChatStore())
	c := a.Capabilities()
	if c.MaxConcurrency != domain.DefaultMaxConcurrency || !c.Sessions {
		t.Errorf("capabilities = %+v", c)
	}
	if strings.Join(c.Commands, ",") != "ollama.version,ollama.list,ollama.ps,ollama.show,ollama.pull,ollama.delete,ollama.copy" {
		t.Errorf("commands = %v", c.Commands)
	}
	a = newAdapter(t, domain.AdapterConfig{BaseURL: "http://127.0.0.1:11434", MaxConcurrency: 2}, nil)
	if c := a.Capabilities(); c.MaxConcurrency != 2 || c.Sessions {
		t.Errorf("capabilities without a store = %+v", c)
	}
}

func TestErrors(t *testing.T) {
	partial := `{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}` + "\n"
	cases := []struct {
		name    string
		handle  func(http.ResponseWriter, *http.Request)
		code    string
		message string
		text    string
	}{
		{"404 unknown model", status(404, `{"error":"model \"nope\" not found, try pulling it first"}`),
			domain.CodeModelNotFound, `model "nope" not found, try pulling it first`, ""},
		{"400 no thinking", status(400, `{"error":"\"llama3.2\" does not support thinking"}`),
			domain.CodeProviderError, `"llama3.2" does not support thinking`, ""},
		{"429", status(429, `{"error":"server busy, please try again.  maximum pending requests exceeded"}`),
			domain.CodeProviderError, "server busy, please try again.  maximum pending requests exceeded", ""},
		{"500 not JSON", status(500, "upstream exploded\n"), domain.CodeProviderError, "HTTP 500 Internal Server Error: upstream exploded", ""},
		{"502 empty", status(502, ""), domain.CodeProviderError, "HTTP 502 Bad Gateway", ""},
		{"error line mid-stream", ndjson(partial + `{"error":"an error was encountered while running the model: unexpected EOF"}` + "\n"),
			domain.CodeProviderError, "an error was encountered while running the model: unexpected EOF", "Hi"},
		{"not found line", ndjson(`{"error":"model 'x' not found"}` + "\n"), domain.CodeModelNotFound, "model 'x' not found", ""},
		{"stream ends early", ndjson(partial), domain.CodeProviderError, "Ollama's stream ended before its final \"done\" line", "Hi"},
		// A 200 that is no stream at all (a proxy's login page) is named.
		{"200 HTML page", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = io.WriteString(w, "<html><body>Sign in</body></html>\n")
		}, domain.CodeProviderError, `the server answered with "text/html; charset=utf-8", not Ollama's stream: <html><body>Sign in</body></html>`, ""},
		{"200 empty", ndjson(""), domain.CodeProviderError, `the server answered with an empty body (content type "application/x-ndjson"), not Ollama's stream`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, tc.handle)
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

func TestConnectRefused(t *testing.T) {
	a := newAdapter(t, domain.AdapterConfig{BaseURL: standin.RefusedURL(t)}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderUnreachable)
	if !strings.Contains(ev.Error.Message, "refused") {
		t.Errorf("message = %q", ev.Error.Message)
	}
}

// hanging answers one content line, then holds the stream open until the
// client goes away, which it reports on gone.
func hanging(gone chan<- struct{}) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, `{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}`+"\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(gone)
		case <-time.After(deadline):
		}
	}
}

func TestCancelClosesTheUpstreamRequest(t *testing.T) {
	gone := make(chan struct{})
	srv := newServer(t, hanging(gone))
	chats := memory.NewChatStore()
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, chats)
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	sink := &runtimetest.Sink{}
	exited := make(chan error, 1)
	go func() {
		exited <- a.Execute(ctx, domain.RunRequest{RunID: "r1", Adapter: "llm", Target: "m", Input: []byte("hi"), SessionID: "s1"}, sink)
	}()
	if err := sink.WaitFor(testContext(t), func(evs []domain.RunEvent) bool { return len(evs) > 0 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-exited:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Execute = %v, want context.Canceled", err)
		}
	case <-time.After(deadline):
		t.Fatal("Execute did not return after cancel")
	}
	select {
	case <-gone:
	case <-time.After(deadline):
		t.Fatal("the server never saw the request end")
	}
	if _, ok := sink.Terminal(); ok {
		t.Errorf("a cancelled run emitted a terminal event: %v", sink.Types())
	}
	if msgs, _ := chats.LoadChat(context.Background(), "llm", "s1", 0); len(msgs) != 0 {
		t.Errorf("a cancelled turn was stored: %v", msgs)
	}
}

func TestTimeout(t *testing.T) {
	gone := make(chan struct{})
	srv := newServer(t, hanging(gone))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL, Timeout: 200 * time.Millisecond}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventError, domain.CodeTimeout)
	<-gone
}

func TestSinkFailureStopsTheRun(t *testing.T) {
	srv := newServer(t, ndjson(chatStream))
	chats := memory.NewChatStore()
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, chats)
	errGone := errors.New("stream gone")
	sink := &runtimetest.Sink{Err: errGone, FailAfter: 1}
	err := a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "llm", Target: "m", Input: []byte("hi"), SessionID: "s"}, sink)
	if !errors.Is(err, errGone) {
		t.Fatalf("err = %v, want the sink's", err)
	}
	if msgs, _ := chats.LoadChat(context.Background(), "llm", "s", 0); len(msgs) != 0 {
		t.Errorf("stored %v", msgs)
	}
}

// A turn whose run is cancelled as its answer ends (the run manager's
// Finish fails) is not written to its session: the run ends cancelled, and
// the next turn must not replay it to the model.
func TestCancelAtTheEndStoresNoTurn(t *testing.T) {
	srv := newServer(t, ndjson(chatStream))
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

// turnServer answers each chat with "reply N" (N counting requests from 1),
// except that request number failOn gets a mid-stream error line.
func turnServer(t *testing.T, failOn int) *server {
	var n int
	var mu sync.Mutex
	return newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		if i == failOn {
			standin.Split(w, standin.Lines(`{"model":"m","message":{"role":"assistant","content":"half"},"done":false}`, `{"error":"boom"}`))
			return
		}
		reply, _ := json.Marshal("reply " + string(rune('0'+i)))
		standin.Split(w, standin.Lines(
			`{"model":"m","message":{"role":"assistant","content":`+string(reply)+`},"done":false}`,
			`{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":2}`,
		))
	})
}

func messages(t *testing.T, body map[string]json.RawMessage) string {
	t.Helper()
	var msgs []struct{ Role, Content string }
	if err := json.Unmarshal(body["messages"], &msgs); err != nil {
		t.Fatal(err)
	}
	parts := make([]string, len(msgs))
	for i, m := range msgs {
		parts[i] = m.Role + ":" + m.Content
	}
	return strings.Join(parts, " | ")
}

func TestSessions(t *testing.T) {
	srv := turnServer(t, 3)
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
	requireTerminal(t, turn("one"), domain.EventComplete, "")
	requireTerminal(t, turn("two"), domain.EventComplete, "")
	if got, want := messages(t, srv.Request(t, 1).Body), "user:one | assistant:reply 1 | user:two"; got != want {
		t.Errorf("second turn sent %q, want %q", got, want)
	}
	requireTerminal(t, turn("three"), domain.EventError, domain.CodeProviderError) // request 3 fails
	requireTerminal(t, turn("four"), domain.EventComplete, "")
	if got, want := messages(t, srv.Request(t, 3).Body), "user:one | assistant:reply 1 | user:two | assistant:reply 2 | user:four"; got != want {
		t.Errorf("the turn after a failed one sent %q, want %q", got, want)
	}

	list, err := a.ListSessions(context.Background(), domain.SessionQuery{})
	if err != nil || len(list) != 1 || list[0].SessionID != "s1" || list[0].Turns != 3 || list[0].Target != "m" {
		t.Fatalf("ListSessions = %+v, %v", list, err)
	}
	if err := a.TerminateSession(context.Background(), "m", "s1"); err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, turn("fresh"), domain.EventComplete, "")
	if got, want := messages(t, srv.Request(t, 4).Body), "user:fresh"; got != want {
		t.Errorf("after terminate sent %q, want %q", got, want)
	}
	// A run without a session id neither reads nor writes sessions.
	if _, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("solo")}); err != nil {
		t.Fatal(err)
	}
	if got := messages(t, srv.Request(t, 5).Body); got != "user:solo" {
		t.Errorf("sessionless run sent %q", got)
	}
	if err := a.TerminateSession(context.Background(), "m", "unknown"); !errors.Is(err, domain.ErrSessionNotFound) {
		t.Errorf("terminating an unknown session: %v, want session_not_found", err)
	}
	// Ended once, the session is unknown until a run uses it again.
	if err := a.TerminateSession(context.Background(), "m", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := a.TerminateSession(context.Background(), "m", "s1"); !errors.Is(err, domain.ErrSessionNotFound) {
		t.Errorf("terminating an ended session: %v, want session_not_found", err)
	}
}

// TestToolsReachOllama: a run's "tools" option is sent to /api/chat as
// given, so the model can call them, and the message.tool_calls of its
// answer come back as a metadata event {"tool_calls":[…]}.
func TestToolsReachOllama(t *testing.T) {
	const tools = `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	const calls = `[{"function":{"name":"get_weather","arguments":{"city":"Paris"}}}]`
	srv := newServer(t, ndjson(standin.Lines(
		`{"model":"qwen3","message":{"role":"assistant","content":"","tool_calls":`+calls+`},"done":false}`,
		`{"model":"qwen3","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":80,"eval_count":20}`,
	)))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "qwen3", Input: []byte("Weather in Paris?"), Options: []byte(`{"tools":` + tools + `}`)})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if got := string(srv.Request(t, 0).Body["tools"]); got != tools {
		t.Errorf("tools sent to Ollama = %s, want %s", got, tools)
	}
	events := sink.Events()
	if len(events) != 2 || events[0].Type != domain.EventMetadata || string(events[0].Metadata) != `{"tool_calls":`+calls+`}` {
		t.Errorf("events %v, first %+v; want metadata {\"tool_calls\":%s}, then complete", sink.Types(), events[0], calls)
	}
}

// A session that uses tool calls stays valid: the reply's message.tool_calls
// are stored with it and the caller's tool message keeps its tool_name, so
// later turns replay the call and its answer together.
func TestSessionToolCalls(t *testing.T) {
	var mu sync.Mutex
	n := 0
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		if i == 1 {
			ndjson(standin.Lines(
				`{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_time","arguments":{"tz":"UTC"}}}]},"done":false}`,
				`{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}`,
			))(w, r)
			return
		}
		ndjson(standin.Lines(`{"model":"m","message":{"role":"assistant","content":"It is noon."},"done":true,"done_reason":"stop"}`))(w, r)
	})
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, memory.NewChatStore())
	for _, input := range []string{"what time is it?", `{"messages":[{"role":"tool","tool_name":"get_time","content":"12:00"}]}`, "thanks"} {
		sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte(input), SessionID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		requireTerminal(t, sink, domain.EventComplete, "")
	}
	for i := 1; i <= 2; i++ {
		var msgs []struct {
			Role      string `json:"role"`
			ToolName  string `json:"tool_name"`
			ToolCalls []struct {
				Function struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				} `json:"function"`
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
		if msgs[1].Role != "assistant" || len(call) != 1 || call[0].Function.Name != "get_time" || string(call[0].Function.Arguments) != `{"tz":"UTC"}` {
			t.Errorf("request %d: the tool-calling reply was replayed as %s", i+1, raw)
		}
		if msgs[2].Role != "tool" || msgs[2].ToolName != "get_time" {
			t.Errorf("request %d: the tool message was replayed without its tool_name: %s", i+1, raw)
		}
	}
}

// A run without a session keeps no tool calls, so their size is no limit.
func TestSessionlessToolCallsAreNotBounded(t *testing.T) {
	args := strings.Repeat("x", 3<<19)
	body := standin.Lines(
		`{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"write_file","arguments":{"text":"`+args+`"}}}]},"done":false}`,
		`{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}`)
	srv := newServer(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, body) // at once: 1.5 MiB in small paced pieces takes too long
	})
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("write it")})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
}

// A configured max_history_bytes bounds what a session turn replays: the
// history sent upstream (all but the turn's own message) fits in it, its
// oldest turns dropped, though the default bound would have kept them all.
func TestSessionHistoryBound(t *testing.T) {
	srv := turnServer(t, 0)
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
		_, err := ollama.New(domain.AdapterConfig{Name: "llm", Type: domain.AdapterOllama, BaseURL: "http://127.0.0.1:1", MaxHistoryBytes: n}, memory.NewChatStore())
		if !errors.Is(err, domain.ErrConfig) || !strings.Contains(err.Error(), "max_history_bytes") {
			t.Errorf("max_history_bytes %d: New = %v, want a config_error naming max_history_bytes", n, err)
		}
	}
}

// Absurd counts from Ollama: the run's total saturates at the int64
// maximum rather than wrapping negative.
func TestAbsurdUsageTotalSaturates(t *testing.T) {
	srv := newServer(t, ndjson(standin.Lines(
		`{"model":"m","message":{"role":"assistant","content":"ok"},"done":true,"done_reason":"stop","prompt_eval_count":9223372036854775800,"eval_count":100}`,
	)))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	if done.Usage == nil || done.Usage.TotalTokens != math.MaxInt64 {
		t.Fatalf("usage %+v; want the total saturated at MaxInt64", done.Usage)
	}
}

// A redirect from Ollama (or a proxy before it) is not followed, by a run or
// a command: it ends with an error naming the status and the Location, and
// the redirect target gets nothing (base_url credentials included).
func TestRedirectIsNotFollowed(t *testing.T) {
	other := newServer(t, ndjson(`{"model":"m","message":{"role":"assistant","content":"elsewhere"},"done":true}`+"\n"))
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusMovedPermanently)
	})
	base := strings.Replace(srv.URL, "http://", "http://user:hunter2@", 1)
	a := newAdapter(t, domain.AdapterConfig{BaseURL: base}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
	if want := "the provider answered HTTP 301 Moved Permanently with Location " + other.URL + "/api/chat; redirects are not followed"; !strings.HasPrefix(ev.Error.Message, want) {
		t.Errorf("message = %q, want it to start with %q", ev.Error.Message, want)
	}
	_, err = a.RunCommand(testContext(t), ollama.CmdList, nil, nil)
	if domain.CodeOf(err) != domain.CodeProviderError || !strings.Contains(err.Error(), "HTTP 301 Moved Permanently with Location "+other.URL+"/api/tags;") {
		t.Errorf("list command: err = %v", err)
	}
	if n := other.Count(); n != 0 {
		t.Errorf("the redirect target got %d requests (Authorization %q)", n, other.Request(t, 0).Header.Get("Authorization"))
	}
}

// A refused base_url is quoted without its password (the node logs it).
func TestBadBaseURLErrorHidesThePassword(t *testing.T) {
	for _, u := range []string{"ftp://ops:hunter2@gpu", "ops:hunter2@gpu:11434", "http://ops:hunter2@gpu:bad port"} {
		_, err := ollama.New(domain.AdapterConfig{Name: "x", Type: domain.AdapterOllama, BaseURL: u}, nil)
		if !errors.Is(err, domain.ErrConfig) || !strings.Contains(err.Error(), "ops:xxxxx@gpu") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("New with base_url %q: %v", u, err)
		}
	}
}

// A 404 without Ollama's {"error":…} is no unknown model: nothing at that
// URL speaks Ollama's API (base_url points elsewhere).
func TestNotFoundEndpointIsNoUnknownModel(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, "404 page not found\n")
	})
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL + "/v1"}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
	if !strings.Contains(ev.Error.Message, "404 page not found") || !strings.Contains(ev.Error.Message, "base_url") {
		t.Errorf("message = %q", ev.Error.Message)
	}
}

// A mid-stream error line that quotes base_url's password (a server or
// proxy echoing what it was sent) reaches the caller without it.
func TestErrorLineQuotingThePasswordIsRedacted(t *testing.T) {
	srv := newServer(t, ndjson(`{"error":"auth failed for Basic dTpwNHNzdzByZA== (password p4ssw0rd)"}`+"\n"))
	base := strings.Replace(srv.URL, "http://", "http://u:p4ssw0rd@", 1)
	a := newAdapter(t, domain.AdapterConfig{BaseURL: base}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
	if want := "auth failed for Basic [redacted] (password [redacted])"; ev.Error.Message != want {
		t.Errorf("message = %q, want %q", ev.Error.Message, want)
	}
}
