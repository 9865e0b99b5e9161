package claudecode_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/adapters/runtime/claudecode"
	"iop/adapters/runtime/internal/standin"
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

const initLine = `{"type":"system","subtype":"init","cwd":"/w","session_id":"6f1","model":"claude-opus-4-8[1m]","tools":["Bash"],"permissionMode":"default"}`

var recorded = standin.Lines(
	initLine,
	`not json`,
	`{"type":"assistant","message":{"id":"m1","role":"assistant","content":[{"type":"thinking","thinking":"Plan ✓"},{"type":"text","text":"Looking… "},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls -la"}}]},"session_id":"6f1"}`,
	`{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"a.go\nb.go","is_error":false}]},"session_id":"6f1"}`,
	`{"type":"some_future_type","x":1}`,
	`{"type":"assistant","message":{"id":"m2","model":"claude-opus-4-8-20261101","role":"assistant","content":[{"type":"text","text":"Done ✅"}]},"session_id":"6f1"}`,
	`{"type":"result","subtype":"success","is_error":false,"duration_ms":1234,"num_turns":2,"result":"Done ✅","session_id":"6f1","total_cost_usd":0.0412,"usage":{"input_tokens":9,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":77}}`,
)

func newAdapter(t *testing.T, cli standin.CLI, cfg domain.AdapterConfig, agents *memory.AgentSessionStore) *claudecode.Adapter {
	t.Helper()
	cfg.Name, cfg.Type, cfg.Command = "claude", domain.AdapterClaudeCode, cli.Path
	var a *claudecode.Adapter
	var err error
	if agents == nil {
		a, err = claudecode.New(cfg, nil)
	} else {
		a, err = claudecode.New(cfg, agents)
	}
	if err != nil {
		t.Fatal(err)
	}
	a.KillGrace = 200 * time.Millisecond
	return a
}

