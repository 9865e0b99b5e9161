package gemini_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/adapters/runtime/gemini"
	"iop/adapters/runtime/internal/agent"
	"iop/adapters/runtime/internal/standin"
	"iop/adapters/runtime/runtimetest"
	"iop/adapters/store/memory"
	"iop/domain"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const sessionID = "dcb2f6cf-1192-4516-a867-a44bd9924a4e"

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// recorded is the stream-json of gemini-cli 0.61.0 for a prompt that used
// one tool, routed by the CLI (model "auto"), as captured against a stand-in.
var recorded = standin.Lines(
	`{"type":"init","timestamp":"2026-12-01T03:16:39.776Z","session_id":"`+sessionID+`","model":"auto"}`,
	`Ripgrep is not available. Falling back to GrepTool.`,
	`{"type":"message","timestamp":"2026-12-01T03:16:39.799Z","role":"user","content":"list it"}`,
	`{"type":"tool_use","timestamp":"2026-12-01T03:18:19.577Z","tool_name":"run_shell_command","tool_id":"run_shell_command_1","parameters":{"command":"ls"}}`,
	`{"type":"tool_result","timestamp":"2026-12-01T03:18:20.005Z","tool_id":"run_shell_command_1","status":"success","output":"a.go\nb.go"}`,
	`{"type":"error","timestamp":"2026-12-01T03:18:20.100Z","severity":"warning","message":"Loop detected, stopping"}`,
	`{"type":"message","timestamp":"2026-12-01T03:16:40.249Z","role":"assistant","content":"Two fi","delta":true}`,
	`{"type":"some_future_type","x":1}`,
	`{"type":"message","timestamp":"2026-12-01T03:16:40.280Z","role":"assistant","content":"les ✓","delta":true}`,
	`{"type":"result","timestamp":"2026-12-01T03:16:40.679Z","status":"success","stats":{"total_tokens":177,"input_tokens":157,"output_tokens":20,"cached":30,"input":127,"duration_ms":903,"tool_calls":1,"models":{"gemini-3.5-flash-lite":{"total_tokens":10,"input_tokens":7,"output_tokens":3,"cached":0,"input":7},"gemini-3.8-flash":{"total_tokens":167,"input_tokens":150,"output_tokens":17,"cached":30,"input":120}}}}`,
)

func newAdapter(t *testing.T, cli standin.CLI, cfg domain.AdapterConfig, agents *memory.AgentSessionStore) *gemini.Adapter {
	t.Helper()
	cfg.Name, cfg.Type, cfg.Command = "gemini", domain.AdapterGemini, cli.Path
	var a *gemini.Adapter
	var err error
	if agents == nil {
		a, err = gemini.New(cfg, nil)
	} else {
		a, err = gemini.New(cfg, agents)
	}
	if err != nil {
		t.Fatal(err)
	}
	a.KillGrace = 200 * time.Millisecond
	return a
}

func run(t *testing.T, a *gemini.Adapter, req domain.RunRequest) *runtimetest.Sink {
	t.Helper()
	req.RunID, req.Adapter = "r1", "gemini"
	if req.Input == nil {
		req.Input = []byte("list it")
	}
	sink := &runtimetest.Sink{}
	if err := a.Execute(testContext(t), req, sink); err != nil {
		t.Fatal(err)
	}
	return sink
}

func requireTerminal(t *testing.T, sink *runtimetest.Sink, typ domain.EventType, code string) domain.RunEvent {
	t.Helper()
	events := sink.Events()
	if len(events) == 0 {
		t.Fatal("no events")
	}
	last := events[len(events)-1]
	if last.Type != typ || (code != "" && (last.Error == nil || last.Error.Code != code)) {
		t.Fatalf("last event = %+v %+v, want %s %s (events %v)", last, last.Error, typ, code, sink.Types())
	}
	for _, ev := range events[:len(events)-1] {
		if ev.Type.Terminal() {
			t.Fatalf("terminal event before the end: %v", sink.Types())
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
		case domain.EventMetadata:
			if strings.HasPrefix(string(ev.Metadata), `{"pid":`) {
				out = append(out, "m:pid")
			} else if strings.HasPrefix(string(ev.Metadata), `{"stats":`) {
				out = append(out, "m:stats")
			} else {
				out = append(out, "m:"+string(ev.Metadata))
			}
		default:
			out = append(out, string(ev.Type))
		}
	}
	return out
}

