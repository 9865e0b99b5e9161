// Package codex is the runtime adapter for the OpenAI Codex CLI in
// non-interactive mode.
//
// Each run starts the configured command (default "codex") in the adapter's
// work_dir, directly (no shell), in a process group of its own, as
//
//	codex exec --json [--model=<model>] <args…> -
//	codex exec --json [--model=<model>] <args…> resume <thread id> -
//
// where <model> is the run's target, else the adapter's first configured
// model (omitted when neither is set), and <args…> are the adapter's
// configured args (e.g. --skip-git-repo-check, --sandbox=workspace-write):
// flags go before "resume", as the CLI requires. The prompt, the run input,
// goes on stdin ("-" as PROMPT tells the CLI to read it there): not in argv,
// where Linux refuses an argument over 128 KiB and every local user could
// read it in the process list.
//
// The CLI prints JSONL; lines that are not JSON and unknown types are
// skipped. Codex sends no token-level deltas. Mapping:
//
//   - thread.started: thread_id is the agent session id; a metadata event
//     {"agent_session_id":…} is sent once per id.
//   - item.completed agent_message → delta with its whole text;
//     reasoning → reasoning_delta. Consecutive messages (and reasoning
//     items) are separated by a blank line.
//   - item.completed of any other type (command_execution, file_change,
//     mcp_tool_call, web_search, todo_list, error, …) → metadata
//     {"item":{…}}: the item as Codex sent it, with any string longer than
//     2 KiB (a command's aggregated_output, say) cut. item.started and
//     item.updated are skipped.
//   - turn.completed → metadata {"usage":{…}} (Codex's usage as is,
//     including cached_input_tokens), then, once the process has exited,
//     complete with usage: prompt tokens = input_tokens (which include the
//     cached ones), completion tokens = output_tokens, their sum, the
//     wall-clock duration of the run, the model (the one the stream names,
//     else the run's target or the adapter's first model) and the stop
//     reason (the stream's, else "completed").
//
// Codex's usage is the thread's running total, not the turn's: on "exec
// resume" it includes every earlier turn. The adapter keeps the total as of
// each completed turn with the session and reports the difference, so each
// run's usage is its own (a cancelled or failed turn stores nothing, and
// the next turn is measured from the last completed one). A resume that
// starts a different thread starts from zero.
//   - turn.failed → error (run_failed) with error.message.
//   - error (top level) → metadata {"error":message} at once; if the turn
//     then neither completes nor fails, the run ends with an error
//     (run_failed) carrying that message.
//
// A process that exits without any of these is an error (run_failed) with
// its exit status and the tail of its stderr. A configured timeout that
// expires kills the process group and is an error with code timeout. A CLI
// still running ExitGrace after turn.completed or turn.failed, silent, has
// its process group stopped, and the run ends as the turn did (also when
// the timeout expires meanwhile).
//
// Sessions: for a run with a session id, the thread id is stored as soon as
// it is seen; the next run in that session uses "exec … resume <id>".
// TerminateSession forgets the mapping. Cancelling ctx sends SIGTERM to the
// process group, SIGKILL after KillGrace, and returns ctx.Err().
package codex

import (
	"cmp"
	"context"
	"encoding/json"
	"os"
	"time"

	"iop/adapters/runtime/internal/agent"
	"iop/domain"
	"iop/ports"
)

// DefaultCommand is the binary run when the config names none.
const DefaultCommand = "codex"

// Adapter runs Codex for one adapter instance. It is safe for concurrent use.
type Adapter struct {
	agent.Base
}

var (
	_ ports.RuntimeAdapter    = (*Adapter)(nil)
	_ ports.RunAdmitter       = (*Adapter)(nil)
	_ ports.SessionTerminator = (*Adapter)(nil)
	_ ports.SessionLister     = (*Adapter)(nil)
)

// New builds a codex adapter; agents keeps the session mappings (nil: the
// adapter keeps no sessions). Errors are domain.ErrConfig.
func New(cfg domain.AdapterConfig, agents ports.AgentSessionStore) (*Adapter, error) {
	base, err := agent.NewBase(cfg, agents, "codex", "codex", DefaultCommand)
	if err != nil {
		return nil, err
	}
	return &Adapter{Base: base}, nil
}

// Argv returns the arguments (after the program name) for a run with model
// and thread id to resume, either of which may be empty. The prompt goes on
// stdin.
func (a *Adapter) Argv(model, resume string) []string {
	args := []string{"exec", "--json"}
	if model != "" {
		args = append(args, "--model="+model)
	}
	args = append(args, a.ExtraArgs()...)
	if resume != "" {
		args = append(args, "resume", resume)
	}
	return append(args, "-")
}