func run(t *testing.T, a *claudecode.Adapter, req domain.RunRequest) (*runtimetest.Sink, error) {
	t.Helper()
	req.RunID, req.Adapter = "r1", "claude"
	if req.Input == nil {
		req.Input = []byte("fix the tests")
	}
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

// summary renders events compactly: "d:text", "r:text", "m:{json}", and the
// pid metadata as "m:pid".
func summary(events []domain.RunEvent) []string {
	var out []string
	for _, ev := range events {
		switch ev.Type {
		case domain.EventDelta:
			out = append(out, "d:"+ev.Text)
		case domain.EventReasoningDelta:
			out = append(out, "r:"+ev.Text)
		case domain.EventMetadata:
			if strings.HasPrefix(string(ev.Metadata), `{"pid":`) {
				out = append(out, "m:pid")
			} else {
				out = append(out, "m:"+string(ev.Metadata))
			}
		default:
			out = append(out, string(ev.Type))
		}
	}
	return out
}

func pidOf(t *testing.T, events []domain.RunEvent) int {
	t.Helper()
	for _, ev := range events {
		var m struct{ PID int }
		if ev.Type == domain.EventMetadata && json.Unmarshal(ev.Metadata, &m) == nil && m.PID > 0 {
			return m.PID
		}
	}
	t.Fatalf("no pid metadata in %v", summary(events))
	return 0
}

func TestStreamJSONMapping(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink, err := run(t, a, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	want := []string{
		"m:pid",
		`m:{"agent_session_id":"6f1"}`,
		"r:Plan ✓",
		"d:Looking… ",
		`m:{"tool_use":{"id":"toolu_1","input":{"command":"ls -la"},"name":"Bash"}}`,
		`m:{"tool_result":{"content":"a.go\nb.go","is_error":false,"tool_use_id":"toolu_1","truncated":false}}`,
		"d:\n\nDone ✅",
		`m:{"num_turns":2,"usage":{"input_tokens":9,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":77}}`,
		"complete",
	}
	if got := summary(sink.Events()); !slices.Equal(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	wantUsage := domain.Usage{PromptTokens: 1109, CompletionTokens: 77, TotalTokens: 1186, CostUSD: 0.0412, DurationMS: 1234, StopReason: "success", Model: "claude-opus-4-8-20261101"}
	if done.Usage == nil || *done.Usage != wantUsage {
		t.Errorf("usage = %+v, want %+v", done.Usage, wantUsage)
	}
}

func TestArgvStdinAndWorkDir(t *testing.T) {
	dir := t.TempDir()
	cli := standin.WriteCLI(t, "pwd -P > "+standin.Quote(filepath.Join(dir, "cwd"))+"\n"+standin.Printf(recorded))
	a := newAdapter(t, cli, domain.AdapterConfig{WorkDir: dir, Args: []string{"--permission-mode=acceptEdits"}, Models: []string{"opus"}}, nil)
	prompt := "-p $HOME; echo 'pwned' \"quoted\"\nsecond line"
	if _, err := run(t, a, domain.RunRequest{Input: []byte(prompt)}); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, a, domain.RunRequest{Target: "sonnet", Input: []byte(prompt)}); err != nil {
		t.Fatal(err)
	}
	runs := cli.Runs(t)
	want := [][]string{
		{"-p", "--output-format", "stream-json", "--verbose", "--model=opus", "--permission-mode=acceptEdits"},
		{"-p", "--output-format", "stream-json", "--verbose", "--model=sonnet", "--permission-mode=acceptEdits"},
	}
	if len(runs) != 2 || !slices.Equal(runs[0], want[0]) || !slices.Equal(runs[1], want[1]) {
		t.Errorf("argv = %q, want %q", runs, want)
	}
	if got := cli.Stdin(t); got != prompt {
		t.Errorf("stdin = %q, want the prompt verbatim", got)
	}
	cwd, _ := os.ReadFile(filepath.Join(dir, "cwd"))
	real, _ := filepath.EvalSymlinks(dir)
	if strings.TrimSpace(string(cwd)) != real {
		t.Errorf("cwd = %q, want %q", cwd, real)
	}
}

func TestSessionsResume(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded))
	agents := memory.NewAgentSessionStore()
	a := newAdapter(t, cli, domain.AdapterConfig{}, agents)
	if !a.Capabilities().Sessions || a.Capabilities().MaxConcurrency != domain.DefaultMaxConcurrency {
		t.Errorf("capabilities = %+v", a.Capabilities())
	}
	for i := 0; i < 2; i++ {
		sink, err := run(t, a, domain.RunRequest{Target: "opus", SessionID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		requireTerminal(t, sink, domain.EventComplete, "")
	}
	list, err := a.ListSessions(context.Background(), domain.SessionQuery{})
	if err != nil || len(list) != 1 || list[0].SessionID != "s1" || list[0].AgentSessionID != "6f1" || list[0].Target != "opus" || list[0].Turns != 2 {
		t.Fatalf("ListSessions = %+v, %v", list, err)
	}
	if err := a.TerminateSession(context.Background(), "opus", "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, a, domain.RunRequest{Target: "opus", SessionID: "s1"}); err != nil {
		t.Fatal(err)
	}
	runs := cli.Runs(t)
	if len(runs) != 3 {
		t.Fatalf("%d runs", len(runs))
	}
	resumes := func(argv []string) bool { return slices.Contains(argv, "--resume=6f1") }
	if resumes(runs[0]) || !resumes(runs[1]) || resumes(runs[2]) {
		t.Errorf("argv: first %q, second %q (want --resume=6f1), after terminate %q", runs[0], runs[1], runs[2])
	}
	if i := slices.Index(runs[1], "--resume=6f1"); i != 5 {
		t.Errorf("--resume at %d in %q", i, runs[1])
	}
}

func TestPartialMessages(t *testing.T) {
	stream := standin.Lines(
		initLine,
		`{"type":"stream_event","event":{"type":"message_start","message":{"id":"m1"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Hmm"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hel"}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"lo"}}}`,
		`{"type":"assistant","message":{"content":[{"type":"thinking","thinking":"Hmm"},{"type":"text","text":"Hello"},{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"/x"}}]}}`,
		`{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}}`,
		`{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Bye"}}}`,
		`{"type":"assistant","message":{"content":[{"type":"text","text":"Bye"}]}}`,
		`{"type":"result","subtype":"success","is_error":false,"result":"Bye","session_id":"6f1","usage":{"input_tokens":1,"output_tokens":2}}`,
	)
	cli := standin.WriteCLI(t, standin.Printf(stream))
	a := newAdapter(t, cli, domain.AdapterConfig{Args: []string{"--include-partial-messages"}}, nil)
	sink, err := run(t, a, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if got := sink.Text(); got != "Hello\n\nBye" {
		t.Errorf("text = %q (whole messages must not repeat the deltas)", got)
	}
	got := summary(sink.Events())
	if !slices.Contains(got, "r:Hmm") || !slices.Contains(got, `m:{"tool_use":{"id":"t1","input":{"file_path":"/x"},"name":"Read"}}`) {
		t.Errorf("events %q", got)
	}

	// Without the flag, stream events are ignored and whole messages count.
	b := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink, err = run(t, b, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := sink.Text(); got != "Hello\n\nBye" {
		t.Errorf("text without partial messages = %q", got)
	}
}

func TestLongToolPayloadsAreSummarised(t *testing.T) {
	big := strings.Repeat("é", 3000) // 6000 bytes
	input, _ := json.Marshal(map[string]string{"file_path": "/x", "content": big})
	content, _ := json.Marshal([]map[string]string{{"type": "text", "text": big}, {"type": "image"}})
	stream := standin.Lines(
		initLine,
		`{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t1","name":"Write","input":`+string(input)+`}]}}`,
		`{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":`+string(content)+`}]}}`,
		`{"type":"result","subtype":"success","is_error":false,"result":"ok","usage":{"input_tokens":1,"output_tokens":1}}`,
	)
	cli := standin.WriteCLI(t, "cat <<'EOF'\n"+stream+"EOF")
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink, err := run(t, a, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	var use struct {
		ToolUse struct {
			Name  string
			Input struct{ FilePath, Content string } `json:"input"`
		} `json:"tool_use"`
	}
	var res struct {
		ToolResult struct {
			IsError   bool   `json:"is_error"`
			Content   string `json:"content"`
			Truncated bool   `json:"truncated"`
		} `json:"tool_result"`
	}
	evs := sink.Events()
	if err := json.Unmarshal(evs[2].Metadata, &use); err != nil || use.ToolUse.Name != "Write" {
		t.Fatalf("tool_use event %s (%v)", evs[2].Metadata, err)
	}
	if n := len(use.ToolUse.Input.Content); n > 2100 || !strings.HasSuffix(use.ToolUse.Input.Content, "…") {
		t.Errorf("tool_use input content kept %d bytes", n)
	}
	if err := json.Unmarshal(evs[3].Metadata, &res); err != nil {
		t.Fatal(err)
	}
	r := res.ToolResult
	if !r.IsError || !r.Truncated || len(r.Content) > 2100 || !strings.HasPrefix(r.Content, "éé") {
		t.Errorf("tool_result = %+v (%d bytes)", r, len(r.Content))
	}
}

func TestErrorResults(t *testing.T) {
	cases := []struct {
		name, stream, code, message string
		promptTokens                int64
	}{
		{"api error with subtype success", standin.Lines(initLine,
			`{"type":"result","subtype":"success","is_error":true,"result":"API Error: 529 {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}","session_id":"6f1","total_cost_usd":0.001,"usage":{"input_tokens":5,"output_tokens":0}}`),
			domain.CodeProviderError, `API Error: 529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, 5},
		{"max turns", standin.Lines(initLine,
			`{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":3,"session_id":"6f1","usage":{"input_tokens":5,"output_tokens":3}}`),
			domain.CodeRunFailed, "claude: error_max_turns", 5},
		{"during execution", standin.Lines(initLine,
			`{"type":"result","subtype":"error_during_execution","is_error":false,"result":"tool crashed","session_id":"6f1"}`),
			domain.CodeRunFailed, "tool crashed", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli := standin.WriteCLI(t, standin.Printf(tc.stream))
			a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
			sink, err := run(t, a, domain.RunRequest{})
			if err != nil {
				t.Fatal(err)
			}
			ev := requireTerminal(t, sink, domain.EventError, tc.code)
			if ev.Error.Message != tc.message {
				t.Errorf("message = %q, want %q", ev.Error.Message, tc.message)
			}
			if ev.Usage == nil || ev.Usage.PromptTokens != tc.promptTokens {
				t.Errorf("usage = %+v", ev.Usage)
			}
		})
	}
}

func TestProcessFailures(t *testing.T) {
	cases := []struct {
		name, body, contains string
	}{
		{"non-zero exit", standin.Printf(initLine+"\n") + "echo 'Error: Invalid API key · Please run /login' >&2\nexit 3", "exit status 3: Error: Invalid API key · Please run /login"},
		{"exit 0 without result", standin.Printf(initLine + "\n"), "without reporting a result"},
		{"killed by a signal", "kill -9 $$", "signal: killed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli := standin.WriteCLI(t, tc.body)
			a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
			sink, err := run(t, a, domain.RunRequest{})
			if err != nil {
				t.Fatal(err)
			}
			ev := requireTerminal(t, sink, domain.EventError, domain.CodeRunFailed)
			if !strings.Contains(ev.Error.Message, tc.contains) {
				t.Errorf("message = %q, want it to contain %q", ev.Error.Message, tc.contains)
			}
		})
	}
}

func TestRefusedBeforeStart(t *testing.T) {
	a, err := claudecode.New(domain.AdapterConfig{Name: "claude", Command: filepath.Join(t.TempDir(), "no-such-claude")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := run(t, a, domain.RunRequest{})
	if domain.CodeOf(err) != domain.CodeRunFailed || len(sink.Events()) != 0 {
		t.Errorf("missing binary: err = %v, events %v", err, sink.Types())
	}
	if _, err := run(t, a, domain.RunRequest{Input: []byte(" \n")}); !errors.Is(err, domain.ErrInvalidRequest) {
		t.Errorf("blank prompt: err = %v", err)
	}
	// The node asks before it starts the run, so the caller gets 400, not
	// a started run that fails.
	if err := a.Admit(domain.RunRequest{Input: []byte(" \n")}); !errors.Is(err, domain.ErrInvalidRequest) {
		t.Errorf("admitting a blank prompt: err = %v", err)
	}
	if err := a.Admit(domain.RunRequest{Input: []byte("hi")}); err != nil {
		t.Errorf("admitting a prompt: %v", err)
	}
	if _, err := run(t, a, domain.RunRequest{SessionID: "s"}); !errors.Is(err, domain.ErrSessionUnsupported) {
		t.Errorf("session without a store: err = %v", err)
	}
	if a.Capabilities().Sessions {
		t.Error("Sessions without a store")
	}
	if _, err := claudecode.New(domain.AdapterConfig{Name: "c", MaxConcurrency: -1}, nil); !errors.Is(err, domain.ErrConfig) {
		t.Errorf("negative max_concurrency: %v", err)
	}
}

// TestCancelKillsTheProcessGroup runs a CLI that ignores SIGTERM and has a
// grandchild: cancelling must still leave nothing of its group running.
func TestCancelKillsTheProcessGroup(t *testing.T) {
	for _, ignoreTerm := range []bool{false, true} {
		body := standin.Printf(initLine+"\n") + "sleep 60 &\nsleep 60\n"
		if ignoreTerm {
			body = "trap '' TERM\n" + body
		}
		cli := standin.WriteCLI(t, body)
		agents := memory.NewAgentSessionStore()
		a := newAdapter(t, cli, domain.AdapterConfig{}, agents)
		ctx, cancel := context.WithCancel(testContext(t))
		sink := &runtimetest.Sink{}
		exited := make(chan error, 1)
		go func() {
			exited <- a.Execute(ctx, domain.RunRequest{RunID: "r1", Adapter: "claude", Input: []byte("go"), SessionID: "s1"}, sink)
		}()
		err := sink.WaitFor(testContext(t), func(evs []domain.RunEvent) bool {
			return len(evs) >= 2 // pid, agent session id
		})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		pgid := pidOf(t, sink.Events())
		cancel()
		select {
		case err := <-exited:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Execute = %v, want context.Canceled", err)
			}
		case <-time.After(deadline):
			t.Fatal("Execute did not return after cancel")
		}
		if !runtimetest.GroupGone(pgid, 5*time.Second) {
			t.Fatalf("process group %d is still running (ignore TERM: %v)", pgid, ignoreTerm)
		}
		if _, ok := sink.Terminal(); ok {
			t.Errorf("terminal event after cancel: %v", sink.Types())
		}
		// The agent session was reported before the cancel, so it is kept.
		if id, ok, _ := agents.GetAgentSession(context.Background(), "claude", "s1"); !ok || id.AgentID != "6f1" {
			t.Errorf("stored agent session = %q, %v", id.AgentID, ok)
		}
	}
}

func TestTimeout(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(initLine+"\n")+"sleep 60")
	a := newAdapter(t, cli, domain.AdapterConfig{Timeout: 300 * time.Millisecond}, nil)
	sink, err := run(t, a, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventError, domain.CodeTimeout)
	if !runtimetest.GroupGone(pidOf(t, sink.Events()), 5*time.Second) {
		t.Error("the timed-out process group is still running")
	}
}

func TestSinkFailureKillsTheProcess(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(initLine+"\n")+"sleep 60")
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	errGone := errors.New("gone")
	sink := &runtimetest.Sink{Err: errGone, FailAfter: 1}
	start := time.Now()
	err := a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "claude", Input: []byte("go")}, sink)
	if !errors.Is(err, errGone) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Error("the process was not killed")
	}
	if pgid := pidOf(t, sink.Events()); !runtimetest.GroupGone(pgid, 5*time.Second) {
		t.Error("process group still running")
	}
}

