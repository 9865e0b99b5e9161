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
//   - system/api_retry (an API call failed: rate limited, overloaded, …,
//     and the CLI waits to try again) → metadata
//     {"api_retry":{"attempt","max_retries","retry_delay_ms","error_status","error"}}.
//   - user: each tool_result block → metadata
//     {"tool_result":{"tool_use_id","is_error","content","truncated"}}, the
//     content as text cut to 2 KiB.
//   - stream_event: only when the configured args contain
//     --include-partial-messages. content_block_delta text_delta → delta and
//     thinking_delta → reasoning_delta; the text and thinking of whole
//     assistant messages are then not sent again where the deltas already
//     carried them (tool_use blocks are still taken from whole messages),
//     and sent where they did not: when the API stream breaks off, the CLI
//     asks again without streaming and the answer comes only whole. If it
//     starts with what the broken stream carried, the rest follows that;
//     else it is a new block.
//   - lines with a parent_tool_use_id (a subagent's, run by the Agent or
//     Task tool): text and thinking are skipped, being the subagent's work
//     and not the run's answer; tool_use and tool_result blocks are
//     metadata as above with "parent_tool_use_id" added.
//   - result: metadata {"permission_denials":[{"tool_name","tool_use_id"}]}
//     when the CLI refused tool calls for want of a permission (their
//     tool_result is an error too), then metadata {"num_turns","usage"}
//     (the CLI's usage object as is).
//     With background subagents the CLI prints a result per turn of the
//     main agent; the last one decides. Once the process has exited, the
//     terminal event: complete with usage (prompt tokens = input +
//     cache creation + cache read input tokens, i.e. every prompt token the
//     model read; completion tokens = output tokens; both of every model
//     call of the process, subagents' included: the sum of every result's
//     model_usage_since_last_result, its costUSD the cost — modelUsage and
//     total_cost_usd are running totals that, on --resume, may count the
//     session's earlier runs. Without it: modelUsage for a new session,
//     else the results' usage summed, and total_cost_usd. duration_ms summed
//     over the results; the model: the API model id of the main agent's
//     last assistant message, else the system/init model without the CLI's
//     context-size label such as "[1m]"), or, when is_error is true or the
//     subtype is not "success", error with the result text (code
//     provider_error for an API error reported with subtype "success",
//     run_failed otherwise), still carrying the usage. A result while
//     background tasks run (system/background_tasks_changed) is not the
//     end of the run.
//
// Consecutive text blocks (and thinking blocks) are separated by a blank
// line, so the deltas of a run read as one text. A process that exits
// without a result line is an error (run_failed) with its exit status and
// the tail of its stderr. A configured timeout that expires kills the
// process group and is an error with code timeout. A CLI that has printed
// its last result and stays silent and alive for ExitGrace (it happens:
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
	_ ports.RunAdmitter       = (*Adapter)(nil)
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
	model    string      // from system/init
	apiModel string      // from the main agent's last assistant message
	result   *resultLine // the last result line
	// Usage over every result line: their usage objects summed, and
	// their model_usage_since_last_result (with its cost) summed, if any
	// carried one.
	sum       usage
	since     usage
	sinceCost float64
	sawSince  bool
	duration  int64 // the results' duration_ms summed
	tasks     int   // background tasks running, per background_tasks_changed
	done      bool  // a result with nothing running and nothing after it
	// What the previous text-bearing block was, to separate blocks.
	sawText, sawThinking bool
	// In partial mode: a new text or thinking block has started.
	newText, newThinking bool
	// In partial mode: what the deltas of the latest streamed message
	// carried, for the whole assistant messages to be checked against.
	cur streamed
}

// streamed is what the deltas of one message carried, and how much of it
// the whole assistant messages have matched so far.
type streamed struct {
	text, thinking carried
}

// carried is one kind of a message's deltas: got grows by each (a
// Builder, not +=, which copied the whole message at every delta).
type carried struct {
	got  strings.Builder
	used int
}

type line struct {
	Type      string          `json:"type"`
	Error     json.RawMessage `json:"error"`
	Subtype   string          `json:"subtype"`
	SessionID string          `json:"session_id"`
	Model     string          `json:"model"`
	Message   json.RawMessage `json:"message"`
	Event     json.RawMessage `json:"event"`
	// ParentToolUseID is set on the lines of a subagent (the Agent or
	// Task tool): its work, not the run's answer.
	ParentToolUseID *string           `json:"parent_tool_use_id"`
	Tasks           []json.RawMessage `json:"tasks"` // system/background_tasks_changed
}

