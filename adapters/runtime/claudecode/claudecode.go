// Package claudecode is the runtime adapter for the Claude Code CLI in
// headless mode.
//
// Each run starts the configured command (default "claude") in the
// adapter's work_dir, directly (no shell), in a process group of its own, as
//
//	claude -p --output-format stream-json --verbose [--model=<model>] [--resume=<agent session id>] <args…>
//
// where <model> is the run's target, else the adapter's first configured
// model (omitted when neither is set), and <args…> are the adapter's
// configured args (e.g. --permission-mode=acceptEdits). The prompt, the run
// input, goes to stdin, never to argv: it cannot be mistaken for a flag,
// is not limited by the kernel's per-argument size, and is not visible in
// the process list.
//
// The CLI prints one JSON object per line; lines that are not JSON and
// types this adapter does not know are skipped. Mapping:
//
//   - system/init: its session_id is the agent session id; a metadata event
//     {"agent_session_id":…} is sent once per id.
//   - assistant: a synthetic message (message.model "<synthetic>", or a
//     top-level error set: the CLI's own text for an API error) is skipped,
//     since it is not the model's output; the result line that follows
//     reports the error. Otherwise message.content blocks: text → delta, thinking →
//     reasoning_delta, tool_use → metadata {"tool_use":{"id","name","input"}}
//     (input kept as JSON, with any string longer than 2 KiB cut).
//   - user: each tool_result block → metadata
//     {"tool_result":{"tool_use_id","is_error","content","truncated"}}, the
//     content as text cut to 2 KiB.
//   - stream_event: only when the configured args contain
//     --include-partial-messages. content_block_delta text_delta → delta and
//     thinking_delta → reasoning_delta; text and thinking blocks of whole
//     assistant messages are then skipped, since the deltas already carried
//     them (tool_use blocks are still taken from whole messages).
//   - result: metadata {"num_turns","usage"} (the CLI's usage object as is),
//     then, once the process has exited, the terminal event: complete with
//     usage (prompt tokens = input_tokens + cache_creation_input_tokens +
//     cache_read_input_tokens, i.e. every prompt token the model read;
//     completion tokens = output_tokens; total_cost_usd; duration_ms; the
//     model: the API model id of the last assistant message, else the
//     system/init model without the CLI's context-size label such as
//     "[1m]"), or, when is_error is true or the subtype is
//     not "success", error with the result text (code provider_error for
//     an API error reported with subtype "success", run_failed otherwise),
//     still carrying the usage.
//
// Consecutive text blocks (and thinking blocks) are separated by a blank
// line, so the deltas of a run read as one text. A process that exits
// without a result line is an error (run_failed) with its exit status and
// the tail of its stderr. A configured timeout that expires kills the
// process group and is an error with code timeout. A CLI that has printed
// its result and stays silent and alive for ExitGrace (it happens:
// anthropics/claude-code#25629) has its process group stopped, and the run
// ends with that result, as it does when the timeout expires meanwhile.
//
// Sessions: for a run with a session id, the agent session id reported by
// the CLI is stored as soon as it is seen; the next run in that session
// passes --resume=<id>. Since the CLI keeps its transcripts per working
// directory, work_dir should not change between the runs of a session.
// TerminateSession forgets the mapping (the CLI's transcript stays on disk).
//
// Cancelling ctx sends SIGTERM to the process group, SIGKILL after
// KillGrace, and returns ctx.Err().
package claudecode

import (
	"cmp"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"

	"iop/adapters/runtime/internal/agent"
	"iop/domain"
	"iop/ports"
)

// DefaultCommand is the binary run when the config names none.
const DefaultCommand = "claude"

const partialFlag = "--include-partial-messages"

// syntheticModel marks an assistant message the CLI made up itself.
const syntheticModel = "<synthetic>"

// apiModelID strips the CLI's label from a model name: "claude-opus-4-8[1m]"
// (the 1M-token context variant) is the API model "claude-opus-4-8".
func apiModelID(m string) string {
	if i := strings.IndexByte(m, '['); i > 0 && strings.HasSuffix(m, "]") {
		return m[:i]
	}
	return m
}

// Adapter runs Claude Code for one adapter instance. It is safe for
// concurrent use.
type Adapter struct {
	agent.Base

	partial bool
}