// Execute runs one prompt as the package doc describes. A blank input is an
// invalid_request error and a command that cannot start a run_failed error,
// both returned without events.
func (a *Adapter) Execute(ctx context.Context, req domain.RunRequest, sink ports.EventSink) error {
	build := func(model, resume, prompt string) agent.Invocation {
		return agent.Invocation{Args: a.Argv(model, resume), Stdin: []byte(prompt)}
	}
	return a.Run(ctx, req, sink, build, &parser{started: time.Now()})
}

// parser reads one run's JSONL.
type parser struct {
	started      time.Time
	sawText      bool
	sawReasoning bool
	usage        *usage
	model        string
	stopReason   string
	failed       *string
	fatal        *string
}

type event struct {
	Type       string          `json:"type"`
	ThreadID   string          `json:"thread_id"`
	Model      string          `json:"model"`
	StopReason string          `json:"stop_reason"`
	Item       json.RawMessage `json:"item"`
	Usage      json.RawMessage `json:"usage"`
	Error      *struct {
		Message string `json:"message"`
	} `json:"error"`
	Message string `json:"message"`
}

type usage struct {
	InputTokens       int64 `json:"input_tokens"`
	CachedInputTokens int64 `json:"cached_input_tokens"`
	OutputTokens      int64 `json:"output_tokens"`
}

func (p *parser) Line(t *agent.Turn, raw []byte) error {
	var ev event
	if json.Unmarshal(raw, &ev) != nil {
		return nil
	}
	p.model = cmp.Or(ev.Model, p.model)
	switch ev.Type {
	case "thread.started":
		return t.AgentSession(ev.ThreadID)
	case "item.completed":
		return p.item(t, ev.Item)
	case "turn.completed":
		var u usage
		_ = json.Unmarshal(ev.Usage, &u)
		p.usage = &u
		p.stopReason = ev.StopReason
		if len(ev.Usage) > 0 {
			return t.Meta(map[string]json.RawMessage{"usage": ev.Usage})
		}
	case "turn.failed":
		msg := "codex: the turn failed"
		if ev.Error != nil && ev.Error.Message != "" {
			msg = ev.Error.Message
		}
		p.failed = &msg
	case "error":
		msg := cmp.Or(ev.Message, "codex reported an error")
		p.fatal = &msg
		return t.Meta(map[string]string{"error": msg})
	}
	return nil
}

// Done reports whether the turn has completed or failed: codex exec runs
// one turn, so nothing is left for the CLI to do but exit.
func (p *parser) Done() bool { return p.usage != nil || p.failed != nil }

func (p *parser) item(t *agent.Turn, raw json.RawMessage) error {
	var it struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &it) != nil {
		return nil
	}
	switch it.Type {
	case "agent_message":
		return t.Text(domain.EventDelta, agent.Separate(&p.sawText, it.Text))
	case "reasoning":
		return t.Text(domain.EventReasoningDelta, agent.Separate(&p.sawReasoning, it.Text))
	}
	item := map[string]json.RawMessage{"item": agent.ShrinkJSON(raw)}
	if it.Type == "error" {
		return t.Meta(item) // a notice, not the agent's work
	}
	return t.Work(item)
}

func (p *parser) End(t *agent.Turn, exit *os.ProcessState, stderr string) domain.RunEvent {
	switch {
	case p.failed != nil:
		return agent.Failed(domain.CodeRunFailed, *p.failed)
	case p.usage != nil:
		now := domain.AgentTotals{Input: p.usage.InputTokens, Cached: p.usage.CachedInputTokens, Output: p.usage.OutputTokens}
		t.SetTotals(now)
		turn := now
		if prev := t.Previous(); now.Input >= prev.Input && now.Output >= prev.Output {
			turn = domain.AgentTotals{Input: now.Input - prev.Input, Output: now.Output - prev.Output}
		}
		return domain.RunEvent{Type: domain.EventComplete, Usage: &domain.Usage{
			PromptTokens:     turn.Input,
			CompletionTokens: turn.Output,
			TotalTokens:      domain.AddTokens(turn.Input, turn.Output),
			DurationMS:       time.Since(p.started).Milliseconds(),
			StopReason:       cmp.Or(p.stopReason, "completed"),
			Model:            cmp.Or(p.model, t.Model()),
		}}
	case p.fatal != nil:
		return agent.Failed(domain.CodeRunFailed, *p.fatal)
	}
	return agent.ExitFailure("codex", exit, stderr)
}