func TestStreamJSONMapping(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink := run(t, a, domain.RunRequest{})
	done := requireTerminal(t, sink, domain.EventComplete, "")
	want := []string{
		"m:pid",
		`m:{"agent_session_id":"` + sessionID + `"}`,
		`m:{"tool_use":{"id":"run_shell_command_1","input":{"command":"ls"},"name":"run_shell_command"}}`,
		`m:{"tool_result":{"content":"a.go\nb.go","is_error":false,"tool_use_id":"run_shell_command_1","truncated":false}}`,
		`m:{"error":"Loop detected, stopping"}`,
		"d:Two fi",
		"d:les ✓",
		"m:stats",
		"complete",
	}
	if got := summary(sink.Events()); !slices.Equal(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	wantUsage := domain.Usage{PromptTokens: 157, CompletionTokens: 20, TotalTokens: 177, DurationMS: 903, StopReason: "success", Model: "gemini-3.8-flash"}
	if done.Usage == nil || *done.Usage != wantUsage {
		t.Errorf("usage = %+v, want %+v", done.Usage, wantUsage)
	}
}

func TestArgvResumeAndDashPrompt(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded))
	agents := memory.NewAgentSessionStore()
	a := newAdapter(t, cli, domain.AdapterConfig{Args: []string{"--approval-mode=auto_edit"}, Models: []string{"gemini-2.5-pro"}}, agents)
	for i := 0; i < 2; i++ {
		requireTerminal(t, run(t, a, domain.RunRequest{SessionID: "s1", Input: []byte("-v is a prompt\nline 2")}), domain.EventComplete, "")
	}
	if err := a.TerminateSession(context.Background(), "", "s1"); err != nil {
		t.Fatal(err)
	}
	run(t, a, domain.RunRequest{SessionID: "s1", Target: "gemini-flash", Input: []byte("x")})
	want := [][]string{
		{"--output-format", "stream-json", "--model=gemini-2.5-pro", "--approval-mode=auto_edit"},
		{"--output-format", "stream-json", "--model=gemini-2.5-pro", "--resume=" + sessionID, "--approval-mode=auto_edit"},
		{"--output-format", "stream-json", "--model=gemini-flash", "--approval-mode=auto_edit"},
	}
	runs := cli.Runs(t)
	if len(runs) != len(want) {
		t.Fatalf("%d runs: %q", len(runs), runs)
	}
	for i := range want {
		if !slices.Equal(runs[i], want[i]) {
			t.Errorf("run %d argv = %q, want %q", i+1, runs[i], want[i])
		}
	}
	if got := cli.Stdin(t); got != "x" {
		t.Errorf("stdin of the last run = %q, want its prompt", got)
	}
	list, err := a.ListSessions(context.Background(), domain.SessionQuery{})
	if err != nil || len(list) != 1 || list[0].AgentSessionID != sessionID || list[0].Turns != 1 || list[0].Target != "gemini-flash" {
		t.Errorf("ListSessions = %+v, %v", list, err)
	}
}

func TestFailures(t *testing.T) {
	init := `{"type":"init","session_id":"` + sessionID + `","model":"gemini-2.5-pro"}` + "\n"
	cases := []struct {
		name, body, code, message string
	}{
		{"API error result", standin.Printf(init+`{"type":"result","status":"error","error":{"type":"unknown","message":"[API Error: {\"error\":{\"code\":400,\"message\":\"API key not valid.\"}}]"},"stats":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"duration_ms":0,"models":{}}}`+"\n") + "exit 1",
			domain.CodeProviderError, `[API Error: {"error":{"code":400,"message":"API key not valid."}}]`},
		// The CLI words its own errors as API errors too; their type is
		// the CLI's error class (gemini-cli 0.61.0, prompt "/quit").
		{"CLI error worded as an API error", standin.Printf(init+`{"type":"result","timestamp":"2026-12-02T12:40:44.032Z","status":"error","error":{"type":"FatalInputError","message":"[API Error: Exiting due to command result that is not supported in non-interactive mode.]"},"stats":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0,"duration_ms":0,"tool_calls":0,"models":{}}}`+"\n") + "exit 42",
			domain.CodeRunFailed, "[API Error: Exiting due to command result that is not supported in non-interactive mode.]"},
		{"fatal error line then exit", standin.Printf(init+`{"type":"error","severity":"error","message":"Maximum session turns exceeded"}`+"\n") + "exit 53",
			domain.CodeRunFailed, "Maximum session turns exceeded"},
		{"non-zero exit", "echo 'Unknown argument: bogus' >&2\nexit 42", domain.CodeRunFailed, "gemini: exit status 42: Unknown argument: bogus"},
		// An invalid stream (empty answer, safety block): the reason is on
		// the error line, the result line has no error of its own.
		{"invalid stream", standin.Printf(init + `{"type":"error","timestamp":"t","severity":"error","message":"Model stream ended with empty response text."}` + "\n" +
			`{"type":"result","timestamp":"t","status":"error","stats":{"total_tokens":5,"input_tokens":5,"output_tokens":0,"duration_ms":3,"models":{"gemini-2.5-pro":{}}}}` + "\n"),
			domain.CodeRunFailed, "Model stream ended with empty response text."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli := standin.WriteCLI(t, tc.body)
			sink := run(t, newAdapter(t, cli, domain.AdapterConfig{}, nil), domain.RunRequest{})
			ev := requireTerminal(t, sink, domain.EventError, tc.code)
			if ev.Error.Message != tc.message || sink.Text() != "" {
				t.Errorf("message = %q, want %q (text %q)", ev.Error.Message, tc.message, sink.Text())
			}
		})
	}
}