// On an API error the CLI makes up an assistant message holding the error
// text; it is not the answer: the run has one error event and no delta.
func TestSyntheticAPIErrorMessageIsNotOutput(t *testing.T) {
	stream := standin.Lines(
		initLine,
		`{"type":"assistant","message":{"id":"x","model":"<synthetic>","role":"assistant","stop_reason":"stop_sequence","type":"message","content":[{"type":"text","text":"Prompt is too long"}]},"session_id":"6f1","error":"invalid_request","is_api_error_message":true,"api_error_status":400}`,
		`{"type":"result","subtype":"success","is_error":true,"api_error_status":400,"result":"Prompt is too long","session_id":"6f1","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0}}`,
	)
	cli := standin.WriteCLI(t, standin.Printf(stream))
	for _, args := range [][]string{nil, {"--include-partial-messages"}} {
		a := newAdapter(t, cli, domain.AdapterConfig{Args: args}, nil)
		sink, err := run(t, a, domain.RunRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ev := requireTerminal(t, sink, domain.EventError, domain.CodeProviderError)
		if ev.Error.Message != "Prompt is too long" || sink.Text() != "" {
			t.Errorf("args %q: error %+v, text %q", args, ev.Error, sink.Text())
		}
		if ev.Usage == nil || ev.Usage.Model != "claude-opus-4-8" {
			t.Errorf("usage = %+v, want the init model without its label", ev.Usage)
		}
	}
}

// The CLI starts with a clean environment: declared env and inherit_env
// reach it, the node's token and other secrets do not.
func TestCleanEnvironment(t *testing.T) {
	t.Setenv("IOP_NODE_TOKEN", "node-secret-token")
	t.Setenv("OPENAI_API_KEY", "sk-not-for-claude")
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-for-claude")
	cli, env := standin.EnvCLI(t, recorded)
	a := newAdapter(t, cli, domain.AdapterConfig{
		Env:        map[string]string{"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"},
		InheritEnv: []string{"ANTHROPIC_API_KEY"},
	}, nil)
	if _, err := run(t, a, domain.RunRequest{}); err != nil {
		t.Fatal(err)
	}
	standin.CheckEnv(t, env(), []string{"node-secret-token", "sk-not-for-claude"},
		[]string{"ANTHROPIC_BASE_URL=http://127.0.0.1:9\n", "ANTHROPIC_API_KEY=sk-ant-for-claude\n", "PATH="})
}

// The CLI's last lines, still in the pipe when it exits, reach a receiver
// that held the run back for longer than any grace period: the result is
// not lost, and the run is not a failure for want of it.
func TestSlowReceiverGetsTheResult(t *testing.T) {
	big := strings.Repeat("x", 40<<10) // with the rest, fits the pipe: the CLI exits at once
	out := standin.Lines(
		initLine,
		`{"type":"assistant","message":{"model":"claude-opus-4-8","role":"assistant","content":[{"type":"text","text":"`+big+`"}]}}`,
		`{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"6f1","total_cost_usd":0.01,"usage":{"input_tokens":1,"output_tokens":2}}`,
	)
	data := filepath.Join(t.TempDir(), "out.jsonl")
	if err := os.WriteFile(data, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	cli := standin.WriteCLI(t, "cat "+standin.Quote(data))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink := &runtimetest.Sink{Block: make(chan struct{})}
	time.AfterFunc(2*time.Second, func() { close(sink.Block) })
	if err := a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "claude", Input: []byte("hi")}, sink); err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
}

