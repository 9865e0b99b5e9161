package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/adapters/runtime/runtimetest"
	"iop/test/agentcli"
	"iop/test/standin"
	"iop/test/standin/anthropic"
	"iop/test/standin/gemini"
	"iop/test/standin/responses"
)

// The real claude, codex and gemini CLIs (installed by `make agent-clis`),
// run by a real iop-node through its claude-code, codex and gemini
// adapters, each pointed at a Go stand-in of its vendor's model API on
// loopback (test/standin). Every CLI gets a clean environment: the
// adapter's env holds its stand-in's base URL, a temporary HOME and every
// quiet/offline setting, with every other endpoint and an HTTP proxy on a
// closed loopback port (test/agentcli), so nothing can leave the machine.

// agentAdapter is one CLI adapter of the test node.
type agentAdapter struct {
	name, typ, command string
	args, models       []string
	env                agentcli.Env
	workDir            string
}

func (a agentAdapter) yaml() string {
	j := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	s := fmt.Sprintf("\n      - name: %s\n        type: %s\n        command: %s\n        work_dir: %s\n        env: %s",
		a.name, a.typ, j(a.command), j(a.workDir), j(a.env))
	if len(a.args) > 0 {
		s += "\n        args: " + j(a.args)
	}
	if len(a.models) > 0 {
		s += "\n        models: " + j(a.models)
	}
	return s
}

// agentEdge starts an edge and node n1 with the given adapters.
func agentEdge(t *testing.T, adapters ...agentAdapter) *edge {
	t.Helper()
	nodes := fmt.Sprintf("\n  - id: n1\n    token: %s\n    adapters:", testToken)
	for _, a := range adapters {
		nodes += a.yaml()
	}
	e := startEdge(t, nodes+"\n")
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	return e
}

