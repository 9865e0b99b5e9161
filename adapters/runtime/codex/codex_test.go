package codex_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/adapters/runtime/codex"
	"iop/adapters/runtime/internal/standin"
	"iop/adapters/runtime/runtimetest"
	"iop/adapters/store/memory"
	"iop/domain"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const deadline = 20 * time.Second

const threadID = "0199a213-81c0-7800-8aa1-bbab2a035a53"

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

var recorded = standin.Lines(
	`{"type":"thread.started","thread_id":"`+threadID+`"}`,
	`{"type":"turn.started"}`,
	`{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"**Scanning** the repo"}}`,
	`{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}`,
	`{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"a.go\nb.go\n","exit_code":0,"status":"completed"}}`,
	`{"type":"item.completed","item":{"id":"item_2","type":"file_change","changes":[{"path":"a.go","kind":"update"}],"status":"completed"}}`,
	`garbage`,
	`{"type":"item.completed","item":{"id":"item_3","type":"agent_message","text":"Yes — done ✅"}}`,
	`{"type":"item.updated","item":{"id":"item_4","type":"todo_list","items":[{"text":"fix","completed":false}]}}`,
	`{"type":"item.completed","item":{"id":"item_4","type":"todo_list","items":[{"text":"fix","completed":true}]}}`,
	`{"type":"item.completed","item":{"id":"item_5","type":"error","message":"command timed out"}}`,
	`{"type":"future.event","x":1}`,
	`{"type":"item.completed","item":{"id":"item_6","type":"agent_message","text":"Second."}}`,
	`{"type":"turn.completed","usage":{"input_tokens":24763,"cached_input_tokens":24448,"output_tokens":122}}`,
)

func newAdapter(t *testing.T, cli standin.CLI, cfg domain.AdapterConfig, agents *memory.AgentSessionStore) *codex.Adapter {
	t.Helper()
	cfg.Name, cfg.Type, cfg.Command = "codex", domain.AdapterCodex, cli.Path
	var a *codex.Adapter
	var err error
	if agents == nil {
		a, err = codex.New(cfg, nil)
	} else {
		a, err = codex.New(cfg, agents)
	}
	if err != nil {
		t.Fatal(err)
	}
	a.KillGrace = 200 * time.Millisecond
	return a
}

func run(t *testing.T, a *codex.Adapter, req domain.RunRequest) (*runtimetest.Sink, error) {
	t.Helper()
	req.RunID, req.Adapter = "r1", "codex"
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

func TestJSONLMapping(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "gpt-5-codex"})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	want := []string{
		"m:pid",
		`m:{"agent_session_id":"` + threadID + `"}`,
		"r:**Scanning** the repo",
		`m:{"item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"a.go\nb.go\n","exit_code":0,"status":"completed"}}`,
		`m:{"item":{"id":"item_2","type":"file_change","changes":[{"path":"a.go","kind":"update"}],"status":"completed"}}`,
		"d:Yes — done ✅",
		`m:{"item":{"id":"item_4","type":"todo_list","items":[{"text":"fix","completed":true}]}}`,
		`m:{"item":{"id":"item_5","type":"error","message":"command timed out"}}`,
		"d:\n\nSecond.",
		`m:{"usage":{"input_tokens":24763,"cached_input_tokens":24448,"output_tokens":122}}`,
		"complete",
	}
	if got := summary(sink.Events()); !slices.Equal(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	u := done.Usage
	if u == nil || u.PromptTokens != 24763 || u.CompletionTokens != 122 || u.TotalTokens != 24885 || u.Model != "gpt-5-codex" || u.DurationMS < 0 {
		t.Errorf("usage = %+v", u)
	}
}