// slowOnResult holds back the event that carries the CLI's result summary.
type slowOnResult struct {
	runtimetest.Sink
	delay time.Duration
}

func (s *slowOnResult) Emit(ev domain.RunEvent) error {
	if strings.Contains(string(ev.Metadata), "num_turns") {
		time.Sleep(s.delay)
	}
	return s.Sink.Emit(ev)
}

// A CLI that exited well within its timeout keeps its result even when
// relaying its output took the run past the timeout: only a CLI the limit
// stopped timed out.
func TestFinishedInTimeIsNotATimeout(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(standin.Lines(initLine,
		`{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"6f1","num_turns":1,"total_cost_usd":0.5,"usage":{"input_tokens":1,"output_tokens":2}}`)))
	a := newAdapter(t, cli, domain.AdapterConfig{Timeout: 500 * time.Millisecond}, nil)
	sink := &slowOnResult{delay: time.Second}
	if err := a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "claude", Input: []byte("hi")}, sink); err != nil {
		t.Fatal(err)
	}
	evs := sink.Events()
	if last := evs[len(evs)-1]; last.Type != domain.EventComplete || last.Usage == nil {
		t.Fatalf("last event = %s %+v, usage %v; want complete with usage", last.Type, last.Error, last.Usage)
	}
}

// Claude Code can print its result and then never exit
// (anthropics/claude-code#25629): the run ends with the result once the CLI
// has lingered ExitGrace, its session turn counted, its group gone.
func TestResultThenNoExit(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded)+"exec sleep 3600\n")
	agents := memory.NewAgentSessionStore()
	a := newAdapter(t, cli, domain.AdapterConfig{}, agents)
	a.ExitGrace = 100 * time.Millisecond
	sink, err := run(t, a, domain.RunRequest{SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	if done.Usage == nil || done.Usage.PromptTokens != 1109 || done.Usage.CostUSD != 0.0412 {
		t.Errorf("usage = %+v", done.Usage)
	}
	if sink.Text() != "Looking… \n\nDone ✅" {
		t.Errorf("text = %q", sink.Text())
	}
	if !runtimetest.GroupGone(pidOf(t, sink.Events()), 5*time.Second) {
		t.Error("the process group is still running")
	}
	if list, err := a.ListSessions(context.Background(), domain.SessionQuery{}); err != nil || len(list) != 1 || list[0].Turns != 1 {
		t.Errorf("ListSessions = %+v, %v; want the turn counted", list, err)
	}
}

// A CLI that reported its result and lingers until the run's timeout
// expires did not time out: its result stands. (Should the machine be too
// slow for the CLI to print its result within the timeout, the run is
// tried again with a longer one.)
func TestResultThenNoExitUntilTimeout(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded)+"exec sleep 3600\n")
	for timeout := 300 * time.Millisecond; ; timeout *= 2 {
		a := newAdapter(t, cli, domain.AdapterConfig{Timeout: timeout}, nil)
		a.ExitGrace = time.Hour
		sink, err := run(t, a, domain.RunRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(summary(sink.Events()), func(s string) bool { return strings.Contains(s, `"num_turns"`) }) {
			if timeout > deadline/4 {
				t.Fatalf("no result within %s: %v", timeout, sink.Types())
			}
			continue // the result did not come in time
		}
		if done := requireTerminal(t, sink, domain.EventComplete, ""); done.Usage == nil || done.Usage.PromptTokens != 1109 {
			t.Errorf("usage = %+v", done.Usage)
		}
		if !runtimetest.GroupGone(pidOf(t, sink.Events()), 5*time.Second) {
			t.Error("the process group is still running")
		}
		return
	}
}