func TestCancelKillsTheProcessGroup(t *testing.T) {
	cli := standin.WriteCLI(t, "trap '' TERM\n"+standin.Printf(`{"type":"init","session_id":"x","model":"auto"}`+"\n")+"sleep 60 &\nsleep 60\n")
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	ctx, cancel := context.WithCancel(testContext(t))
	sink := &runtimetest.Sink{}
	exited := make(chan error, 1)
	go func() {
		exited <- a.Execute(ctx, domain.RunRequest{RunID: "r1", Adapter: "gemini", Input: []byte("go")}, sink)
	}()
	if err := sink.WaitFor(testContext(t), func(evs []domain.RunEvent) bool { return len(evs) >= 2 }); err != nil {
		cancel()
		t.Fatal(err)
	}
	var m struct{ PID int }
	if err := json.Unmarshal(sink.Events()[0].Metadata, &m); err != nil || m.PID == 0 {
		t.Fatalf("first event %s", sink.Events()[0].Metadata)
	}
	cancel()
	if err := <-exited; !errors.Is(err, context.Canceled) {
		t.Fatalf("Execute = %v, want context.Canceled", err)
	}
	if !runtimetest.GroupGone(m.PID, 5*time.Second) {
		t.Fatalf("process group %d is still running", m.PID)
	}
	if _, ok := sink.Terminal(); ok {
		t.Errorf("terminal event after cancel: %v", sink.Types())
	}
}

// The CLI gets a clean environment: env and inherit_env, nothing else of
// the node's.
func TestEnvAndInheritEnv(t *testing.T) {
	t.Setenv("GEMINI_TEST_KEY", "k-123")
	t.Setenv("IOP_NODE_TOKEN", "node-secret")
	cli, env := standin.EnvCLI(t, recorded)
	a := newAdapter(t, cli, domain.AdapterConfig{Env: map[string]string{"GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9"}, InheritEnv: []string{"GEMINI_TEST_KEY"}}, nil)
	requireTerminal(t, run(t, a, domain.RunRequest{}), domain.EventComplete, "")
	standin.CheckEnv(t, env(), []string{"node-secret"}, []string{"GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:9\n", "GEMINI_TEST_KEY=k-123\n"})
}

// A prompt longer than Linux allows one argument (128 KiB) starts the CLI:
// it goes on stdin, not in argv.
func TestLargePrompt(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	prompt := strings.Repeat("explain this code\n", 200<<10/18)
	requireTerminal(t, run(t, a, domain.RunRequest{Input: []byte(prompt)}), domain.EventComplete, "")
	if got := cli.Stdin(t); got != prompt {
		t.Errorf("stdin holds %d bytes, want the %d-byte prompt", len(got), len(prompt))
	}
}