func TestArgvAndResume(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded))
	agents := memory.NewAgentSessionStore()
	a := newAdapter(t, cli, domain.AdapterConfig{Args: []string{"--skip-git-repo-check"}, Models: []string{"gpt-5-codex"}}, agents)
	prompt := "fix it; echo $HOME 'x'\nthen test"
	for i := 0; i < 2; i++ {
		sink, err := run(t, a, domain.RunRequest{SessionID: "s1", Input: []byte(prompt)})
		if err != nil {
			t.Fatal(err)
		}
		requireTerminal(t, sink, domain.EventComplete, "")
	}
	if err := a.TerminateSession(context.Background(), "", "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, a, domain.RunRequest{SessionID: "s1", Target: "o3", Input: []byte("-v is a prompt")}); err != nil {
		t.Fatal(err)
	}
	runs := cli.Runs(t)
	want := [][]string{
		{"exec", "--json", "--model=gpt-5-codex", "--skip-git-repo-check", "-"},
		{"exec", "--json", "--model=gpt-5-codex", "--skip-git-repo-check", "resume", threadID, "-"},
		{"exec", "--json", "--model=o3", "--skip-git-repo-check", "-"},
	}
	if len(runs) != len(want) {
		t.Fatalf("%d runs: %q", len(runs), runs)
	}
	for i := range want {
		if !slices.Equal(runs[i], want[i]) {
			t.Errorf("run %d argv = %q, want %q", i+1, runs[i], want[i])
		}
	}
	if got := cli.Stdin(t); got != "-v is a prompt" {
		t.Errorf("stdin of the last run = %q, want its prompt", got)
	}
	list, err := a.ListSessions(context.Background(), domain.SessionQuery{})
	if err != nil || len(list) != 1 || list[0].AgentSessionID != threadID || list[0].Target != "o3" {
		t.Errorf("ListSessions = %+v, %v", list, err)
	}
}

// Every run reports the agent's session id, a resumed one too (its caller
// may read the id from its own stream), though only a new id is stored.
func TestResumedRunReportsTheAgentSessionID(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded))
	a := newAdapter(t, cli, domain.AdapterConfig{Models: []string{"gpt-5-codex"}}, memory.NewAgentSessionStore())
	for i := 1; i <= 2; i++ {
		sink, err := run(t, a, domain.RunRequest{SessionID: "s1", Input: []byte("go on")})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ev := range sink.Events() {
			if ev.Type == domain.EventMetadata && string(ev.Metadata) == `{"agent_session_id":"`+threadID+`"}` {
				n++
			}
		}
		if n != 1 {
			t.Errorf("run %d reported the agent session id %d times, want once: %q", i, n, summary(sink.Events()))
		}
	}
}

func TestNoModel(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	if _, err := run(t, a, domain.RunRequest{}); err != nil {
		t.Fatal(err)
	}
	if runs := cli.Runs(t); len(runs) != 1 || !slices.Equal(runs[0], []string{"exec", "--json", "-"}) {
		t.Errorf("argv = %q", runs)
	}
}

func TestFailures(t *testing.T) {
	started := `{"type":"thread.started","thread_id":"` + threadID + `"}` + "\n"
	cases := []struct {
		name, body, message string
	}{
		{"turn failed", standin.Printf(started + `{"type":"turn.failed","error":{"message":"stream disconnected before completion: Your input exceeds the context window"}}` + "\n"),
			"stream disconnected before completion: Your input exceeds the context window"},
		{"fatal error then exit 1", standin.Printf(started+`{"type":"error","message":"unexpected status 401 Unauthorized: Missing bearer"}`+"\n") + "exit 1",
			"unexpected status 401 Unauthorized: Missing bearer"},
		{"non-zero exit", "echo 'Error: unexpected argument --bogus found' >&2\nexit 2",
			"codex: exit status 2: Error: unexpected argument --bogus found"},
		{"no turn end", standin.Printf(started), "codex exited without reporting a result"},
		{"turn completed, then non-zero exit", standin.Printf(started+`{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"ok"}}`+"\n"+
			`{"type":"turn.completed","usage":{"input_tokens":3,"cached_input_tokens":0,"output_tokens":2}}`+"\n") +
			"echo 'fatal: failed to write rollout' >&2\nexit 3",
			"codex: exit status 3: fatal: failed to write rollout"},
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
			if ev.Error.Message != tc.message {
				t.Errorf("message = %q, want %q", ev.Error.Message, tc.message)
			}
			if strings.HasPrefix(tc.name, "turn completed") && (ev.Usage == nil || ev.Usage.TotalTokens != 5) {
				t.Errorf("usage = %+v, want the turn's 5 tokens kept", ev.Usage)
			}
		})
	}
}