// When the API stream breaks off (an SSE error event such as
// overloaded_error), Claude Code asks again without streaming: the answer
// then comes only as a whole assistant message, with no deltas. The stream
// is what claude-code 2.1.328 prints with --include-partial-messages
// against an API whose stream fails after "Hel".
func TestPartialMessagesNonStreamingFallback(t *testing.T) {
	ev := func(e string) string {
		return `{"type":"stream_event","event":` + e + `,"session_id":"6f1","parent_tool_use_id":null}`
	}
	head := []string{
		initLine,
		`{"type":"system","subtype":"status","status":"requesting","session_id":"6f1"}`,
		ev(`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-5-5","content":[],"usage":{"input_tokens":10,"output_tokens":1}}}`),
		ev(`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		ev(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`),
		ev(`{"type":"content_block_stop","index":0}`),
		`{"type":"stream_event","event":{"type":"message_stop"},"session_id":"6f1","parent_tool_use_id":null,"abandoned_blocks":{"api_message_id":"msg_1","from_block_index":0}}`,
	}
	whole := func(text string) string {
		return `{"type":"assistant","message":{"id":"msg_2","model":"claude-opus-5-5","role":"assistant","content":[{"type":"text","text":"` + text + `"}]},"parent_tool_use_id":null,"session_id":"6f1"}`
	}
	result := `{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"Hello world","session_id":"6f1","total_cost_usd":0.0001,"usage":{"input_tokens":20,"output_tokens":4}}`
	cases := []struct {
		name   string
		lines  []string
		text   string
		events []string
	}{
		// The retried answer starts with what the broken stream carried:
		// it is continued.
		{"continued", append(slices.Clone(head), whole("Hello world"), result), "Hello world", []string{"d:Hel", "d:lo world"}},
		// A different answer cannot take back what went out: it is a new block.
		{"different", append(slices.Clone(head), whole("Hi there"), result), "Hel\n\nHi there", []string{"d:Hel", "d:\n\nHi there"}},
		// No stream events at all: the whole message is the answer.
		{"no deltas", []string{initLine, whole("Hello world"), result}, "Hello world", []string{"d:Hello world"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli := standin.WriteCLI(t, standin.Printf(standin.Lines(tc.lines...)))
			a := newAdapter(t, cli, domain.AdapterConfig{Args: []string{"--include-partial-messages"}}, nil)
			sink, err := run(t, a, domain.RunRequest{})
			if err != nil {
				t.Fatal(err)
			}
			requireTerminal(t, sink, domain.EventComplete, "")
			if got := sink.Text(); got != tc.text {
				t.Errorf("text = %q, want %q", got, tc.text)
			}
			var deltas []string
			for _, s := range summary(sink.Events()) {
				if strings.HasPrefix(s, "d:") {
					deltas = append(deltas, s)
				}
			}
			if !slices.Equal(deltas, tc.events) {
				t.Errorf("deltas = %q, want %q", deltas, tc.events)
			}
		})
	}
}

