// Package gemini is the runtime adapter for the Gemini CLI in headless
// mode.
//
// Each run starts the configured command (default "gemini") in the
// adapter's work_dir, directly (no shell), in a process group of its own, as
//
//	gemini --output-format stream-json [--model=<model>] [--resume=<session id>] <args…>
//
// where <model> is the run's target, else the adapter's first configured
// model (omitted when neither is set: the CLI then routes each prompt
// itself), and <args…> are the adapter's configured args (e.g.
// --approval-mode=auto_edit). The CLI's environment is clean: the node's
// base variables (PATH, HOME, …), then inherit_env, then env (e.g.
// GOOGLE_GEMINI_BASE_URL, or GEMINI_API_KEY through inherit_env). The prompt, the run input, goes
// on stdin, which the CLI reads as the prompt when stdin is not a terminal
// (it runs headless then): not in argv, where Linux refuses an argument over
// 128 KiB and every local user could read it in the process list.
//
// The CLI prints one JSON object per line; lines that are not JSON and
// unknown types are skipped. Mapping:
//
//   - init: session_id is the agent session id; a metadata event
//     {"agent_session_id":…} is sent once per id.
//   - message with role assistant → delta with its content (the CLI sends
//     deltas); the first text after a tool call, which starts a new answer
//     of the model, is preceded by a blank line when text came before it.
//     User messages (the prompt echoed) are skipped.
//   - tool_use → metadata {"tool_use":{"id","name","input"}} (tool_id,
//     tool_name, parameters; strings longer than 2 KiB cut); tool_result →
//     metadata {"tool_result":{"tool_use_id","is_error","content","truncated"}}
//     (is_error unless status is "success"; the output cut to 2 KiB; a
//     failed tool with no output gets its error's message as content).
//   - error{severity,message} → metadata {"error":message}; one with
//     severity "error" ends the run with that message if no result follows.
//   - result → metadata {"stats":{…}} (the CLI's stats as is), then, once
//     the process has exited, the terminal event: for status "success",
//     complete with usage (prompt tokens = stats.input_tokens, cached ones
//     included; completion tokens = total_tokens − input_tokens, i.e.
//     output_tokens plus the model's thinking, which output_tokens leaves
//     out (never less than output_tokens); total_tokens;
//     duration_ms; the model that answered last in stats.models, else the
//     init model unless it is "auto", else the requested one; stop reason
//     = status); otherwise error with the result's error message (code
//     provider_error for an error of the model API, run_failed else: the
//     CLI's own errors, worded as API errors too, have a Fatal… type),
//     still with usage.
//     The stats count every model call of the prompt, including the
//     routing call the CLI makes when no model is given.
//
// The CLI tells of a model API call that failed and that it retries (429
// rate limited, 5xx, a connection error; with its backoff that can be
// minutes without a line on stdout) only on stderr, as
//
//	Attempt <n> failed with status <code>. Retrying with backoff... <error>
//	Attempt <n> failed: <message>. Retrying after <ms>ms...
//
// (and the variants "failed with 429 error (no Retry-After header)",
// "failed with 5xx error", "failed."). Each such line, read as it comes, is
// sent as metadata {"api_retry":{"attempt","max_retries","retry_delay_ms",
// "error_status","error"}}, as the claude-code adapter sends Claude Code's
// retries: max_retries is null (the CLI does not say), retry_delay_ms null
// unless the line gives it, error_status null without a status, error the
// API's message (cut to 2 KiB). The other stderr lines are not sent.
//
// A process that exits without a result is an error (run_failed) with its
// exit status and the tail of its stderr. A configured timeout that expires
// kills the process group and is an error with code timeout. A CLI still
// running ExitGrace after its result, silent, has its process group
// stopped, and the run ends with that result (also when the timeout
// expires meanwhile).
//
// Sessions: for a run with a session id, the CLI's session id is stored
// once the session can be resumed: at the model's first text or tool call,
// or a successful result (the CLI drops a turn that failed before the model
// answered, an API error say, from the session, and refuses to resume a
// session left without turns). The next run in that session passes
// --resume=<id>.
// The CLI keeps its sessions per project directory, so work_dir should not
// change between the runs of a session. TerminateSession forgets the
// mapping. Cancelling ctx sends SIGTERM to the process group, SIGKILL after
// KillGrace (500 ms by default), and returns ctx.Err().
package gemini

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"

	"iop/adapters/runtime/internal/agent"
	"iop/domain"
	"iop/ports"
)

// DefaultCommand is the binary run when the config names none.
const DefaultCommand = "gemini"

// Adapter runs the Gemini CLI for one adapter instance. It is safe for
// concurrent use.
type Adapter struct {
	agent.Base
}