// A failed tool reports its reason in "error", with no output: the reason
// is the result's content.
func TestToolErrorMessageIsKept(t *testing.T) {
	out := standin.Lines(
		`{"type":"init","timestamp":"t","session_id":"`+sessionID+`","model":"gemini-2.5-pro"}`,
		`{"type":"tool_use","timestamp":"t","tool_name":"read_file","tool_id":"rf_1","parameters":{"absolute_path":"/nope"}}`,
		`{"type":"tool_result","timestamp":"t","tool_id":"rf_1","status":"error","error":{"type":"file_not_found","message":"File not found: /nope"}}`,
		`{"type":"result","timestamp":"t","status":"success","stats":{"total_tokens":3,"input_tokens":2,"output_tokens":1,"duration_ms":5}}`,
	)
	cli := standin.WriteCLI(t, standin.Printf(out))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	got := strings.Join(summary(run(t, a, domain.RunRequest{}).Events()), "\n")
	if !strings.Contains(got, `"content":"File not found: /nope","is_error":true`) {
		t.Fatalf("the tool's error message is lost:\n%s", got)
	}
}

// The model's thinking is output the API bills, which the CLI's
// output_tokens leaves out and total_tokens counts: the completion is all
// that is not prompt (stats of gemini-cli 0.61.0 for a reply that thought
// 40 tokens and answered in 10).
func TestThinkingCountsAsCompletion(t *testing.T) {
	out := standin.Lines(
		`{"type":"init","timestamp":"t","session_id":"`+sessionID+`","model":"gemini-2.5-pro"}`,
		`{"type":"message","timestamp":"t","role":"assistant","content":"Answer.","delta":true}`,
		`{"type":"result","timestamp":"t","status":"success","stats":{"total_tokens":150,"input_tokens":100,"output_tokens":10,"cached":0,"input":100,"duration_ms":711,"tool_calls":0,"models":{"gemini-2.5-pro":{"total_tokens":150,"input_tokens":100,"output_tokens":10,"cached":0,"input":100}}}}`,
	)
	cli := standin.WriteCLI(t, standin.Printf(out))
	ev := requireTerminal(t, run(t, newAdapter(t, cli, domain.AdapterConfig{}, nil), domain.RunRequest{}), domain.EventComplete, "")
	want := domain.Usage{PromptTokens: 100, CompletionTokens: 50, TotalTokens: 150, DurationMS: 711, StopReason: "success", Model: "gemini-2.5-pro"}
	if ev.Usage == nil || *ev.Usage != want {
		t.Errorf("usage = %+v, want %+v", ev.Usage, want)
	}
}

// A CLI that prints its result and then never exits ends its run with that
// result, its session turn counted, and nothing of its group left.
func TestResultThenNoExit(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(recorded)+"exec sleep 3600\n")
	agents := memory.NewAgentSessionStore()
	a := newAdapter(t, cli, domain.AdapterConfig{}, agents)
	a.ExitGrace = 100 * time.Millisecond
	sink := run(t, a, domain.RunRequest{SessionID: "s1"})
	ev := requireTerminal(t, sink, domain.EventComplete, "")
	if ev.Usage == nil || ev.Usage.PromptTokens != 157 {
		t.Errorf("usage = %+v", ev.Usage)
	}
	var m struct{ PID int }
	_ = json.Unmarshal(sink.Events()[0].Metadata, &m)
	if !runtimetest.GroupGone(m.PID, 5*time.Second) {
		t.Errorf("process group %d is still running", m.PID)
	}
	if list, err := a.ListSessions(context.Background(), domain.SessionQuery{}); err != nil || len(list) != 1 || list[0].Turns != 1 {
		t.Errorf("ListSessions = %+v, %v; want the turn counted", list, err)
	}
}