// subagentStream is what claude-code 2.1.328 prints (trimmed) for a prompt
// whose answer delegates to a background subagent with the Agent tool: the
// subagent's lines carry parent_tool_use_id; the main agent takes up its
// outcome in a second turn (a second init) and the process prints a result
// per turn. Each result's usage is its own segment of the main agent's
// calls; model_usage_since_last_result covers every call since the previous
// result, the subagent's included; modelUsage and total_cost_usd are
// running totals. A Bash call of the subagent is added.
var subagentStream = []string{
	`{"type":"system","subtype":"init","session_id":"f3e","model":"claude-opus-5-5"}`,
	`{"type":"assistant","message":{"id":"msg_1","model":"claude-opus-5-5","role":"assistant","content":[{"id":"toolu_2","input":{"description":"look around","prompt":"Say something SUB","subagent_type":"general-purpose"},"name":"Agent","type":"tool_use"}]},"parent_tool_use_id":null,"session_id":"f3e"}`,
	`{"type":"system","subtype":"background_tasks_changed","tasks":[{"task_id":"a81","task_type":"local_agent","subagent_type":"general-purpose","description":"look around"}],"session_id":"f3e"}`,
	`{"type":"system","subtype":"task_started","task_id":"a81","tool_use_id":"toolu_2","description":"look around","is_backgrounded":true,"session_id":"f3e"}`,
	`{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_2","type":"tool_result","content":[{"type":"text","text":"Async agent launched successfully."}]}]},"parent_tool_use_id":null,"session_id":"f3e"}`,
	`{"type":"assistant","message":{"id":"msg_4","model":"claude-haiku-5","role":"assistant","content":[{"signature":"c2ln","thinking":"SUBAGENT THINKING","type":"thinking"}]},"parent_tool_use_id":"toolu_2","session_id":"f3e"}`,
	`{"type":"assistant","message":{"id":"msg_4","model":"claude-haiku-5","role":"assistant","content":[{"text":"SUBAGENT INTERNAL TEXT","type":"text"}]},"parent_tool_use_id":"toolu_2","session_id":"f3e"}`,
	`{"type":"assistant","message":{"id":"msg_4","model":"claude-haiku-5","role":"assistant","content":[{"id":"toolu_9","input":{"command":"ls"},"name":"Bash","type":"tool_use"}]},"parent_tool_use_id":"toolu_2","session_id":"f3e"}`,
	`{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_9","type":"tool_result","content":"a.go","is_error":false}]},"parent_tool_use_id":"toolu_2","session_id":"f3e"}`,
	`{"type":"system","subtype":"task_notification","task_id":"a81","tool_use_id":"toolu_2","status":"completed","summary":"SUBAGENT INTERNAL TEXT","session_id":"f3e"}`,
	`{"type":"system","subtype":"background_tasks_changed","tasks":[],"session_id":"f3e"}`,
	`{"type":"assistant","message":{"id":"msg_3","model":"claude-opus-5-5","role":"assistant","content":[{"text":"Main answer.","type":"text"}]},"parent_tool_use_id":null,"session_id":"f3e"}`,
	`{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"Main answer.","session_id":"f3e","duration_ms":1348,"total_cost_usd":0.00176,"stop_reason":"end_turn","usage":{"input_tokens":30,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":12},"modelUsage":{"claude-opus-5-5":{"inputTokens":30,"outputTokens":12,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.00076},"claude-haiku-5":{"inputTokens":100,"outputTokens":50,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.001}},"model_usage_since_last_result":{"claude-opus-5-5":{"inputTokens":30,"outputTokens":12,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.00076},"claude-haiku-5":{"inputTokens":100,"outputTokens":50,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.001}},"result_index":0}`,
	`{"type":"system","subtype":"init","session_id":"f3e","model":"claude-opus-5-5"}`,
	`{"type":"assistant","message":{"id":"msg_5","model":"claude-opus-5-5","role":"assistant","content":[{"text":"Main final.","type":"text"}]},"parent_tool_use_id":null,"session_id":"f3e"}`,
	`{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"Main final.","session_id":"f3e","duration_ms":106,"total_cost_usd":0.001832,"stop_reason":"end_turn","usage":{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":3},"modelUsage":{"claude-opus-5-5":{"inputTokens":33,"outputTokens":15,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.000832},"claude-haiku-5":{"inputTokens":100,"outputTokens":50,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.001}},"model_usage_since_last_result":{"claude-opus-5-5":{"inputTokens":3,"outputTokens":3,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.000072}},"result_index":1}`,
}