var (
	_ ports.RuntimeAdapter    = (*Adapter)(nil)
	_ ports.RunAdmitter       = (*Adapter)(nil)
	_ ports.SessionTerminator = (*Adapter)(nil)
	_ ports.SessionLister     = (*Adapter)(nil)
)

// New builds a gemini adapter; agents keeps the session mappings (nil: the
// adapter keeps no sessions). Errors are domain.ErrConfig.
func New(cfg domain.AdapterConfig, agents ports.AgentSessionStore) (*Adapter, error) {
	base, err := agent.NewBase(cfg, agents, "gemini", "gemini", DefaultCommand)
	if err != nil {
		return nil, err
	}
	return &Adapter{Base: base}, nil
}

// Argv returns the arguments (after the program name) for a run with model
// and session to resume, either of which may be empty. The prompt goes on
// stdin.
func (a *Adapter) Argv(model, resume string) []string {
	args := []string{"--output-format", "stream-json"}
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
		return agent.Invocation{Args: a.Argv(model, resume), Stdin: []byte(prompt), Notice: retryNotice}
	}
	return a.Run(ctx, req, sink, build, &parser{})
}

// parser reads one run's stream-json.
type parser struct {
	model   string // from init, unless "auto"
	session string // from init
	result  *resultLine
	fatal   *string
	sawText bool // an assistant message had text
	split   bool // a tool was used since the last text: the next is a new answer
}

type line struct {
	Type       string          `json:"type"`
	SessionID  string          `json:"session_id"`
	Model      string          `json:"model"`
	Role       string          `json:"role"`
	Content    string          `json:"content"`
	ToolName   string          `json:"tool_name"`
	ToolID     string          `json:"tool_id"`
	Parameters json.RawMessage `json:"parameters"`
	Status     string          `json:"status"`
	Output     json.RawMessage `json:"output"`
	Error      *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"` // tool_result with status "error"
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

type resultLine struct {
	Status string `json:"status"`
	Error  *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	Stats json.RawMessage `json:"stats"`
}

type stats struct {
	TotalTokens  int64           `json:"total_tokens"`
	InputTokens  int64           `json:"input_tokens"`
	OutputTokens int64           `json:"output_tokens"`
	DurationMS   int64           `json:"duration_ms"`
	Models       json.RawMessage `json:"models"`
}

func (p *parser) Line(t *agent.Turn, raw []byte) error {
	var l line
	if json.Unmarshal(raw, &l) != nil {
		return nil
	}
	switch l.Type {
	case "init":
		if l.Model != "auto" {
			p.model = l.Model
		}
		// Reported now, stored once the session can be resumed: the
		// CLI takes a turn that fails before the model answered out of
		// the session's history, and a session with no turn left it
		// refuses to resume ("No previous sessions found").
		p.session = l.SessionID
		return t.ReportAgentSession(l.SessionID)
	case "message":
		if l.Role == "assistant" && l.Content != "" {
			if err := t.KeepAgentSession(p.session); err != nil {
				return err
			}
			text := l.Content
			if p.split {
				// The model's answer after a tool call is a new block,
				// separated as the other CLI agents' are.
				text = agent.Separate(&p.sawText, text)
			}
			p.sawText, p.split = true, false
			return t.Text(domain.EventDelta, text)
		}
	case "tool_use":
		p.split = true
		if err := t.KeepAgentSession(p.session); err != nil {
			return err
		}
		input := l.Parameters
		if len(input) == 0 {
			input = json.RawMessage("{}")
		}
		return t.Work(map[string]any{"tool_use": map[string]any{"id": l.ToolID, "name": l.ToolName, "input": agent.ShrinkJSON(input)}})
	case "tool_result":
		out := outputText(l.Output)
		if out == "" && l.Error != nil {
			out = l.Error.Message
		}
		text, cut := agent.Truncate(out, agent.MaxSummary)
		return t.Work(map[string]any{"tool_result": map[string]any{
			"tool_use_id": l.ToolID, "is_error": l.Status != "success", "content": text, "truncated": cut,
		}})
	case "error":
		msg := cmp.Or(l.Message, "gemini reported an error")
		if l.Severity == "error" {
			p.fatal = &msg
		}
		return t.Meta(map[string]string{"error": msg})
	case "result":
		var r resultLine
		if json.Unmarshal(raw, &r) != nil {
			return nil
		}
		p.result = &r
		if r.Status == "success" {
			if err := t.KeepAgentSession(p.session); err != nil {
				return err
			}
		}
		if len(r.Stats) > 0 {
			return t.Meta(map[string]json.RawMessage{"stats": r.Stats})
		}
	}
	return nil
}

// Done reports whether the result line has come: the CLI's last.
func (p *parser) Done() bool { return p.result != nil }

// outputText returns a tool's output: a string as is, anything else as JSON.
func outputText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// lastKey returns the last key of a JSON object, in the order sent: the
// model that answered last.
func lastKey(raw json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	last := ""
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return last
		}
		key, _ := tok.(string)
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return last
		}
		last = key
	}
	return last
}