// A blank prompt is refused when the node admits the run, before it starts.
func TestAdmitRefusesABlankPrompt(t *testing.T) {
	a, err := gemini.New(domain.AdapterConfig{Name: "gemini"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	runtimetest.AdmitRefusesABlankPrompt(t, a)
}

// A turn the API fails before the model answered anything leaves the CLI's
// session without a turn (gemini-cli 0.61.0 drops it from the history) and
// the CLI refuses to resume it: the session's next run starts a new one.
// Once the model has answered (text, a tool call), the session is kept
// even if the turn then fails.
func TestSessionKeptOnlyOnceResumable(t *testing.T) {
	init := `{"type":"init","timestamp":"2026-12-02T12:45:09.120Z","session_id":"` + sessionID + `","model":"gemini-2.5-pro"}` + "\n" +
		`{"type":"message","timestamp":"2026-12-02T12:45:09.196Z","role":"user","content":"turn 0"}` + "\n"
	failed := `{"type":"result","timestamp":"2026-12-02T12:45:09.260Z","status":"error","error":{"type":"unknown","message":"[API Error: {\"error\":{\"code\":401,\"message\":\"stand-in: bad key\",\"status\":\"UNAUTHENTICATED\"}}]"},"stats":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0,"duration_ms":0,"tool_calls":0,"models":{}}}` + "\n"
	tool := `{"type":"tool_use","timestamp":"2026-12-02T12:45:30.183Z","tool_name":"list_directory","tool_id":"list_directory_1","parameters":{"dir_path":"."}}` + "\n"
	for _, tc := range []struct {
		name, out string
		kept      bool
	}{
		{"API error before any answer", init + failed, false},
		{"API error after a tool call", init + tool + failed, true},
		{"answer", init + `{"type":"message","role":"assistant","content":"ok","delta":true}` + "\n" + `{"type":"result","status":"success","stats":{"total_tokens":2,"input_tokens":1,"output_tokens":1}}` + "\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := standin.WriteCLI(t, standin.Printf(tc.out)+"exit 1")
			a := newAdapter(t, cli, domain.AdapterConfig{}, memory.NewAgentSessionStore())
			for range 2 {
				sink := run(t, a, domain.RunRequest{SessionID: "s1"})
				if !slices.Contains(summary(sink.Events()), `m:{"agent_session_id":"`+sessionID+`"}`) {
					t.Errorf("the agent session id was not reported: %v", summary(sink.Events()))
				}
			}
			runs := cli.Runs(t)
			if resumed := slices.Contains(runs[1], "--resume="+sessionID); resumed != tc.kept {
				t.Errorf("second run argv = %q, want a resume: %v", runs[1], tc.kept)
			}
			list, err := a.ListSessions(context.Background(), domain.SessionQuery{})
			if err != nil || (len(list) == 1) != tc.kept {
				t.Errorf("ListSessions = %+v, %v; want the session kept: %v", list, err, tc.kept)
			}
		})
	}
}

// The model's text before a tool call and its answer after it are two
// blocks, separated by a blank line (gemini-cli 0.61.0 streams them as one
// run of deltas).
func TestTextAroundAToolIsSeparated(t *testing.T) {
	cli := standin.WriteCLI(t, standin.Printf(standin.Lines(
		`{"type":"init","timestamp":"2026-12-02T12:49:35.487Z","session_id":"`+sessionID+`","model":"gemini-2.5-pro"}`,
		`{"type":"message","timestamp":"2026-12-02T12:49:35.489Z","role":"user","content":"look"}`,
		`{"type":"message","timestamp":"2026-12-02T12:49:35.521Z","role":"assistant","content":"Let ","delta":true}`,
		`{"type":"message","timestamp":"2026-12-02T12:49:35.523Z","role":"assistant","content":"me look.","delta":true}`,
		`{"type":"tool_use","timestamp":"2026-12-02T12:49:35.558Z","tool_name":"list_directory","tool_id":"list_directory_1","parameters":{"dir_path":"."}}`,
		`{"type":"tool_result","timestamp":"2026-12-02T12:49:35.599Z","tool_id":"list_directory_1","status":"success","output":"Directory is empty."}`,
		`{"type":"message","timestamp":"2026-12-02T12:49:35.616Z","role":"assistant","content":"Ther","delta":true}`,
		`{"type":"message","timestamp":"2026-12-02T12:49:35.617Z","role":"assistant","content":"e is nothing here.","delta":true}`,
		`{"type":"tool_use","timestamp":"2026-12-02T12:49:35.620Z","tool_name":"list_directory","tool_id":"list_directory_2","parameters":{"dir_path":"."}}`,
		`{"type":"tool_result","timestamp":"2026-12-02T12:49:35.630Z","tool_id":"list_directory_2","status":"success","output":"Directory is empty."}`,
		`{"type":"message","timestamp":"2026-12-02T12:49:35.640Z","role":"assistant","content":"Still nothing.","delta":true}`,
		`{"type":"result","timestamp":"2026-12-02T12:49:35.650Z","status":"success","stats":{"total_tokens":121,"input_tokens":110,"output_tokens":11,"duration_ms":134,"models":{"gemini-2.5-pro":{}}}}`,
	)))
	sink := run(t, newAdapter(t, cli, domain.AdapterConfig{}, nil), domain.RunRequest{})
	requireTerminal(t, sink, domain.EventComplete, "")
	if got, want := sink.Text(), "Let me look.\n\nThere is nothing here.\n\nStill nothing."; got != want {
		t.Errorf("text = %q, want %q", got, want)
	}
}

// recordedRetries is what gemini-cli 0.61.0 wrote on stderr when the model
// API answered 429, then 503 (captured against the stand-in), then the
// CLI's other wordings of a retried call (its retryWithBackoff and
// logRetryAttempt).
var recordedRetries = standin.Lines(
	`Warning: 256-color support not detected. Using a terminal with at least 256-color support is recommended for a better visual experience.`,
	`Ripgrep is not available. Falling back to GrepTool.`,
	`Attempt 1 failed with status 429. Retrying with backoff... _ApiError: {"error":{"code":429,"message":"stand-in: slow down","status":"RESOURCE_EXHAUSTED"}}`,
	`    at throwErrorIfNotOK (file:///root/.cache/iop/agent-clis/gemini-cli-0.61.0/node_modules/@google/gemini-cli/bundle/chunk-JDPZ4CE3.js:267833:24)`,
	`    at process.processTicksAndRejections (node:internal/process/task_queues:95:5)`,
	`    at async retryWithBackoff (file:///root/.cache/iop/agent-clis/gemini-cli-0.61.0/node_modules/@google/gemini-cli/bundle/chunk-JDPZ4CE3.js:308039:23)`,
	`    at async Turn.run (file:///root/.cache/iop/agent-clis/gemini-cli-0.61.0/node_modules/@google/gemini-cli/bundle/chunk-JDPZ4CE3.js:333001:24) {`,
	`  status: 429`,
	`}`,
	`Attempt 2 failed with status 503. Retrying with backoff... _ApiError: {"error":{"code":503,"message":"stand-in: busy","status":"UNAVAILABLE"}}`,
	`    at throwErrorIfNotOK (file:///root/.cache/iop/agent-clis/gemini-cli-0.61.0/node_modules/@google/gemini-cli/bundle/chunk-JDPZ4CE3.js:267833:24)`,
	`  status: 503`,
	`}`,
	`Attempt 3 failed: Quota exceeded for metric generate_content_requests. Retrying after 1532ms...`,
	`Attempt 4 failed with 429 error (no Retry-After header). Retrying with backoff... Error: got 429`,
	`Attempt 5 failed with 5xx error. Retrying with backoff...`,
	`Attempt 6 failed. Retrying with backoff... TypeError: fetch failed`,
	`Attempt 7 failed with status 429. Max attempts reached`,
)

// The CLI's retries, told only on stderr, are sent as they come, while its
// stdout is silent: the CLI here goes on only once the run has sent them.
func TestRetriesOnStderrAreMetadata(t *testing.T) {
	init := `{"type":"init","session_id":"` + sessionID + `","model":"gemini-2.5-pro"}` + "\n"
	answer := `{"type":"message","role":"assistant","content":"After the wait.","delta":true}` + "\n" +
		`{"type":"result","status":"success","stats":{"total_tokens":5,"input_tokens":3,"output_tokens":2,"duration_ms":3,"models":{"gemini-2.5-pro":{}}}}` + "\n"
	goOn := filepath.Join(t.TempDir(), "go")
	cli := standin.WriteCLI(t, standin.Printf(init)+
		"printf '%s' "+standin.Quote(recordedRetries)+" >&2\n"+
		"while [ ! -e "+standin.Quote(goOn)+" ]; do sleep 0.02; done\n"+
		standin.Printf(answer))
	a := newAdapter(t, cli, domain.AdapterConfig{}, nil)
	sink := &runtimetest.Sink{}
	ctx := testContext(t)
	done := make(chan error, 1)
	go func() {
		done <- a.Execute(ctx, domain.RunRequest{RunID: "r1", Adapter: "gemini", Input: []byte("say something")}, sink)
	}()
	retries := func(events []domain.RunEvent) []string {
		var out []string
		for _, ev := range events {
			if ev.Type == domain.EventMetadata && strings.HasPrefix(string(ev.Metadata), `{"api_retry":`) {
				out = append(out, string(ev.Metadata))
			}
		}
		return out
	}
	waitErr := sink.WaitFor(ctx, func(events []domain.RunEvent) bool { return len(retries(events)) >= 6 })
	if err := os.WriteFile(goOn, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if waitErr != nil {
		t.Fatalf("the retries were not sent while the CLI waited: %v", summary(sink.Events()))
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	want := []string{
		`{"api_retry":{"attempt":1,"max_retries":null,"retry_delay_ms":null,"error_status":429,"error":"stand-in: slow down"}}`,
		`{"api_retry":{"attempt":2,"max_retries":null,"retry_delay_ms":null,"error_status":503,"error":"stand-in: busy"}}`,
		`{"api_retry":{"attempt":3,"max_retries":null,"retry_delay_ms":1532,"error_status":null,"error":"Quota exceeded for metric generate_content_requests"}}`,
		`{"api_retry":{"attempt":4,"max_retries":null,"retry_delay_ms":null,"error_status":429,"error":"Error: got 429"}}`,
		`{"api_retry":{"attempt":5,"max_retries":null,"retry_delay_ms":null,"error_status":null,"error":"5xx error"}}`,
		`{"api_retry":{"attempt":6,"max_retries":null,"retry_delay_ms":null,"error_status":null,"error":"TypeError: fetch failed"}}`,
	}
	if got := retries(sink.Events()); !slices.Equal(got, want) {
		t.Errorf("api_retry metadata:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// All of them before the answer that came after.
	s := summary(sink.Events())
	if i := slices.Index(s, "d:After the wait."); i < 0 || slices.IndexFunc(s[i:], func(e string) bool { return strings.Contains(e, "api_retry") }) >= 0 {
		t.Errorf("events: %v", s)
	}
}

// A CLI that retries without end sends agent.MaxNotices api_retry events at
// most.
func TestRetryNoticesAreBounded(t *testing.T) {
	init := `{"type":"init","session_id":"` + sessionID + `","model":"gemini-2.5-pro"}` + "\n"
	result := `{"type":"result","status":"success","stats":{"total_tokens":5,"input_tokens":3,"output_tokens":2,"duration_ms":3,"models":{}}}` + "\n"
	n := agent.MaxNotices + 50
	cli := standin.WriteCLI(t, standin.Printf(init)+
		fmt.Sprintf("i=1; while [ $i -le %d ]; do echo \"Attempt $i failed with status 429. Retrying with backoff...\" >&2; i=$((i+1)); sleep 0.005; done\n", n)+
		standin.Printf(result))
	sink := run(t, newAdapter(t, cli, domain.AdapterConfig{}, nil), domain.RunRequest{})
	requireTerminal(t, sink, domain.EventComplete, "")
	count := 0
	for _, ev := range sink.Events() {
		if strings.HasPrefix(string(ev.Metadata), `{"api_retry":`) {
			count++
		}
	}
	if count == 0 || count > agent.MaxNotices {
		t.Errorf("%d api_retry events for %d notices, want 1 to %d", count, n, agent.MaxNotices)
	}
}

// A CLI that ends its stdout before it exits still has every retry notice
// it writes afterwards sent as it comes: the runner reads notices until the
// CLI exits, not only the queue's last ones once it has.
func TestRetryNoticesAfterStdoutEnds(t *testing.T) {
	init := `{"type":"init","session_id":"` + sessionID + `","model":"gemini-2.5-pro"}` + "\n"
	result := `{"type":"result","status":"success","stats":{"total_tokens":5,"input_tokens":3,"output_tokens":2,"duration_ms":3,"models":{}}}` + "\n"
	const n = 40
	cli := standin.WriteCLI(t, standin.Printf(init)+standin.Printf(result)+"exec 1>&-\n"+
		fmt.Sprintf("i=1; while [ $i -le %d ]; do echo \"Attempt $i failed with status 429. Retrying with backoff...\" >&2; i=$((i+1)); sleep 0.005; done\n", n))
	sink := run(t, newAdapter(t, cli, domain.AdapterConfig{}, nil), domain.RunRequest{})
	requireTerminal(t, sink, domain.EventComplete, "")
	count := 0
	for _, ev := range sink.Events() {
		if strings.HasPrefix(string(ev.Metadata), `{"api_retry":`) {
			count++
		}
	}
	if count != n {
		t.Errorf("%d api_retry events for %d notices written after stdout ended", count, n)
	}
}

// A CLI that no longer has the conversation a session resumes (its HOME or
// work_dir changed) fails every later run of the session in its own words:
// the run's error says what was resumed and how to start afresh. A run that
// failed after the model answered gets no such hint.
func TestLostConversationSaysHowToStartAfresh(t *testing.T) {
	answer := `{"type":"init","session_id":"` + sessionID + `","model":"gemini-2.5-pro"}` + "\n" +
		`{"type":"message","role":"assistant","content":"ok","delta":true}` + "\n" +
		`{"type":"result","status":"success","stats":{"total_tokens":2,"input_tokens":1,"output_tokens":1}}` + "\n"
	cli := standin.WriteCLI(t, `case "$*" in *--resume=*) echo 'Error resuming session: No previous sessions found for this project.' >&2; exit 42;; esac
`+standin.Printf(answer))
	a := newAdapter(t, cli, domain.AdapterConfig{}, memory.NewAgentSessionStore())
	requireTerminal(t, run(t, a, domain.RunRequest{SessionID: "s1"}), domain.EventComplete, "")
	for range 2 {
		ev := requireTerminal(t, run(t, a, domain.RunRequest{SessionID: "s1"}), domain.EventError, domain.CodeRunFailed)
		msg := ev.Error.Message
		for _, want := range []string{"No previous sessions found", "resumed gemini's conversation " + sessionID + ` for session "s1"`,
			"DELETE /v1/sessions/s1?adapter=gemini", "iop session end s1 --adapter gemini"} {
			if !strings.Contains(msg, want) {
				t.Errorf("error %q does not say %q", msg, want)
			}
		}
	}

	// However long the CLI's own message, the node's cut of it keeps the
	// way out.
	long := standin.WriteCLI(t, `case "$*" in *--resume=*) echo '{"type":"result","status":"error","error":{"type":"unknown","message":"`+strings.Repeat("x", 20<<10)+`"}}'; exit 1;; esac
`+standin.Printf(answer))
	c := newAdapter(t, long, domain.AdapterConfig{}, memory.NewAgentSessionStore())
	run(t, c, domain.RunRequest{SessionID: "s1"})
	ev := requireTerminal(t, run(t, c, domain.RunRequest{SessionID: "s1"}), domain.EventError, "")
	if msg := domain.ClipMessage(ev.Error.Message, domain.MaxPeerMessage); !strings.Contains(msg, "xxx") || !strings.HasSuffix(msg, "and run again)") {
		t.Errorf("a 20 KiB message cut as the node cuts it lost its head or the way out: …%s", msg[max(0, len(msg)-300):])
	}

	// A resumed run that used a tool had its conversation: a failure after
	// it gets no hint either.
	tooled := standin.WriteCLI(t, standin.Printf(`{"type":"init","session_id":"`+sessionID+`"}`+"\n"+
		`{"type":"tool_use","tool_name":"list_directory","tool_id":"t1","parameters":{"dir_path":"."}}`+"\n")+"exit 1")
	d := newAdapter(t, tooled, domain.AdapterConfig{}, memory.NewAgentSessionStore())
	run(t, d, domain.RunRequest{SessionID: "s1"})
	if ev := requireTerminal(t, run(t, d, domain.RunRequest{SessionID: "s1"}), domain.EventError, ""); strings.Contains(ev.Error.Message, "end the session") {
		t.Errorf("a resumed run that used a tool before failing got the lost-conversation hint: %q", ev.Error.Message)
	}
	if runs := tooled.Runs(t); !slices.Contains(runs[1], "--resume="+sessionID) {
		t.Fatalf("second run argv = %q, want a resume", runs[1])
	}

	spoke := standin.WriteCLI(t, standin.Printf(`{"type":"init","session_id":"`+sessionID+`"}`+"\n"+`{"type":"message","role":"assistant","content":"half","delta":true}`+"\n")+"exit 1")
	b := newAdapter(t, spoke, domain.AdapterConfig{}, memory.NewAgentSessionStore())
	run(t, b, domain.RunRequest{SessionID: "s1"})
	ev = requireTerminal(t, run(t, b, domain.RunRequest{SessionID: "s1"}), domain.EventError, domain.CodeRunFailed)
	if runs := spoke.Runs(t); !slices.Contains(runs[1], "--resume="+sessionID) {
		t.Fatalf("second run argv = %q, want a resume", runs[1])
	}
	if strings.Contains(ev.Error.Message, "end the session") {
		t.Errorf("a resumed run that answered before failing got the lost-conversation hint: %q", ev.Error.Message)
	}
}