// A subagent's work is not the run's answer: its text and thinking are not
// streamed, its tool calls are metadata marked with the Agent call's id.
// The usage is the whole process's (the subagent's calls included), the
// model the main agent's.
func TestSubagents(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(standin.Lines(subagentStream...)))
	for _, args := range [][]string{nil, {"--include-partial-messages"}} {
		a := newAdapter(t, cli, domain.AdapterConfig{Args: args}, nil)
		sink, err := run(t, a, domain.RunRequest{})
		if err != nil {
			t.Fatal(err)
		}
		done := requireTerminal(t, sink, domain.EventComplete, "")
		if got := sink.Text(); got != "Main answer.\n\nMain final." {
			t.Errorf("args %q: text = %q", args, got)
		}
		got := summary(sink.Events())
		for _, s := range got {
			if strings.HasPrefix(s, "r:") {
				t.Errorf("args %q: the subagent's thinking streamed as the run's: %q", args, s)
			}
		}
		for _, want := range []string{
			`m:{"tool_use":{"id":"toolu_2","input":{"description":"look around","prompt":"Say something SUB","subagent_type":"general-purpose"},"name":"Agent"}}`,
			`m:{"tool_use":{"id":"toolu_9","input":{"command":"ls"},"name":"Bash","parent_tool_use_id":"toolu_2"}}`,
			`m:{"tool_result":{"content":"a.go","is_error":false,"parent_tool_use_id":"toolu_2","tool_use_id":"toolu_9","truncated":false}}`,
		} {
			if !slices.Contains(got, want) {
				t.Errorf("args %q: no %s in\n%s", args, want, strings.Join(got, "\n"))
			}
		}
		u := done.Usage
		if u == nil || u.PromptTokens != 133 || u.CompletionTokens != 65 || u.TotalTokens != 198 ||
			u.CostUSD < 0.0018319 || u.CostUSD > 0.0018321 || u.Model != "claude-opus-5-5" || u.DurationMS != 1348+106 {
			t.Errorf("args %q: usage = %+v, want 133+65 tokens for $0.001832 by claude-opus-5-5", args, u)
		}
	}
}