var (
	_ ports.RuntimeAdapter    = (*Adapter)(nil)
	_ ports.SessionTerminator = (*Adapter)(nil)
	_ ports.SessionLister     = (*Adapter)(nil)
)

// New builds a claude-code adapter; agents keeps the session mappings (nil:
// the adapter keeps no sessions). Errors are domain.ErrConfig.
func New(cfg domain.AdapterConfig, agents ports.AgentSessionStore) (*Adapter, error) {
	base, err := agent.NewBase(cfg, agents, "claude-code", "claude", DefaultCommand)
	if err != nil {
		return nil, err
	}
	return &Adapter{
		Base:    base,
		partial: slices.ContainsFunc(cfg.Args, func(a string) bool { return a == partialFlag || strings.HasPrefix(a, partialFlag+"=") }),
	}, nil
}

// Argv returns the arguments (after the program name) for a run with model
// and resume id, either of which may be empty.
func (a *Adapter) Argv(model, resume string) []string {
	args := []string{"-p", "--output-format", "stream-json", "--verbose"}
	if model != "" {
		args = append(args, "--model="+model)
	}
	if resume != "" {
		args = append(args, "--resume="+resume)
	}
	return append(args, a.ExtraArgs()...)
}

// Execute runs one prompt as the package doc describes. A blank input is an
// invalid_request error and a command that cannot start a run_failed error,
// both returned without events.
func (a *Adapter) Execute(ctx context.Context, req domain.RunRequest, sink ports.EventSink) error {
	build := func(model, resume, prompt string) agent.Invocation {
		return agent.Invocation{Args: a.Argv(model, resume), Stdin: []byte(prompt)}
	}
	return a.Run(ctx, req, sink, build, &parser{partial: a.partial})
}

// parser reads one run's stream-json.
type parser struct {
	partial  bool
	model    string // from system/init
	apiModel string // from the last assistant message
	result   *resultLine
	// What the previous text-bearing block was, to separate blocks.
	sawText, sawThinking bool
	// In partial mode: a new text or thinking block has started.
	newText, newThinking bool
}

type line struct {
	Type      string          `json:"type"`
	Error     json.RawMessage `json:"error"`
	Subtype   string          `json:"subtype"`
	SessionID string          `json:"session_id"`
	Model     string          `json:"model"`
	Message   json.RawMessage `json:"message"`
	Event     json.RawMessage `json:"event"`
}