// workDir is a project directory for a CLI, with one file in it.
func workDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.WriteFile(filepath.Join(d, "hello.txt"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// agentEvent is a run event with everything these tests look at.
type agentEvent struct {
	RunID    string          `json:"run_id"`
	Seq      uint64          `json:"seq"`
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	Metadata json.RawMessage `json:"metadata"`
	Usage    *struct {
		PromptTokens     int64   `json:"prompt_tokens"`
		CompletionTokens int64   `json:"completion_tokens"`
		TotalTokens      int64   `json:"total_tokens"`
		CostUSD          float64 `json:"cost_usd"`
		Model            string  `json:"model"`
		StopReason       string  `json:"stop_reason"`
	} `json:"usage"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

type agentRun []agentEvent

// agentTurn runs one prompt to its end.
func agentTurn(t *testing.T, e *edge, adapter, session, input string) agentRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	body := map[string]any{"node": "n1", "adapter": adapter, "input": input}
	if session != "" {
		body["session_id"] = session
	}
	resp := startRun(t, ctx, e, body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("run: status %d", resp.StatusCode)
	}
	var run agentRun
	r := newSSE(resp.Body)
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		var ae agentEvent
		if err := json.Unmarshal([]byte(ev.Data), &ae); err != nil {
			t.Fatalf("event %q: %v", ev.Data, err)
		}
		run = append(run, ae)
	}
	terminals := 0
	for i, ev := range run {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
		if ev.Type == "complete" || ev.Type == "error" || ev.Type == "cancelled" {
			terminals++
		}
	}
	if terminals != 1 || len(run) == 0 {
		t.Fatalf("%d terminal events in %s", terminals, run)
	}
	return run
}

func (r agentRun) String() string {
	var b strings.Builder
	for _, ev := range r {
		fmt.Fprintf(&b, "\n  %s %q %s", ev.Type, ev.Text, ev.Metadata)
		if ev.Error != nil {
			fmt.Fprintf(&b, " %+v", *ev.Error)
		}
	}
	return b.String()
}

func (r agentRun) last() agentEvent { return r[len(r)-1] }

func (r agentRun) text(typ string) string {
	var b strings.Builder
	for _, ev := range r {
		if ev.Type == typ {
			b.WriteString(ev.Text)
		}
	}
	return b.String()
}

func (r agentRun) count(typ string) int {
	n := 0
	for _, ev := range r {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// meta returns the values of key in the run's metadata events.
func (r agentRun) meta(key string) []json.RawMessage {
	var out []json.RawMessage
	for _, ev := range r {
		var m map[string]json.RawMessage
		if ev.Type == "metadata" && json.Unmarshal(ev.Metadata, &m) == nil && m[key] != nil {
			out = append(out, m[key])
		}
	}
	return out
}

// complete checks the run completed and returns its terminal event.
func (r agentRun) complete(t *testing.T) agentEvent {
	t.Helper()
	if last := r.last(); last.Type != "complete" || last.Usage == nil {
		t.Fatalf("run did not complete with usage: %s", r)
	}
	return r.last()
}

// oneError checks the run ended with exactly one error event, no delta.
func (r agentRun) oneError(t *testing.T, code string) {
	t.Helper()
	if r.count("error") != 1 || r.last().Type != "error" || r.last().Error.Code != code || r.count("delta") != 0 {
		t.Fatalf("want one %s error and no delta: %s", code, r)
	}
}

// nodeCommand runs a node command and decodes its result.
func nodeCommand(t *testing.T, e *edge, command string, v any) {
	t.Helper()
	resp, body := postJSON(t, e.url+"/v1/nodes/n1/commands", map[string]any{"command": command})
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", command, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("%s: %v: %s", command, err, body)
	}
}

type sessionList struct {
	Sessions []struct {
		Adapter        string `json:"adapter"`
		SessionID      string `json:"session_id"`
		Turns          int    `json:"turns"`
		AgentSessionID string `json:"agent_session_id"`
	} `json:"sessions"`
}

func (l sessionList) turns(adapter, session string) int {
	for _, s := range l.Sessions {
		if s.Adapter == adapter && s.SessionID == session {
			return s.Turns
		}
	}
	return -1
}

// stopMidAnswer starts a run on adapter, whose stand-in hangs in the middle
// of its answer, and once the CLI is waiting on the stand-in, stops the run
// by POST /v1/runs/{id}/cancel or by the caller going away. The CLI's whole
// process group must be gone within a second and the node's store must say
// cancelled.
func stopMidAnswer(t *testing.T, e *edge, s *standin.Server, adapter string, disconnect bool) {
	t.Helper()
	input := fmt.Sprintf("take your time (disconnect: %v)", disconnect)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp := startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": adapter, "input": input})
	defer resp.Body.Close()
	r := newSSE(resp.Body)
	var runID string
	pgid := 0
	for pgid == 0 {
		ev, err := r.Next()
		if err != nil {
			t.Fatalf("stream ended before the pid: %v", err)
		}
		var ae agentEvent
		_ = json.Unmarshal([]byte(ev.Data), &ae)
		runID = ae.RunID
		var m struct{ PID int }
		if ae.Type == "metadata" && json.Unmarshal(ae.Metadata, &m) == nil {
			pgid = m.PID
		}
		if ae.Type == "complete" || ae.Type == "error" {
			t.Fatalf("run ended before it was stopped: %s", ev.Data)
		}
	}
	asked := func() bool {
		for _, r := range s.Requests() {
			if bytes.Contains(r.Body, []byte(input)) {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(time.Minute); !asked(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the CLI never called its stand-in")
		}
	}
	time.Sleep(100 * time.Millisecond) // the stand-in has sent part of its answer
	began := time.Now()
	if disconnect {
		cancel()
		resp.Body.Close()
	} else if resp, body := postJSON(t, e.url+"/v1/runs/"+runID+"/cancel", nil); resp.StatusCode != 200 {
		t.Fatalf("cancel: %d %s", resp.StatusCode, body)
	}
	for runtimetest.GroupAlive(pgid) {
		if time.Since(began) > time.Second {
			t.Fatalf("process group %d of the CLI still alive 1s after the cancel", pgid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitRunStatus(t, e, runID, "cancelled", 10*time.Second)
}

// hanging is a stand-in reply that stops after its first piece.
var hanging = standin.Reply{Text: "This answer never finishes.", Hang: true}

// apiError is what the error stand-ins answer.
var apiError = standin.Reply{Status: 400, Error: "stand-in: your request was malformed"}

const dashPrompt = "--version is not a flag here; answer briefly"

func TestAgentClaudeCodeCLI(t *testing.T) {
	t.Parallel()
	bin := agentcli.Find(t, "claude")
	main, failing, slow, tool := anthropic.Start(t), anthropic.Start(t), anthropic.Start(t), anthropic.Start(t)
	breaking, delegating, limited := anthropic.Start(t), anthropic.Start(t), anthropic.Start(t)
	failing.Reply(apiError)
	slow.Reply(hanging)
	shell, fg, bg := toolCommand(1)
	tool.Queue(standin.Reply{Tool: &standin.ToolCall{Name: "Bash", Input: mustJSON(t, map[string]string{"command": shell, "description": "wait"})}})
	adapter := func(name string, s *anthropic.Server) agentAdapter {
		return agentAdapter{name: name, typ: "claude-code", command: bin, workDir: workDir(t),
			args: []string{"--include-partial-messages"}, env: agentcli.Claude(t, s.URL)}
	}
	withTool := adapter("claude-tool", tool)
	withTool.args = []string{"--allowedTools=Bash"}
	e := agentEdge(t, adapter("claude", main), adapter("claude-err", failing), adapter("claude-slow", slow),
		adapter("claude-break", breaking), adapter("claude-sub", delegating), adapter("claude-limited", limited), withTool)

	t.Run("turns", func(t *testing.T) {
		t.Parallel()
		// Turn 1: thinking and a Bash tool call, then the answer.
		main.Queue(
			standin.Reply{Thinking: "I should look first.", Tool: &standin.ToolCall{Name: "Bash", Input: json.RawMessage(`{"command":"echo tool-ran","description":"Print a word"}`)}, Usage: standin.Usage{Input: 400, Output: 30}},
			standin.Reply{Text: "The tool said: tool-ran ✓", Usage: standin.Usage{Input: 500, CacheRead: 100, Output: 12}},
			standin.Reply{Text: "Second turn, same session.", Usage: standin.Usage{Input: 700, Output: 8}},
		)
		run := agentTurn(t, e, "claude", "s1", "run the tool")
		done := run.complete(t)
		if got := run.text("delta"); got != "The tool said: tool-ran ✓" {
			t.Errorf("streamed text = %q", got)
		}
		if got := run.text("reasoning_delta"); got != "I should look first." {
			t.Errorf("reasoning = %q", got)
		}
		uses, results := run.meta("tool_use"), run.meta("tool_result")
		if len(uses) != 1 || !strings.Contains(string(uses[0]), `"name":"Bash"`) || !strings.Contains(string(uses[0]), "echo tool-ran") ||
			len(results) != 1 || !strings.Contains(string(results[0]), "tool-ran") {
			t.Errorf("tool metadata: %s", run)
		}
		// Usage is the two API calls of the turn; the model is the API's id.
		if u := done.Usage; u.PromptTokens != 1000 || u.CompletionTokens != 42 || u.CostUSD <= 0 || u.Model == "" || strings.Contains(u.Model, "[") {
			t.Errorf("usage = %+v", *u)
		}
		// The cost is the CLI's own: the same answers, asked directly, cost the same.
		if want := directClaudeCost(t, bin); math.Abs(done.Usage.CostUSD-want) > 1e-12 {
			t.Errorf("cost = %v, the CLI itself reports %v", done.Usage.CostUSD, want)
		}

		// Turn 2 in the same session resumes the CLI's session: the
		// stand-in sees the first turn's history.
		run2 := agentTurn(t, e, "claude", "s1", "and now?")
		if u := run2.complete(t).Usage; run2.text("delta") != "Second turn, same session." || u.PromptTokens != 700 || u.CompletionTokens != 8 {
			t.Errorf("turn 2: %s", run2)
		}
		// On --resume the CLI's total_cost_usd counts the first turn too;
		// the run's cost is its own (700+8 tokens cost less than 1000+42).
		if c2 := run2.complete(t).Usage.CostUSD; c2 <= 0 || c2 >= done.Usage.CostUSD {
			t.Errorf("turn 2 cost = %v, turn 1 cost = %v: want turn 2's own, less", c2, done.Usage.CostUSD)
		}
		msgs := main.Messages()
		last := string(msgs[len(msgs)-1].Body)
		if !strings.Contains(last, "run the tool") || !strings.Contains(last, "The tool said: tool-ran") || !strings.Contains(last, "and now?") {
			t.Errorf("turn 2 did not resume the session; its request: %.2000s", last)
		}
		// Each turn reports the CLI's session id once; the resumed turn's is the first's.
		if first, second := run.meta("agent_session_id"), run2.meta("agent_session_id"); len(first) != 1 || len(second) != 1 || fmt.Sprint(first) != fmt.Sprint(second) {
			t.Errorf("agent session ids: turn 1 %s, turn 2 %s (want one, then the same)", first, second)
		}
		var l sessionList
		nodeCommand(t, e, "session_list", &l)
		if n := l.turns("claude", "s1"); n != 2 {
			t.Errorf("session_list turns = %d, want 2: %+v", n, l)
		}
	})
	t.Run("stream breaks off", func(t *testing.T) {
		t.Parallel()
		// The streamed answer fails after its first piece (overloaded);
		// the CLI asks again without streaming and gets it whole.
		breaking.Queue(
			standin.Reply{Text: "Hello world", StreamError: "overloaded_error", Usage: standin.Usage{Input: 10, Output: 1}},
			standin.Reply{Text: "Hello world", Usage: standin.Usage{Input: 10, Output: 3}},
		)
		run := agentTurn(t, e, "claude-break", "", "say hello")
		run.complete(t)
		if got := run.text("delta"); got != "Hello world" {
			t.Errorf("streamed text = %q, want the whole answer: %s", got, run)
		}
	})
	t.Run("rate limited", func(t *testing.T) {
		t.Parallel()
		// The API answers 429 first: the CLI waits and asks again, and
		// the caller sees why the run was silent meanwhile.
		limited.Queue(standin.Reply{Status: 429, Error: "stand-in: slow down"}, standin.Reply{Text: "After the wait."})
		run := agentTurn(t, e, "claude-limited", "", "say something")
		run.complete(t)
		retries := run.meta("api_retry")
		if len(retries) != 1 || !strings.Contains(string(retries[0]), `"error_status":429`) || run.text("delta") != "After the wait." {
			t.Errorf("api_retry metadata %s, run: %s", retries, run)
		}
	})
	t.Run("subagent", func(t *testing.T) {
		t.Parallel()
		// The answer delegates to a subagent (the Agent tool, run in the
		// background), then takes up its outcome in a second turn.
		delegating.Script(func(_ int, req standin.Request) standin.Reply {
			body := string(req.Body)
			switch {
			case strings.Contains(body, "Main answer."):
				return standin.Reply{Text: "Main final.", Usage: standin.Usage{Input: 3, Output: 3}}
			case strings.Contains(body, "toolu_"):
				return standin.Reply{Text: "Main answer.", Usage: standin.Usage{Input: 20, Output: 7}}
			case strings.Contains(body, "Say something SUB"):
				return standin.Reply{Thinking: "SUBAGENT THINKING", Text: "SUBAGENT INTERNAL TEXT", Usage: standin.Usage{Input: 100, Output: 50}}
			}
			return standin.Reply{Tool: &standin.ToolCall{Name: "Agent", Input: json.RawMessage(`{"description":"look around","prompt":"Say something SUB","subagent_type":"general-purpose"}`)}, Usage: standin.Usage{Input: 10, Output: 5}}
		})
		run := agentTurn(t, e, "claude-sub", "", "delegate it")
		u := run.complete(t).Usage
		if text, thinking := run.text("delta"), run.text("reasoning_delta"); strings.Contains(text+thinking, "SUBAGENT") || !strings.Contains(text, "Main final.") {
			t.Errorf("the subagent's work streamed as the answer, or the answer is missing: text %q, reasoning %q", text, thinking)
		}
		// Usage counts every call: the main agent's three and the subagent's.
		if u.PromptTokens != 10+20+100+3 || u.CompletionTokens != 5+7+50+3 {
			t.Errorf("usage = %+v, want 133+65 tokens: %s", *u, run)
		}
	})
	t.Run("api error and dash prompt", func(t *testing.T) {
		t.Parallel()
		run := agentTurn(t, e, "claude-err", "", dashPrompt)
		run.oneError(t, "provider_error")
		if !strings.Contains(run.last().Error.Message, "malformed") {
			t.Errorf("error = %+v", run.last().Error)
		}
		msgs := failing.Messages()
		if len(msgs) == 0 || anthropic.Text(msgs[0]) != dashPrompt {
			t.Errorf("the prompt did not reach the model as a prompt: %d requests", len(msgs))
		}
	})
	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		stopMidAnswer(t, e, slow.Server, "claude-slow", false)
	})
	t.Run("caller disconnect", func(t *testing.T) {
		t.Parallel()
		stopMidAnswer(t, e, slow.Server, "claude-slow", true)
	})
	// The CLI runs each Bash command in a session of its own, which its
	// process group does not reach.
	t.Run("cancel during a shell command", func(t *testing.T) {
		t.Parallel()
		stopDuringTool(t, e, "claude-tool", fg, bg)
	})
}

// directClaudeCost runs claude by hand against a stand-in answering as in
// the "turns" test and returns the total_cost_usd it reports.
func directClaudeCost(t *testing.T, bin string) float64 {
	t.Helper()
	s := anthropic.Start(t)
	s.Queue(
		standin.Reply{Thinking: "I should look first.", Tool: &standin.ToolCall{Name: "Bash", Input: json.RawMessage(`{"command":"echo tool-ran","description":"Print a word"}`)}, Usage: standin.Usage{Input: 400, Output: 30}},
		standin.Reply{Text: "The tool said: tool-ran ✓", Usage: standin.Usage{Input: 500, CacheRead: 100, Output: 12}},
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-p", "--output-format", "json", "run the tool")
	cmd.Env = agentcli.Claude(t, s.URL).List()
	cmd.Dir = workDir(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("claude by hand: %v: %s", err, out)
	}
	var r struct {
		TotalCostUSD float64 `json:"total_cost_usd"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil || r.TotalCostUSD <= 0 {
		t.Fatalf("claude by hand: %v: %s", err, out)
	}
	return r.TotalCostUSD
}

func TestAgentCodexCLI(t *testing.T) {
	t.Parallel()
	bin := agentcli.Find(t, "codex")
	main, failing, slow, tool := responses.Start(t), responses.Start(t), responses.Start(t), responses.Start(t)
	failing.Reply(apiError)
	slow.Reply(hanging)
	shell, fg, bg := toolCommand(2)
	tool.Queue(standin.Reply{Tool: &standin.ToolCall{Name: "exec_command", Input: mustJSON(t, map[string]string{"cmd": shell})}})
	const model = "gpt-5.5" // one codex knows, or it warns that it has no metadata for it
	adapter := func(name string, s *responses.Server) agentAdapter {
		return agentAdapter{name: name, typ: "codex", command: bin, workDir: workDir(t), models: []string{model},
			args: []string{"--skip-git-repo-check"}, env: agentcli.Codex(t, s.URL, model)}
	}
	e := agentEdge(t, adapter("codex", main), adapter("codex-err", failing), adapter("codex-slow", slow), adapter("codex-tool", tool))

	t.Run("three resumed turns", func(t *testing.T) {
		t.Parallel()
		perTurn := standin.Usage{Input: 100, CacheRead: 20, Output: 17}
		main.Queue(
			standin.Reply{Thinking: "A command will tell.", Tool: &standin.ToolCall{Name: "exec_command", Input: json.RawMessage(`{"cmd":"echo tool-ran"}`)}, Usage: standin.Usage{Input: 50, Output: 5}},
			standin.Reply{Text: "Turn one: tool-ran ✓", Usage: perTurn},
		)
		run := agentTurn(t, e, "codex", "s1", "run the tool")
		done := run.complete(t)
		if run.text("delta") != "Turn one: tool-ran ✓" || run.text("reasoning_delta") != "A command will tell." {
			t.Errorf("turn 1: %s", run)
		}
		var commands []string
		for _, it := range run.meta("item") {
			if strings.Contains(string(it), `"type":"command_execution"`) {
				commands = append(commands, string(it))
			}
		}
		if len(commands) != 1 || !strings.Contains(commands[0], "echo tool-ran") || !strings.Contains(commands[0], `"exit_code":0`) {
			t.Errorf("tool metadata: %s", run)
		}
		if u := done.Usage; u.PromptTokens != 170 || u.CompletionTokens != 22 || u.Model != model || u.StopReason != "completed" {
			t.Errorf("turn 1 usage = %+v", *u)
		}
		for i, text := range []string{"Turn two.", "Turn three."} {
			main.Queue(standin.Reply{Text: text, Usage: perTurn})
			run := agentTurn(t, e, "codex", "s1", fmt.Sprintf("turn %d", i+2))
			// Each resumed turn reports its own usage, not the thread's total.
			if u := run.complete(t).Usage; run.text("delta") != text || u.PromptTokens != 120 || u.CompletionTokens != 17 || u.TotalTokens != 137 {
				t.Errorf("turn %d: %s", i+2, run)
			}
		}
		reqs := main.Responses()
		if last := string(reqs[len(reqs)-1].Body); !strings.Contains(last, "run the tool") || !strings.Contains(last, "Turn two.") {
			t.Errorf("turn 3 did not resume the thread; its request: %.2000s", last)
		}
		var usage struct {
			Adapters []struct {
				Adapter          string `json:"adapter"`
				Succeeded        int64  `json:"succeeded"`
				PromptTokens     int64  `json:"prompt_tokens"`
				CompletionTokens int64  `json:"completion_tokens"`
			} `json:"adapters"`
		}
		nodeCommand(t, e, "usage_status", &usage)
		for _, a := range usage.Adapters {
			if a.Adapter == "codex" && (a.Succeeded != 3 || a.PromptTokens != 410 || a.CompletionTokens != 56) {
				t.Errorf("usage_status = %+v, want 3 runs, 410 prompt and 56 completion tokens", a)
			}
		}
		var l sessionList
		nodeCommand(t, e, "session_list", &l)
		if n := l.turns("codex", "s1"); n != 3 {
			t.Errorf("session_list turns = %d, want 3", n)
		}
	})
	t.Run("api error and dash prompt", func(t *testing.T) {
		t.Parallel()
		run := agentTurn(t, e, "codex-err", "", dashPrompt)
		run.oneError(t, "run_failed")
		if !strings.Contains(run.last().Error.Message, "malformed") {
			t.Errorf("error = %+v", run.last().Error)
		}
		reqs := failing.Responses()
		if len(reqs) == 0 || !strings.Contains(string(reqs[0].Body), dashPrompt) {
			t.Errorf("the prompt did not reach the model: %d requests", len(reqs))
		}
	})
	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		stopMidAnswer(t, e, slow.Server, "codex-slow", false)
	})
	t.Run("caller disconnect", func(t *testing.T) {
		t.Parallel()
		stopMidAnswer(t, e, slow.Server, "codex-slow", true)
	})
	// The CLI runs each command in a session of its own, which its
	// process group does not reach.
	t.Run("cancel during a shell command", func(t *testing.T) {
		t.Parallel()
		stopDuringTool(t, e, "codex-tool", fg, bg)
	})
}