// The usage without model_usage_since_last_result: modelUsage for a new
// session, else (modelUsage may count a resumed session's earlier turns)
// every result's usage summed.
func TestSubagentUsageFallbacks(t *testing.T) {
	var old []string
	for _, l := range subagentStream {
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(l), &m) == nil && string(m["type"]) == `"result"` {
			delete(m, "model_usage_since_last_result")
			b, _ := json.Marshal(m)
			l = string(b)
		}
		old = append(old, l)
	}
	cli := standin.WriteCLI(t, standin.Printf(standin.Lines(old...)))
	agents := memory.NewAgentSessionStore()
	a := newAdapter(t, cli, domain.AdapterConfig{}, agents)
	sink, err := run(t, a, domain.RunRequest{SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if u := requireTerminal(t, sink, domain.EventComplete, "").Usage; u == nil || u.PromptTokens != 133 || u.CompletionTokens != 65 || u.CostUSD != 0.001832 {
		t.Errorf("new session: usage = %+v, want modelUsage's 133+65", u)
	}
	sink, err = run(t, a, domain.RunRequest{SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if u := requireTerminal(t, sink, domain.EventComplete, "").Usage; u == nil || u.PromptTokens != 33 || u.CompletionTokens != 15 {
		t.Errorf("resumed: usage = %+v, want the results' 30+3 and 12+3", u)
	}
}

// On --resume, Claude Code may restore the session's running totals:
// modelUsage and total_cost_usd then count the earlier turns too (as
// claude-code 2.1.328 prints for a second turn of 200+20 tokens after a
// first of 100+10). The run's usage and cost are its own.
func TestResumedRunCostsItsOwn(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(standin.Lines(initLine,
		`{"type":"assistant","message":{"id":"msg_2","model":"claude-opus-5-5","role":"assistant","content":[{"type":"text","text":"two"}]},"parent_tool_use_id":null,"session_id":"6f1"}`,
		`{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"two","session_id":"6f1","total_cost_usd":0.0018000000000000002,"usage":{"input_tokens":200,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":20},"modelUsage":{"claude-opus-5-5":{"inputTokens":300,"outputTokens":30,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.0018000000000000002}},"model_usage_since_last_result":{"claude-opus-5-5":{"inputTokens":200,"outputTokens":20,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.0012000000000000001}},"result_index":0}`,
	)))
	agents := memory.NewAgentSessionStore()
	a := newAdapter(t, cli, domain.AdapterConfig{}, agents)
	for i := 0; i < 2; i++ {
		sink, err := run(t, a, domain.RunRequest{SessionID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		if u := requireTerminal(t, sink, domain.EventComplete, "").Usage; u == nil || u.PromptTokens != 200 || u.CompletionTokens != 20 || u.CostUSD != 0.0012000000000000001 {
			t.Errorf("run %d: usage = %+v, want 200+20 tokens for $0.0012", i+1, u)
		}
	}
}

// A result while a background task still runs is not the end: the CLI
// goes on (here after a pause longer than ExitGrace) and is not stopped.
func TestResultWithBackgroundTaskIsNotTheEnd(t *testing.T) {
	i := slices.IndexFunc(subagentStream, func(l string) bool { return strings.Contains(l, `"task_started"`) })
	early := `{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"","session_id":"f3e","total_cost_usd":0.0001,"usage":{"input_tokens":10,"output_tokens":5}}`
	body := standin.Printf(standin.Lines(append(slices.Clone(subagentStream[:i+1]), early)...)) + "sleep 1\n" +
		standin.Printf(standin.Lines(subagentStream[i+1:]...))
	cli := standin.WriteCLI(t, body)
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	a.ExitGrace = 100 * time.Millisecond
	sink, err := run(t, a, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if got := sink.Text(); got != "Main answer.\n\nMain final." {
		t.Errorf("text = %q: the CLI was stopped at its first result", got)
	}
}

// A rate-limited (or overloaded, or refused) API call makes the CLI wait and
// try again, for minutes with its backoff: each wait is reported, so the
// caller sees why the run is silent. The lines are Claude Code 2.1.328's.
func TestAPIRetriesAreReported(t *testing.T) {
	stream := standin.Lines(
		initLine,
		`{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":505,"error_status":429,"error":"rate_limit","session_id":"6f1","uuid":"bb672d08-9a4c-4c12-b45b-0260431eb4af"}`,
		`{"type":"system","subtype":"api_retry","attempt":2,"max_retries":10,"retry_delay_ms":1035,"error_status":null,"error":"unknown","session_id":"6f1","uuid":"2223f54f-384d-4908-8a18-4560db34c4c7"}`,
		`{"type":"assistant","message":{"id":"m1","model":"claude-opus-5-5","role":"assistant","content":[{"type":"text","text":"after retry"}]},"parent_tool_use_id":null,"session_id":"6f1"}`,
		`{"type":"result","subtype":"success","is_error":false,"result":"after retry","session_id":"6f1","num_turns":1,"usage":{"input_tokens":1,"output_tokens":2}}`,
	)
	cli := standin.WriteCLI(t, standin.Printf(stream))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink, err := run(t, a, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	want := []string{
		"m:pid",
		`m:{"agent_session_id":"6f1"}`,
		`m:{"api_retry":{"attempt":1,"max_retries":10,"retry_delay_ms":505,"error_status":429,"error":"rate_limit"}}`,
		`m:{"api_retry":{"attempt":2,"max_retries":10,"retry_delay_ms":1035,"error_status":null,"error":"unknown"}}`,
		"d:after retry",
		`m:{"num_turns":1,"usage":{"input_tokens":1,"output_tokens":2}}`,
		"complete",
	}
	if got := summary(sink.Events()); !slices.Equal(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A tool call the CLI refuses for want of a permission is an error
// tool_result, which a failing tool also is: the result's
// permission_denials tell the two apart, so a caller can see that the
// adapter's args (--allowedTools, --permission-mode) need changing. The
// lines are Claude Code 2.1.328's, cut short.
func TestPermissionDenialsAreReported(t *testing.T) {
	stream := standin.Lines(
		initLine,
		`{"type":"assistant","message":{"content":[{"id":"toolu_2","input":{"file_path":"/etc/x","content":"x"},"name":"Write","type":"tool_use"}],"id":"m1","model":"claude-opus-5-5","role":"assistant"},"parent_tool_use_id":null,"session_id":"6f1"}`,
		`{"type":"system","subtype":"permission_denied","tool_name":"Write","tool_use_id":"toolu_2","decision_reason_type":"workingDir","decision_reason":"Path is outside allowed working directories","message":"Claude requested permissions to write to /etc/x, but you haven't granted it yet.","session_id":"6f1"}`,
		`{"type":"user","message":{"role":"user","content":[{"type":"tool_result","content":"Claude requested permissions to write to /etc/x, but you haven't granted it yet.","is_error":true,"tool_use_id":"toolu_2"}]},"parent_tool_use_id":null,"session_id":"6f1"}`,
		`{"type":"assistant","message":{"content":[{"text":"could not write","type":"text"}],"id":"m2","model":"claude-opus-5-5","role":"assistant"},"parent_tool_use_id":null,"session_id":"6f1"}`,
		`{"stop_reason":"end_turn","session_id":"6f1","total_cost_usd":0,"usage":{"input_tokens":3,"output_tokens":4},"permission_denials":[{"tool_name":"Write","tool_use_id":"toolu_2","tool_input":{"file_path":"/etc/x","content":"x"}}],"terminal_reason":"completed","is_error":false,"num_turns":2,"subtype":"success","result":"could not write","type":"result"}`,
	)
	cli := standin.WriteCLI(t, standin.Printf(stream))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink, err := run(t, a, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	got := summary(sink.Events())
	want := []string{
		`m:{"tool_result":{"content":"Claude requested permissions to write to /etc/x, but you haven't granted it yet.","is_error":true,"tool_use_id":"toolu_2","truncated":false}}`,
		"d:could not write",
		`m:{"permission_denials":[{"tool_name":"Write","tool_use_id":"toolu_2"}]}`,
		`m:{"num_turns":2,"usage":{"input_tokens":3,"output_tokens":4}}`,
		"complete",
	}
	if len(got) < len(want) || !slices.Equal(got[len(got)-len(want):], want) {
		t.Errorf("events:\n%s\nwant them to end with:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