func (p *parser) End(t *agent.Turn, exit *os.ProcessState, stderr string) domain.RunEvent {
	r := p.result
	if r == nil {
		if p.fatal != nil {
			return agent.Failed(domain.CodeRunFailed, *p.fatal)
		}
		return agent.ExitFailure("gemini", exit, stderr)
	}
	var s stats
	_ = json.Unmarshal(r.Stats, &s)
	total := cmp.Or(s.TotalTokens, domain.AddTokens(s.InputTokens, s.OutputTokens))
	// output_tokens counts the answer's tokens but not the thinking
	// before it, which total_tokens does (and which is billed as output):
	// the completion is all that is not prompt.
	completion := max(s.OutputTokens, total-s.InputTokens)
	usage := &domain.Usage{
		PromptTokens:     s.InputTokens,
		CompletionTokens: completion,
		TotalTokens:      total,
		DurationMS:       s.DurationMS,
		StopReason:       r.Status,
		Model:            cmp.Or(lastKey(s.Models), p.model, t.Model()),
	}
	if r.Status == "success" {
		return domain.RunEvent{Type: domain.EventComplete, Usage: usage}
	}
	code, msg := domain.CodeRunFailed, "gemini: "+cmp.Or(r.Status, "error")
	if p.fatal != nil {
		// An invalid stream (empty answer, safety block, …) is told on an
		// error line; its result line then carries no error of its own.
		msg = *p.fatal
	}
	if r.Error != nil && r.Error.Message != "" {
		msg = r.Error.Message
		if apiError(r.Error.Type, msg) {
			code = domain.CodeProviderError
		}
	}
	ev := agent.Failed(code, msg)
	ev.Usage = usage
	return ev
}

// apiError reports whether a result's error is the model API's. The CLI
// words every error it ends on as "[API Error: …]", its own too (a slash
// command it cannot run headless, "/quit", say); those carry the name of
// its error class as their type (FatalInputError, FatalConfigError, …),
// the API's do not.
func apiError(typ, msg string) bool {
	return strings.Contains(msg, "API Error") && !strings.HasPrefix(typ, "Fatal")
}

// retryLine matches the CLI's notice of an API call it retries (its
// logRetryAttempt and retryWithBackoff, gemini-cli 0.61).
var retryLine = regexp.MustCompile(`^Attempt (\d+) failed(.*?)\. Retrying (?:with backoff|after (\d+)ms)\.\.\.(?: (.*))?$`)

// apiRetry is the api_retry metadata: claude-code's shape.
type apiRetry struct {
	Attempt      int64  `json:"attempt"`
	MaxRetries   *int64 `json:"max_retries"`    // null: the CLI does not say
	RetryDelayMS *int64 `json:"retry_delay_ms"` // null: not told (a jittered backoff)
	ErrorStatus  *int64 `json:"error_status"`   // null: no HTTP status told
	Error        string `json:"error"`
}

// retryNotice returns the api_retry metadata for a stderr line telling of
// a retried API call, nil for any other line. It is Invocation.Notice: it
// only reads line.
func retryNotice(line []byte) any {
	m := retryLine.FindSubmatch(line)
	if m == nil {
		return nil
	}
	r := apiRetry{}
	var err error
	if r.Attempt, err = strconv.ParseInt(string(m[1]), 10, 64); err != nil {
		return nil
	}
	how, msg := string(m[2]), ""
	switch {
	case strings.HasPrefix(how, " with status "):
		if code, err := strconv.ParseInt(strings.TrimPrefix(how, " with status "), 10, 64); err == nil {
			r.ErrorStatus = &code
		}
	case strings.HasPrefix(how, " with 429 error"):
		code := int64(429)
		r.ErrorStatus = &code
	case how == " with 5xx error":
		msg = "5xx error"
	case strings.HasPrefix(how, ": "):
		msg = strings.TrimPrefix(how, ": ")
	}
	if len(m[3]) > 0 {
		if ms, err := strconv.ParseInt(string(m[3]), 10, 64); err == nil {
			r.RetryDelayMS = &ms
		}
	}
	if len(m[4]) > 0 {
		msg = errorText(string(m[4]))
	}
	r.Error, _ = agent.Truncate(strings.ToValidUTF8(msg, "\uFFFD"), agent.MaxSummary)
	return map[string]apiRetry{"api_retry": r}
}

// errorText is the error printed after a retry notice: for the API's
// ("_ApiError: {"error":{"code","message","status"}}") its message, else
// the text as printed.
func errorText(s string) string {
	_, body, ok := strings.Cut(s, ": ")
	if !ok || !strings.HasPrefix(body, "{") {
		return s
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) != nil || e.Error.Message == "" {
		return s
	}
	return e.Error.Message
}