func TestAgentGeminiCLI(t *testing.T) {
	t.Parallel()
	bin := agentcli.Find(t, "gemini")
	main, failing, slow, tool, limited := gemini.Start(t), gemini.Start(t), gemini.Start(t), gemini.Start(t), gemini.Start(t)
	failing.Reply(apiError)
	slow.Reply(hanging)
	shell, fg, bg := toolCommand(3)
	tool.Queue(standin.Reply{Tool: &standin.ToolCall{Name: "run_shell_command", Input: mustJSON(t, map[string]string{"command": shell})}})
	adapter := func(name string, s *gemini.Server, models ...string) agentAdapter {
		return agentAdapter{name: name, typ: "gemini", command: bin, workDir: workDir(t), models: models, env: agentcli.Gemini(t, s.URL)}
	}
	withTool := adapter("gemini-tool", tool, "gemini-2.5-pro")
	withTool.args = []string{"--approval-mode=yolo"}
	e := agentEdge(t, adapter("gemini", main), adapter("gemini-err", failing, "gemini-2.5-pro"), adapter("gemini-slow", slow, "gemini-2.5-pro"), withTool,
		adapter("gemini-limited", limited, "gemini-2.5-pro"))

	t.Run("turns", func(t *testing.T) {
		t.Parallel()
		// No model configured: the CLI routes the prompt first (a JSON
		// generateContent call, 7+3 tokens), then streams the answer.
		main.Queue(
			standin.Reply{Text: "Let me look.", Tool: &standin.ToolCall{Name: "list_directory", Input: json.RawMessage(`{"dir_path":"."}`)}, Usage: standin.Usage{Input: 200, Output: 10}},
			standin.Reply{Text: "There is hello.txt ✓", Usage: standin.Usage{Input: 300, CacheRead: 50, Output: 20}},
			standin.Reply{Thinking: "Recall the first turn.", Text: "Second turn, same session.", Usage: standin.Usage{Input: 400, Output: 25, Reasoning: 20}},
		)
		run := agentTurn(t, e, "gemini", "s1", "what is here?")
		done := run.complete(t)
		// The answer after the tool call is a block of its own.
		if run.text("delta") != "Let me look.\n\nThere is hello.txt ✓" {
			t.Errorf("streamed text = %q", run.text("delta"))
		}
		uses, results := run.meta("tool_use"), run.meta("tool_result")
		if len(uses) != 1 || !strings.Contains(string(uses[0]), `"name":"list_directory"`) || len(results) != 1 || !strings.Contains(string(results[0]), `"is_error":false`) {
			t.Errorf("tool metadata: %s", run)
		}
		// The stats count every call of the turn, the routing one included.
		if u := done.Usage; u.PromptTokens != 7+200+350 || u.CompletionTokens != 3+10+20 || u.Model == "" || u.StopReason != "success" {
			t.Errorf("usage = %+v", *u)
		}
		run2 := agentTurn(t, e, "gemini", "s1", "and now?")
		if run2.complete(t); run2.text("delta") != "Second turn, same session." {
			t.Errorf("turn 2: %s", run2)
		}
		// The 20 tokens of thinking are output too: prompt and completion
		// make up the total.
		if u := run2.complete(t).Usage; u.CompletionTokens != 3+25 || u.PromptTokens+u.CompletionTokens != u.TotalTokens {
			t.Errorf("turn 2 usage = %+v, want 3+25 completion tokens (routing, answer with its thinking)", *u)
		}
		calls, routing := main.Calls()
		var last standin.Request
		for i, c := range calls {
			if !routing[i] {
				last = c
			}
		}
		if body := string(last.Body); !strings.Contains(body, "what is here?") || !strings.Contains(body, "There is hello.txt") || !strings.Contains(body, "and now?") {
			t.Errorf("turn 2 did not resume the session; its request: %.2000s", body)
		}
		var l sessionList
		nodeCommand(t, e, "session_list", &l)
		if n := l.turns("gemini", "s1"); n != 2 {
			t.Errorf("session_list turns = %d, want 2", n)
		}
	})
	t.Run("api error and dash prompt", func(t *testing.T) {
		t.Parallel()
		run := agentTurn(t, e, "gemini-err", "", dashPrompt)
		run.oneError(t, "provider_error")
		calls, _ := failing.Calls()
		if len(calls) == 0 || gemini.Text(calls[0]) != dashPrompt {
			t.Errorf("the prompt did not reach the model as a prompt: %d calls", len(calls))
		}
		// A slash command the CLI cannot run headless fails in the CLI,
		// which words it "[API Error: …]" all the same: no provider's.
		quit := agentTurn(t, e, "gemini-err", "", "/quit")
		quit.oneError(t, "run_failed")
		if msg := quit.last().Error.Message; !strings.Contains(msg, "not supported in non-interactive mode") {
			t.Errorf("/quit: error %q", msg)
		}
		if after, _ := failing.Calls(); len(after) != len(calls) {
			t.Errorf("/quit reached the model")
		}
		// The CLI drops a turn the API failed from its session, and will
		// not resume a session left without turns: the session's next run
		// starts a new one, and reaches the model again.
		for i := range 2 {
			before, _ := failing.Calls()
			run := agentTurn(t, e, "gemini-err", "lost", fmt.Sprintf("turn %d", i+1))
			run.oneError(t, "provider_error")
			if after, _ := failing.Calls(); len(after) == len(before) {
				t.Errorf("turn %d of a session whose first turn failed did not reach the model: %s", i+1, run)
			}
		}
	})
	t.Run("rate limited", func(t *testing.T) {
		t.Parallel()
		// The API answers 429 first: the CLI waits and asks again, telling
		// it only on stderr, and the caller sees why the run was silent
		// meanwhile, before the answer.
		limited.Queue(standin.Reply{Status: 429, Error: "stand-in: slow down"}, standin.Reply{Text: "After the wait."})
		run := agentTurn(t, e, "gemini-limited", "", "say something")
		run.complete(t)
		retries := run.meta("api_retry")
		if len(retries) != 1 || !strings.Contains(string(retries[0]), `"attempt":1,`) || !strings.Contains(string(retries[0]), `"error_status":429,"error":"stand-in: slow down"`) || run.text("delta") != "After the wait." {
			t.Fatalf("api_retry metadata %s, run: %s", retries, run)
		}
		for _, ev := range run {
			if ev.Type == "delta" {
				t.Fatalf("an answer came before the retry notice: %s", run)
			}
			if ev.Type == "metadata" && strings.HasPrefix(string(ev.Metadata), `{"api_retry":`) {
				break
			}
		}
	})
	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		stopMidAnswer(t, e, slow.Server, "gemini-slow", false)
	})
	t.Run("caller disconnect", func(t *testing.T) {
		t.Parallel()
		stopMidAnswer(t, e, slow.Server, "gemini-slow", true)
	})
	// The CLI runs each shell command in a session of its own, which its
	// process group does not reach.
	t.Run("cancel during a shell command", func(t *testing.T) {
		t.Parallel()
		stopDuringTool(t, e, "gemini-tool", fg, bg)
	})
}