// apiRetry is a system/api_retry line: the API call that failed, and when
// the CLI tries again.
type apiRetry struct {
	Attempt      int64  `json:"attempt"`
	MaxRetries   int64  `json:"max_retries"`
	RetryDelayMS int64  `json:"retry_delay_ms"`
	ErrorStatus  *int64 `json:"error_status"` // null: no HTTP status (a connection error)
	Error        string `json:"error"`
	Parent       string `json:"parent_tool_use_id,omitempty"`
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
	// ModelUsage is the CLI's running total per model: every model call
	// of the process, subagents' too, and on --resume possibly the
	// session's earlier turns.
	ModelUsage map[string]modelUsage `json:"modelUsage"`
	// SinceLast is what the calls since the previous result line (or the
	// start of the process) used, per model.
	SinceLast map[string]modelUsage `json:"model_usage_since_last_result"`
	// PermissionDenials are the tool calls the CLI refused to run for
	// want of a permission (a Write outside work_dir, a Bash command not
	// allowed by --allowedTools or --permission-mode).
	PermissionDenials []denial `json:"permission_denials"`
}

// denial is one of a result's permission_denials, without its tool_input
// (the tool_use metadata with that id already carried it).
type denial struct {
	ToolName  string `json:"tool_name"`
	ToolUseID string `json:"tool_use_id"`
}

type usage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

func (u *usage) add(v usage) {
	// Saturating: one absurd count the CLI relays must not wrap the sum.
	u.InputTokens = domain.AddTokens(u.InputTokens, v.InputTokens)
	u.OutputTokens = domain.AddTokens(u.OutputTokens, v.OutputTokens)
	u.CacheCreationInputTokens = domain.AddTokens(u.CacheCreationInputTokens, v.CacheCreationInputTokens)
	u.CacheReadInputTokens = domain.AddTokens(u.CacheReadInputTokens, v.CacheReadInputTokens)
}

type modelUsage struct {
	InputTokens              int64   `json:"inputTokens"`
	OutputTokens             int64   `json:"outputTokens"`
	CacheReadInputTokens     int64   `json:"cacheReadInputTokens"`
	CacheCreationInputTokens int64   `json:"cacheCreationInputTokens"`
	CostUSD                  float64 `json:"costUSD"`
}

// sumModels adds up per-model usage: its tokens, and its cost.
func sumModels(m map[string]modelUsage) (usage, float64) {
	var u usage
	var cost float64
	for _, mu := range m {
		u.add(usage{InputTokens: mu.InputTokens, OutputTokens: mu.OutputTokens,
			CacheCreationInputTokens: mu.CacheCreationInputTokens, CacheReadInputTokens: mu.CacheReadInputTokens})
		cost += mu.CostUSD
	}
	return u, cost
}

func (p *parser) Line(t *agent.Turn, raw []byte) error {
	var l line
	if json.Unmarshal(raw, &l) != nil {
		return nil
	}
	sub := l.ParentToolUseID != nil && *l.ParentToolUseID != ""
	switch l.Type {
	case "system":
		switch l.Subtype {
		case "init":
			// A second init starts another turn of the process (the
			// main agent taking up a background task's outcome).
			p.done = false
			p.model = cmp.Or(l.Model, p.model)
			return t.AgentSession(l.SessionID)
		case "background_tasks_changed":
			p.tasks = len(l.Tasks)
			if p.tasks > 0 {
				p.done = false
			}
		case "api_retry":
			// The API refused a call (429 rate limit, 529 overloaded,
			// 401, …) and the CLI waits to try again: with its backoff
			// that can be minutes of silence, which the caller should
			// see the reason for.
			var r apiRetry
			if json.Unmarshal(raw, &r) != nil {
				return nil
			}
			if sub {
				r.Parent = *l.ParentToolUseID
			}
			return t.Meta(map[string]apiRetry{"api_retry": r})
		}
	case "assistant":
		p.done = false
		var m struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(l.Message, &m)
		if m.Model == syntheticModel || (len(l.Error) > 0 && string(l.Error) != "null") {
			return nil
		}
		if sub {
			return p.tools(t, l.Message, *l.ParentToolUseID)
		}
		p.apiModel = cmp.Or(m.Model, p.apiModel)
		return p.assistant(t, l.Message)
	case "user":
		p.done = false
		parent := ""
		if sub {
			parent = *l.ParentToolUseID
		}
		return p.user(t, l.Message, parent)
	case "stream_event":
		p.done = false
		if p.partial && !sub {
			return p.streamEvent(t, l.Event)
		}
	case "result":
		var r resultLine
		if json.Unmarshal(raw, &r) != nil {
			return nil
		}
		p.result = &r
		p.done = p.tasks == 0
		var u usage
		_ = json.Unmarshal(r.Usage, &u)
		p.sum.add(u)
		p.duration += r.DurationMS
		if r.SinceLast != nil {
			su, cost := sumModels(r.SinceLast)
			p.since.add(su)
			p.sinceCost += cost
			p.sawSince = true
		}
		if err := t.AgentSession(r.SessionID); err != nil {
			return err
		}
		if len(r.PermissionDenials) > 0 {
			// Apart from the usage: a long list must not take it
			// along when the node cuts an oversized event.
			if err := t.Meta(map[string][]denial{"permission_denials": r.PermissionDenials}); err != nil {
				return err
			}
		}
		meta := map[string]any{"num_turns": r.NumTurns}
		if len(r.Usage) > 0 {
			meta["usage"] = r.Usage
		}
		return t.Meta(meta)
	}
	return nil
}