type block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Thinking  string          `json:"thinking"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

type resultLine struct {
	Subtype      string          `json:"subtype"`
	IsError      bool            `json:"is_error"`
	Result       string          `json:"result"`
	SessionID    string          `json:"session_id"`
	NumTurns     int64           `json:"num_turns"`
	DurationMS   int64           `json:"duration_ms"`
	TotalCostUSD float64         `json:"total_cost_usd"`
	StopReason   string          `json:"stop_reason"`
	Errors       json.RawMessage `json:"errors"`
	Usage        json.RawMessage `json:"usage"`
}

type usage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

func (p *parser) Line(t *agent.Turn, raw []byte) error {
	var l line
	if json.Unmarshal(raw, &l) != nil {
		return nil
	}
	switch l.Type {
	case "system":
		if l.Subtype == "init" {
			p.model = l.Model
			return t.AgentSession(l.SessionID)
		}
	case "assistant":
		var m struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(l.Message, &m)
		if m.Model == syntheticModel || (len(l.Error) > 0 && string(l.Error) != "null") {
			return nil
		}
		p.apiModel = cmp.Or(m.Model, p.apiModel)
		return p.assistant(t, l.Message)
	case "user":
		return p.user(t, l.Message)
	case "stream_event":
		if p.partial {
			return p.streamEvent(t, l.Event)
		}
	case "result":
		var r resultLine
		if json.Unmarshal(raw, &r) != nil {
			return nil
		}
		p.result = &r
		if err := t.AgentSession(r.SessionID); err != nil {
			return err
		}
		meta := map[string]any{"num_turns": r.NumTurns}
		if len(r.Usage) > 0 {
			meta["usage"] = r.Usage
		}
		return t.Meta(meta)
	}
	return nil
}

// Done reports whether a result has come.
func (p *parser) Done() bool { return p.result != nil }

func contentBlocks(msg json.RawMessage) []block {
	var m struct {
		Content []block `json:"content"`
	}
	if json.Unmarshal(msg, &m) != nil {
		return nil
	}
	return m.Content
}

func (p *parser) assistant(t *agent.Turn, msg json.RawMessage) error {
	for _, b := range contentBlocks(msg) {
		var err error
		switch b.Type {
		case "text":
			if !p.partial {
				err = t.Text(domain.EventDelta, agent.Separate(&p.sawText, b.Text))
			}
		case "thinking":
			if !p.partial {
				err = t.Text(domain.EventReasoningDelta, agent.Separate(&p.sawThinking, b.Thinking))
			}
		case "tool_use":
			input := b.Input
			if len(input) == 0 {
				input = json.RawMessage("{}")
			}
			err = t.Meta(map[string]any{"tool_use": map[string]any{"id": b.ID, "name": b.Name, "input": agent.ShrinkJSON(input)}})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) user(t *agent.Turn, msg json.RawMessage) error {
	for _, b := range contentBlocks(msg) {
		if b.Type != "tool_result" {
			continue
		}
		text, cut := agent.Truncate(resultText(b.Content), agent.MaxSummary)
		err := t.Meta(map[string]any{"tool_result": map[string]any{
			"tool_use_id": b.ToolUseID, "is_error": b.IsError, "content": text, "truncated": cut,
		}})
		if err != nil {
			return err
		}
	}
	return nil
}

// resultText returns a tool result's content as text: a string as is, the
// text parts of an array of blocks joined by newlines, other parts noted by
// their type.
func resultText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return string(raw)
	}
	texts := make([]string, 0, len(parts))
	for _, pt := range parts {
		if pt.Type == "text" {
			texts = append(texts, pt.Text)
		} else {
			texts = append(texts, "["+pt.Type+"]")
		}
	}
	return strings.Join(texts, "\n")
}

func (p *parser) streamEvent(t *agent.Turn, raw json.RawMessage) error {
	var ev struct {
		Type         string `json:"type"`
		ContentBlock struct {
			Type string `json:"type"`
		} `json:"content_block"`
		Delta struct {
			Type     string `json:"type"`
			Text     string `json:"text"`
			Thinking string `json:"thinking"`
		} `json:"delta"`
	}
	if json.Unmarshal(raw, &ev) != nil {
		return nil
	}
	switch ev.Type {
	case "content_block_start":
		switch ev.ContentBlock.Type {
		case "text":
			p.newText = true
		case "thinking":
			p.newThinking = true
		}
	case "content_block_delta":
		switch ev.Delta.Type {
		case "text_delta":
			text := ev.Delta.Text
			if p.newText && text != "" {
				text, p.newText = agent.Separate(&p.sawText, text), false
			}
			p.sawText = p.sawText || text != ""
			return t.Text(domain.EventDelta, text)
		case "thinking_delta":
			text := ev.Delta.Thinking
			if p.newThinking && text != "" {
				text, p.newThinking = agent.Separate(&p.sawThinking, text), false
			}
			p.sawThinking = p.sawThinking || text != ""
			return t.Text(domain.EventReasoningDelta, text)
		}
	}
	return nil
}

func (p *parser) End(t *agent.Turn, exit *os.ProcessState, stderr string) domain.RunEvent {
	r := p.result
	if r == nil {
		return agent.ExitFailure("claude", exit, stderr)
	}
	var u usage
	_ = json.Unmarshal(r.Usage, &u)
	prompt := u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
	usage := &domain.Usage{
		PromptTokens:     prompt,
		CompletionTokens: u.OutputTokens,
		TotalTokens:      prompt + u.OutputTokens,
		CostUSD:          r.TotalCostUSD,
		DurationMS:       r.DurationMS,
		StopReason:       cmp.Or(r.StopReason, r.Subtype),
		Model:            cmp.Or(p.apiModel, apiModelID(p.model), t.Model()),
	}
	if !r.IsError && r.Subtype == "success" {
		return domain.RunEvent{Type: domain.EventComplete, Usage: usage}
	}
	code := domain.CodeRunFailed
	if r.Subtype == "success" {
		code = domain.CodeProviderError // an API error (429, 529, …) reported as a result
	}
	msg := r.Result
	if msg == "" {
		msg = "claude: " + cmp.Or(r.Subtype, "error")
		if len(r.Errors) > 0 && string(r.Errors) != "null" && string(r.Errors) != "[]" {
			msg += ": " + string(r.Errors)
		}
	}
	ev := agent.Failed(code, msg)
	ev.Usage = usage
	return ev
}