func TestReconnectErrorThenCompletion(t *testing.T) {
	stream := standin.Lines(
		`{"type":"thread.started","thread_id":"`+threadID+`"}`,
		`{"type":"error","message":"Reconnecting... 1/5"}`,
		`{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"ok"}}`,
		`{"type":"turn.completed","usage":{"input_tokens":1,"cached_input_tokens":0,"output_tokens":1}}`,
	)
	cli := standin.WriteCLI(t, standin.Printf(stream))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink, err := run(t, a, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if !slices.Contains(summary(sink.Events()), `m:{"error":"Reconnecting... 1/5"}`) {
		t.Errorf("events %q", summary(sink.Events()))
	}
}

func TestLongOutputIsCut(t *testing.T) {
	out, _ := json.Marshal(strings.Repeat("line of output\n", 1000))
	stream := standin.Lines(
		`{"type":"item.completed","item":{"id":"i","type":"command_execution","command":"cat big","aggregated_output":`+string(out)+`,"exit_code":0,"status":"completed"}}`,
		`{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":1}}`,
	)
	cli := standin.WriteCLI(t, "cat <<'EOF'\n"+stream+"EOF")
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink, err := run(t, a, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	var m struct {
		Item struct {
			Command          string
			AggregatedOutput string `json:"aggregated_output"`
			ExitCode         *int   `json:"exit_code"`
		}
	}
	ev := sink.Events()[1]
	if err := json.Unmarshal(ev.Metadata, &m); err != nil {
		t.Fatalf("%s: %v", ev.Metadata, err)
	}
	if n := len(m.Item.AggregatedOutput); n > 2100 || m.Item.ExitCode == nil {
		t.Errorf("item kept %d bytes of output: %s", n, ev.Metadata[:200])
	}
}

func TestCancelKillsTheProcessGroup(t *testing.T) {
	cli := standin.WriteCLI(t, "trap '' TERM\n"+standin.Printf(`{"type":"thread.started","thread_id":"t1"}`+"\n")+"sleep 60 &\nsleep 60\n")
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	ctx, cancel := context.WithCancel(testContext(t))
	sink := &runtimetest.Sink{}
	exited := make(chan error, 1)
	go func() {
		exited <- a.Execute(ctx, domain.RunRequest{RunID: "r1", Adapter: "codex", Input: []byte("go")}, sink)
	}()
	if err := sink.WaitFor(testContext(t), func(evs []domain.RunEvent) bool { return len(evs) >= 2 }); err != nil {
		cancel()
		t.Fatal(err)
	}
	pgid := pidOf(t, sink.Events())
	cancel()
	if err := <-exited; !errors.Is(err, context.Canceled) {
		t.Fatalf("Execute = %v, want context.Canceled", err)
	}
	if !runtimetest.GroupGone(pgid, 5*time.Second) {
		t.Fatalf("process group %d is still running", pgid)
	}
	if _, ok := sink.Terminal(); ok {
		t.Errorf("terminal event after cancel: %v", sink.Types())
	}
}

func TestTimeoutAndCapabilities(t *testing.T) {
	cli := standin.WriteCLI(t, "sleep 60")
	a := newAdapter(t, cli, domain.AdapterConfig{Timeout: 200 * time.Millisecond, MaxConcurrency: 1}, memory.NewAgentSessionStore())
	if c := a.Capabilities(); c.MaxConcurrency != 1 || !c.Sessions || len(c.Commands) != 0 {
		t.Errorf("capabilities = %+v", c)
	}
	sink, err := run(t, a, domain.RunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventError, domain.CodeTimeout)
}

// Codex reports a thread's running total at every turn.completed; each run
// reports its own turn, a cancelled turn stores nothing, and a new thread
// starts from zero.
func TestResumedTurnsReportTheirOwnUsage(t *testing.T) {
	// Run n (counted in a file) reports the total of n one-request turns,
	// as codex does; a run whose prompt is "hang" stops before the end.
	dir := t.TempDir()
	cli := standin.WriteCLI(t, `n=$(cat `+dir+`/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > `+dir+`/n
last=$(cat "$(dirname "$0")/stdin") # the prompt (the stand-in saved its stdin there)
echo '{"type":"thread.started","thread_id":"`+threadID+`"}'
echo '{"type":"item.completed","item":{"id":"i","type":"agent_message","text":"ok"}}'
[ "$last" = hang ] && exec sleep 60
echo '{"type":"turn.completed","usage":{"input_tokens":'$((120*n))',"cached_input_tokens":'$((20*n))',"output_tokens":'$((17*n))'}}'`)
	agents := memory.NewAgentSessionStore()
	a := newAdapter(t, cli, domain.AdapterConfig{Models: []string{"gpt-5.5"}}, agents)
	turn := func(prompt string) *domain.Usage {
		t.Helper()
		sink, err := run(t, a, domain.RunRequest{SessionID: "s1", Input: []byte(prompt)})
		if err != nil {
			t.Fatal(err)
		}
		return requireTerminal(t, sink, domain.EventComplete, "").Usage
	}
	for i := 1; i <= 2; i++ {
		if u := turn("go"); u.PromptTokens != 120 || u.CompletionTokens != 17 || u.TotalTokens != 137 || u.Model != "gpt-5.5" || u.StopReason != "completed" {
			t.Fatalf("turn %d usage = %+v", i, u)
		}
	}
	// A cancelled third run: codex's total would have grown by one turn.
	ctx, cancel := context.WithCancel(testContext(t))
	sink := &runtimetest.Sink{}
	done := make(chan error, 1)
	go func() {
		done <- a.Execute(ctx, domain.RunRequest{RunID: "r3", Adapter: "codex", SessionID: "s1", Input: []byte("hang")}, sink)
	}()
	if err := sink.WaitFor(testContext(t), func(evs []domain.RunEvent) bool { return len(evs) >= 2 }); err != nil {
		t.Fatal(err, sink.Types())
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run = %v", err)
	}
	s, _, _ := agents.GetAgentSession(context.Background(), "codex", "s1")
	if s.Turns != 2 || s.Totals != (domain.AgentTotals{Input: 240, Cached: 40, Output: 34}) {
		t.Fatalf("after the cancelled turn the session is %+v", s)
	}
	// Run 4 reports 4 turns' total: the difference includes the cancelled
	// turn's tokens, which codex did spend in the thread.
	if u := turn("go"); u.PromptTokens != 240 || u.CompletionTokens != 34 {
		t.Fatalf("turn after cancel usage = %+v", u)
	}
	list, _ := a.ListSessions(context.Background(), domain.SessionQuery{})
	if len(list) != 1 || list[0].Turns != 3 {
		t.Errorf("ListSessions = %+v, want 3 turns", list)
	}
	// Forgetting the session starts a new thread: its total is its own.
	if err := a.TerminateSession(context.Background(), "", "s1"); err != nil {
		t.Fatal(err)
	}
	// Forgotten, or never started, a session is not found.
	for _, s := range []string{"s1", "typo"} {
		if err := a.TerminateSession(context.Background(), "", s); !errors.Is(err, domain.ErrSessionNotFound) {
			t.Fatalf("terminating %s again: %v, want session_not_found", s, err)
		}
	}
	if u := turn("go"); u.PromptTokens != 600 {
		t.Fatalf("new session usage = %+v", u)
	}
}

// Codex starts with a clean environment: declared env and inherit_env
// reach it, the node's token and other keys do not.
func TestCleanEnvironment(t *testing.T) {
	t.Setenv("IOP_NODE_TOKEN", "node-secret-token")
	t.Setenv("ANTHROPIC_API_KEY", "sk-not-for-codex")
	t.Setenv("OPENAI_API_KEY", "sk-for-codex")
	cli, env := standin.EnvCLI(t, recorded)
	a := newAdapter(t, cli, domain.AdapterConfig{
		Env:        map[string]string{"CODEX_HOME": "/srv/codex-home"},
		InheritEnv: []string{"OPENAI_API_KEY"},
	}, nil)
	if _, err := run(t, a, domain.RunRequest{}); err != nil {
		t.Fatal(err)
	}
	standin.CheckEnv(t, env(), []string{"node-secret-token", "sk-not-for-codex"},
		[]string{"CODEX_HOME=/srv/codex-home\n", "OPENAI_API_KEY=sk-for-codex\n", "PATH="})
}

// A prompt longer than Linux allows one argument (128 KiB) starts the CLI:
// it goes on stdin, not in argv.
func TestLargePrompt(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	prompt := strings.Repeat("explain this code\n", 200<<10/18)
	sink, err := run(t, a, domain.RunRequest{Input: []byte(prompt)})
	if err != nil {
		t.Fatalf("err = %v (events %v)", err, sink.Types())
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if got := cli.Stdin(t); got != prompt {
		t.Errorf("stdin holds %d bytes, want the %d-byte prompt", len(got), len(prompt))
	}
}

// A CLI that reports the turn's end and then never exits ends its run with
// what it reported, and nothing of its group is left running.
func TestTurnEndThenNoExit(t *testing.T) {
	failed := standin.Lines(`{"type":"thread.started","thread_id":"`+threadID+`"}`,
		`{"type":"turn.failed","error":{"message":"stream disconnected before completion"}}`)
	for _, tc := range []struct {
		name, stream string
		typ          domain.EventType
		code         string
	}{
		{"completed", recorded, domain.EventComplete, ""},
		{"failed", failed, domain.EventError, domain.CodeRunFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := standin.WriteCLI(t, standin.Printf(tc.stream)+"exec sleep 3600\n")
			agents := memory.NewAgentSessionStore()
			a := newAdapter(t, cli, domain.AdapterConfig{}, agents)
			a.ExitGrace = 100 * time.Millisecond
			sink, err := run(t, a, domain.RunRequest{SessionID: "s1"})
			if err != nil {
				t.Fatal(err)
			}
			ev := requireTerminal(t, sink, tc.typ, tc.code)
			if tc.code != "" && ev.Error.Message != "stream disconnected before completion" {
				t.Errorf("error = %+v", ev.Error)
			}
			if !runtimetest.GroupGone(pidOf(t, sink.Events()), 5*time.Second) {
				t.Error("the process group is still running")
			}
			turns := 0
			if list, _ := a.ListSessions(context.Background(), domain.SessionQuery{}); len(list) == 1 {
				turns = list[0].Turns
			}
			if want := map[bool]int{true: 1, false: 0}[tc.typ == domain.EventComplete]; turns != want {
				t.Errorf("session turns = %d, want %d", turns, want)
			}
		})
	}
}

// A blank prompt is refused when the node admits the run, before it starts.
func TestAdmitRefusesABlankPrompt(t *testing.T) {
	a, err := codex.New(domain.AdapterConfig{Name: "codex"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	runtimetest.AdmitRefusesABlankPrompt(t, a)
}