// Done reports whether a result has come with no background task still
// running and no other work after it.
func (p *parser) Done() bool { return p.done }

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
			if p.partial {
				err = catchUp(t, &p.cur.text, &p.sawText, domain.EventDelta, b.Text)
			} else {
				err = t.Text(domain.EventDelta, agent.Separate(&p.sawText, b.Text))
			}
		case "thinking":
			if p.partial {
				err = catchUp(t, &p.cur.thinking, &p.sawThinking, domain.EventReasoningDelta, b.Thinking)
			} else {
				err = t.Text(domain.EventReasoningDelta, agent.Separate(&p.sawThinking, b.Thinking))
			}
		case "tool_use":
			err = toolUse(t, b, "")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// catchUp handles a text or thinking block of a whole assistant message in
// partial mode: what the deltas already carried is not sent again; what
// they did not is. When the API stream breaks off, the CLI asks again
// without streaming, and the answer then comes only whole: the text the
// broken stream carried, if the answer starts with it, is continued, else
// the answer is a new block.
func catchUp(t *agent.Turn, c *carried, saw *bool, typ domain.EventType, text string) error {
	if text == "" {
		return nil
	}
	rest := c.got.String()[c.used:]
	switch {
	case strings.HasPrefix(rest, text):
		c.used += len(text)
		return nil
	case rest != "" && strings.HasPrefix(text, rest):
		c.used = c.got.Len()
		return t.Text(typ, text[len(rest):])
	}
	c.used = c.got.Len()
	return t.Text(typ, agent.Separate(saw, text))
}

// tools handles a subagent's assistant message: its tool calls are
// reported, marked with the tool use that runs the subagent; its text and
// thinking are its own work, not the run's answer, and are skipped.
func (p *parser) tools(t *agent.Turn, msg json.RawMessage, parent string) error {
	for _, b := range contentBlocks(msg) {
		if b.Type == "tool_use" {
			if err := toolUse(t, b, parent); err != nil {
				return err
			}
		}
	}
	return nil
}

func toolUse(t *agent.Turn, b block, parent string) error {
	input := b.Input
	if len(input) == 0 {
		input = json.RawMessage("{}")
	}
	use := map[string]any{"id": b.ID, "name": b.Name, "input": agent.ShrinkJSON(input)}
	if parent != "" {
		use["parent_tool_use_id"] = parent
	}
	return t.Work(map[string]any{"tool_use": use})
}

func (p *parser) user(t *agent.Turn, msg json.RawMessage, parent string) error {
	for _, b := range contentBlocks(msg) {
		if b.Type != "tool_result" {
			continue
		}
		text, cut := agent.Truncate(resultText(b.Content), agent.MaxSummary)
		res := map[string]any{"tool_use_id": b.ToolUseID, "is_error": b.IsError, "content": text, "truncated": cut}
		if parent != "" {
			res["parent_tool_use_id"] = parent
		}
		if err := t.Work(map[string]any{"tool_result": res}); err != nil {
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
	case "message_start":
		p.cur = streamed{}
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
			p.cur.text.got.WriteString(text)
			if p.newText && text != "" {
				text, p.newText = agent.Separate(&p.sawText, text), false
			}
			p.sawText = p.sawText || text != ""
			return t.Text(domain.EventDelta, text)
		case "thinking_delta":
			text := ev.Delta.Thinking
			p.cur.thinking.got.WriteString(text)
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
	u, cost := p.sum, r.TotalCostUSD
	switch {
	case p.sawSince:
		// This process's calls, whatever the CLI restored of a resumed
		// session's totals (which modelUsage and total_cost_usd count).
		u, cost = p.since, p.sinceCost
	case len(r.ModelUsage) > 0 && t.Resumed() == "":
		// A new session: the running total is this process's, subagents
		// included, which each result's usage is not.
		u, _ = sumModels(r.ModelUsage)
	}
	prompt := domain.AddTokens(domain.AddTokens(u.InputTokens, u.CacheCreationInputTokens), u.CacheReadInputTokens)
	usage := &domain.Usage{
		PromptTokens:     prompt,
		CompletionTokens: u.OutputTokens,
		TotalTokens:      domain.AddTokens(prompt, u.OutputTokens),
		CostUSD:          cost,
		DurationMS:       p.duration,
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
