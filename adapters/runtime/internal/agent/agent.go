// Package agent is what the CLI agent runtime adapters (claude-code, codex,
// gemini) share: running the CLI for one run with the prompt and resume id,
// reading its JSON lines through an adapter-specific Parser, remembering the
// agent's own session id against the run's session (and, once a turn
// completes, counting it and keeping the agent's running usage totals), and
// ending the run with exactly one terminal event.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"iop/adapters/runtime/internal/lines"
	"iop/adapters/runtime/internal/proc"
	"iop/adapters/runtime/internal/runlimit"
	"iop/domain"
	"iop/ports"
)

// DefaultKillGrace is how long a cancelled agent has between SIGTERM and
// SIGKILL. The CLIs append to their session files as they go, so there is
// little to save; on a loaded machine they can take seconds to wind down
// on SIGTERM, and a cancel must end the whole process group within a
// second.
const DefaultKillGrace = 500 * time.Millisecond

// DefaultExitGrace is how long a CLI has to exit once it has printed the
// line that ends its run (its result) and gone quiet. Some do not exit at
// all (Claude Code, anthropics/claude-code#25629): their process group is
// then stopped as on cancel, and the run ends with the result they
// reported.
const DefaultExitGrace = 5 * time.Second

// Invocation is how to start the CLI for one run.
type Invocation struct {
	Args  []string // argv after the program name
	Stdin []byte   // nil: /dev/null
	// Notice, if set, reads one line of the CLI's stderr (at most
	// proc.MaxStderrLine bytes) as it comes and returns what it reports,
	// sent as a metadata event holding it as JSON, or nil for a line that
	// reports nothing: for a CLI that tells some things only there (the
	// Gemini CLI's API retries). It runs on the goroutine copying stderr,
	// so it must not block, keep line, or touch the parser: the events go
	// out from Execute's own goroutine, between the parser's. At most
	// MaxNotices are sent per run; one that comes while maxQueuedNotices
	// are still waiting to be sent (the sink holding the run back) is
	// dropped.
	Notice func(line []byte) any
}

// MaxNotices is the most Invocation.Notice events one run sends.
const MaxNotices = 256

// maxQueuedNotices is how many notices may wait to be sent: the events of
// a CLI's stderr never hold it up.
const maxQueuedNotices = 16

// Parser turns one run's output into events. A new Parser serves each run.
type Parser interface {
	// Line handles one line of stdout. Non-JSON lines and unknown types
	// should be skipped; an error (the sink's, or the session store's) ends
	// the run at once.
	Line(t *Turn, line []byte) error
	// End returns the terminal event once the CLI has exited. exit is nil
	// when the process could not be waited for; stderr is its tail.
	End(t *Turn, exit *os.ProcessState, stderr string) domain.RunEvent
	// Done reports whether the lines so far hold the end of the run (its
	// result): the CLI has nothing left to do but exit.
	Done() bool
}

// Runner runs one configured CLI agent.
type Runner struct {
	Name      string // the adapter instance's name
	Label     string // the agent, for messages: "claude", "codex"
	Command   string
	WorkDir   string
	Models    []string
	Timeout   time.Duration
	KillGrace time.Duration
	// ExitGrace is how long the CLI may stay silent and alive once the
	// parser is Done before its group is stopped (SIGTERM, SIGKILL after
	// KillGrace); zero or negative: DefaultExitGrace.
	ExitGrace time.Duration
	Store     ports.AgentSessionStore // nil: no sessions
	// Env and InheritEnv build the CLI's clean environment (proc.Environ):
	// the node's token and provider keys reach it only when named here.
	Env        map[string]string
	InheritEnv []string
}

// Check refuses a run Execute would refuse for its content: a blank prompt
// (the run input). It is an invalid_request error.
func (r *Runner) Check(req domain.RunRequest) error {
	if strings.TrimSpace(string(req.Input)) == "" {
		return domain.Errorf(domain.CodeInvalidRequest, "%s adapter %q: the run input (the prompt) is empty", r.Label, r.Name)
	}
	return nil
}

// Execute runs req: build gets the model ("" for the CLI's default), the
// agent session id to resume ("" for a new one) and the prompt (the run
// input, which must not be blank). It emits {"pid":N} as the first event,
// then whatever the parser emits, then the parser's terminal event. A
// cancelled ctx stops the process group (SIGTERM, SIGKILL after KillGrace)
// and returns ctx.Err(); an expired timeout is an error event with code
// timeout, unless the parser was already Done. A CLI that is still running
// ExitGrace after its last line, with the parser Done, is stopped the same
// way and its run ends with the parser's terminal event: the kill that
// ended it is no failure.
func (r *Runner) Execute(ctx context.Context, req domain.RunRequest, sink ports.EventSink, build func(model, resume, prompt string) Invocation, p Parser) error {
	if err := r.Check(req); err != nil {
		return err
	}
	model := req.Target
	if model == "" && len(r.Models) > 0 {
		model = r.Models[0]
	}
	t := &Turn{ctx: ctx, sink: sink, req: req, model: model, r: r}
	if req.SessionID != "" {
		if r.Store == nil {
			return domain.Errorf(domain.CodeSessionUnsupported, "%s adapter %q has no session store", r.Label, r.Name)
		}
		s, ok, err := r.Store.GetAgentSession(ctx, r.Name, req.SessionID)
		if err != nil {
			return fmt.Errorf("load session %q: %w", req.SessionID, err)
		}
		if ok {
			t.resumed, t.agentID, t.prev = s.AgentID, s.AgentID, s.Totals
		}
	}
	inv := build(model, t.resumed, string(req.Input))

	limit := runlimit.New(ctx, r.Timeout)
	defer limit.Stop()
	// procCtx ends the process: with the run's limit, or once the CLI
	// lingers after reporting its end.
	procCtx, stopProc := context.WithCancel(limit.Context())
	defer stopProc()
	notices := startNotices(inv.Notice)
	p0, err := proc.Start(procCtx, proc.Spec{
		Path: r.Command, Args: inv.Args, Dir: r.WorkDir, Stdin: inv.Stdin, KillGrace: r.KillGrace,
		Env: proc.Environ(r.Env, r.InheritEnv), StderrLine: notices.stderrLine(),
	})
	if err != nil {
		return domain.Errorf(domain.CodeRunFailed, "start %s: %v", r.Label, err)
	}
	if err := t.Meta(map[string]int{"pid": p0.PGID()}); err != nil {
		p0.Kill()
		return err
	}
	grace := r.ExitGrace
	if grace <= 0 {
		grace = DefaultExitGrace
	}
	linger := time.AfterFunc(grace, stopProc)
	linger.Stop()
	defer linger.Stop()
	// The stdout lines come from a goroutine of their own, one at a time
	// (the next is read once the last is handled: the reader keeps the
	// CLI's pace), so that the notices of stderr are sent while stdout is
	// silent; all events still go out from this goroutine.
	out := readLines(p0.Stdout)
	defer out.stop()
	for ended := false; !ended; {
		select {
		case v := <-notices.c:
			if err := notices.send(t, v); err != nil {
				p0.Kill()
				return err
			}
		case l := <-out.c:
			if l.err != nil {
				if !errors.Is(l.err, io.EOF) {
					p0.Kill()
				}
				ended = true
				break
			}
			err := p.Line(t, l.b)
			out.next()
			if err != nil {
				p0.Kill()
				return err
			}
			// The grace counts from the CLI's last line: one still
			// talking is not stuck.
			if p.Done() {
				linger.Reset(grace)
			} else {
				linger.Stop()
			}
		}
	}
	// A CLI may end its stdout before it exits: its notices still go out
	// as they come, not only the last maxQueuedNotices of them.
	for exited := false; !exited; {
		select {
		case v := <-notices.c:
			if err := notices.send(t, v); err != nil {
				p0.Kill()
				return err
			}
		case <-p0.Done():
			exited = true
		}
	}
	state := p0.Wait()
	linger.Stop()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// What stderr told before the CLI exited goes out before its end.
	if err := notices.drain(t); err != nil {
		return err
	}
	// A CLI that reported its end and was then stopped (it lingered, or
	// the limit expired while it did) finished its work: its result
	// stands, and the signal that ended it is not its exit status.
	finished := p.Done() && p0.Stopped()
	if limit.Expired() && p0.Stopped() && !finished {
		// Only a CLI the limit ended timed out: one that exited in time
		// keeps its result, however long relaying its output took.
		return sink.Emit(limit.Event(r.Label))
	}
	ev := p.End(t, state, p0.Stderr())
	if ev.Type == domain.EventComplete && state != nil && !state.Success() && !finished {
		// A result, then a non-zero exit (a session file it could not
		// write, say): the CLI failed, as its exit status says, and its
		// stderr tells why. The usage it reported was spent all the same.
		failed := ExitFailure(r.Label, state, p0.Stderr())
		failed.Usage = ev.Usage
		ev = failed
	}
	if ev.Type == domain.EventError && ev.Error != nil && t.resumed != "" && !t.spoke {
		// A CLI asked to resume a conversation it no longer has (its HOME
		// or work_dir changed, its store was wiped) fails every run of the
		// session in its own words ("No conversation found", "no rollout
		// found", "No previous sessions found"), and the session stays
		// stuck on it: say what was resumed and how to start afresh.
		// The CLI's own message is cut first, so that the node's cut of
		// the whole (domain.MaxPeerMessage) leaves the way out whole.
		hint := fmt.Sprintf(" (this run resumed %s's conversation %s for session %q; if %s no longer has it, end the session — DELETE /v1/sessions/%s?adapter=%s, or iop session end %s --adapter %s — and run again)",
			r.Label, t.resumed, req.SessionID, r.Label, url.PathEscape(req.SessionID), url.QueryEscape(r.Name), req.SessionID, r.Name)
		ev.Error.Message = domain.ClipMessage(ev.Error.Message, max(domain.MaxPeerMessage/2, domain.MaxPeerMessage-len(hint))) + hint
	}
	if ev.Type == domain.EventComplete && req.SessionID != "" && t.agentID != "" {
		if err := r.Store.EndAgentTurn(ctx, r.Name, req.SessionID, t.totals); err != nil {
			return fmt.Errorf("save session %q: %w", req.SessionID, err)
		}
	}
	return sink.Emit(ev)
}

// Turn is one run as a Parser sees it.
type Turn struct {
	ctx     context.Context
	sink    ports.EventSink
	req     domain.RunRequest
	model   string
	r       *Runner
	resumed string // the agent session id passed to the CLI, if any
	spoke   bool   // the CLI emitted text or work (Work): it had the conversation
	agentID string // the latest agent session id known
	sent    string // the agent session id this run last reported
	prev    domain.AgentTotals
	totals  domain.AgentTotals
}

// Previous returns the agent's running totals at the end of the session's
// last completed turn: zero for a new session, or when the CLI did not
// continue the session it was asked to resume.
func (t *Turn) Previous() domain.AgentTotals {
	if t.resumed == "" || t.agentID != t.resumed {
		return domain.AgentTotals{}
	}
	return t.prev
}

// Resumed returns the agent session id the CLI was asked to resume, "" for
// a new one.
func (t *Turn) Resumed() string { return t.resumed }

// SetTotals records the agent's running totals as of this turn, kept with
// the session if the turn completes.
func (t *Turn) SetTotals(tot domain.AgentTotals) { t.totals = tot }

// Model returns the model the run asked for ("" for the CLI's default).
func (t *Turn) Model() string { return t.model }

// Emit sends an event.
func (t *Turn) Emit(ev domain.RunEvent) error {
	if ev.Type == domain.EventDelta || ev.Type == domain.EventReasoningDelta {
		t.spoke = true
	}
	return t.sink.Emit(ev)
}

// Text sends a delta or reasoning_delta event; empty text sends nothing.
func (t *Turn) Text(typ domain.EventType, text string) error {
	if text == "" {
		return nil
	}
	return t.Emit(domain.RunEvent{Type: typ, Text: text})
}

// Work sends a metadata event holding v as JSON for the agent's work in the
// conversation (a tool call, its result, an item it did): like text, it
// shows the CLI had the conversation it was asked to resume.
func (t *Turn) Work(v any) error {
	t.spoke = true
	return t.Meta(v)
}

// Meta sends a metadata event holding v as JSON.
func (t *Turn) Meta(v any) error {
	b, err := Marshal(v)
	if err != nil {
		return fmt.Errorf("encode metadata: %w", err)
	}
	return t.sink.Emit(domain.RunEvent{Type: domain.EventMetadata, Metadata: b})
}

// AgentSession records the agent's own session id, as soon as the CLI
// reports it: the first time a run sees an id, a metadata event
// {"agent_session_id":id} goes out — a resumed run too, whose caller may
// read the id from its own stream — and, for a run in a session, an id
// other than the stored one is stored so that the session's next run
// resumes it.
func (t *Turn) AgentSession(id string) error {
	if id == "" || id == t.sent {
		return nil
	}
	if err := t.KeepAgentSession(id); err != nil {
		return err
	}
	return t.ReportAgentSession(id)
}

// ReportAgentSession sends the metadata event {"agent_session_id":id} the
// first time a run sees id, without storing it: for a CLI whose session
// cannot be resumed yet (see KeepAgentSession).
func (t *Turn) ReportAgentSession(id string) error {
	if id == "" || id == t.sent {
		return nil
	}
	t.sent = id
	return t.Meta(map[string]string{"agent_session_id": id})
}

// KeepAgentSession stores id, for a run in a session, as the agent session
// the session's next run resumes, unless it is stored already. It sends no
// event: AgentSession does both.
func (t *Turn) KeepAgentSession(id string) error {
	if id == "" || id == t.agentID {
		return nil
	}
	t.agentID = id
	if t.req.SessionID != "" {
		if err := t.r.Store.PutAgentSession(t.ctx, t.r.Name, t.model, t.req.SessionID, id); err != nil {
			return fmt.Errorf("save session %q: %w", t.req.SessionID, err)
		}
	}
	return nil
}

// Failed builds an error event.
func Failed(code, msg string) domain.RunEvent {
	return domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: code, Message: msg}}
}

// ExitFailure is the terminal event for a CLI that exited without reporting
// a result: its exit status and stderr tail when it failed, else a note
// that no result came.
func ExitFailure(label string, exit *os.ProcessState, stderr string) domain.RunEvent {
	if exit == nil {
		return Failed(domain.CodeRunFailed, label+" could not be waited for")
	}
	if exit.Success() {
		msg := label + " exited without reporting a result"
		if stderr != "" {
			msg += ": " + stderr
		}
		return Failed(domain.CodeRunFailed, msg)
	}
	msg := label + ": " + exit.String()
	if stderr != "" {
		msg += ": " + stderr
	}
	return Failed(domain.CodeRunFailed, msg)
}

// Sessions are the mappings of one adapter instance, for TerminateSession
// and ListSessions.
type Sessions struct {
	Store ports.AgentSessionStore
	Name  string
}

// Terminate forgets the mapping of sessionID; a session with no mapping
// is session_not_found.
func (s Sessions) Terminate(ctx context.Context, sessionID string) error {
	if s.Store == nil {
		return domain.Errorf(domain.CodeSessionUnsupported, "adapter %q keeps no sessions", s.Name)
	}
	found, err := s.Store.DeleteAgentSession(ctx, s.Name, sessionID)
	if err != nil {
		return err
	}
	if !found {
		return domain.Errorf(domain.CodeSessionNotFound, "adapter %q has no session %q", s.Name, sessionID)
	}
	return nil
}

// List returns the page q asks for of the stored mappings.
func (s Sessions) List(ctx context.Context, q domain.SessionQuery) ([]domain.SessionInfo, error) {
	if s.Store == nil {
		return []domain.SessionInfo{}, nil
	}
	return s.Store.ListAgentSessions(ctx, s.Name, q)
}

// Marshal encodes v as compact JSON without escaping <, > and &.
func Marshal(v any) ([]byte, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return []byte(strings.TrimSuffix(b.String(), "\n")), nil
}

// Separate prefixes a new block's text with a blank line when an earlier
// block of the same kind had text (*saw), so that the deltas of a run read
// as one text; it sets *saw once text is non-empty.
func Separate(saw *bool, text string) string {
	if text == "" {
		return ""
	}
	if *saw {
		text = "\n\n" + text
	}
	*saw = true
	return text
}

// NewTurn returns a Turn outside a Runner: a run without a session that
// asked for model, its events going to sink. For feeding a Parser lines in
// its tests.
func NewTurn(ctx context.Context, sink ports.EventSink, model string) *Turn {
	return &Turn{ctx: ctx, sink: sink, model: model, r: &Runner{}}
}

// notices carries what Invocation.Notice made of the CLI's stderr lines to
// Execute's goroutine.
type notices struct {
	c    chan any // nil (never ready) without a Notice
	sent int
	fn   func([]byte) any
}

func startNotices(fn func([]byte) any) *notices {
	n := &notices{fn: fn}
	if fn != nil {
		n.c = make(chan any, maxQueuedNotices)
	}
	return n
}

// line is proc.Spec.StderrLine: it never blocks.
func (n *notices) line(b []byte) {
	v := n.fn(b)
	if v == nil {
		return
	}
	select {
	case n.c <- v:
	default: // the queue is full: this one is dropped
	}
}

// stderrLine returns the proc.Spec.StderrLine that feeds n, nil without a
// Notice.
func (n *notices) stderrLine() func([]byte) {
	if n.fn == nil {
		return nil
	}
	return n.line
}

func (n *notices) send(t *Turn, v any) error {
	if n.sent >= MaxNotices {
		return nil
	}
	n.sent++
	return t.Meta(v)
}

// drain sends the notices still queued.
func (n *notices) drain(t *Turn) error {
	for {
		select {
		case v := <-n.c:
			if err := n.send(t, v); err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// lineReader reads a CLI's stdout lines on a goroutine of its own, handing
// over one at a time.
type lineReader struct {
	c    chan stdoutLine
	more chan struct{}
	quit chan struct{}
	done chan struct{}
}

type stdoutLine struct {
	b   []byte // valid until next
	err error  // the reader's last word: io.EOF at the end
}

func readLines(r io.Reader) *lineReader {
	lr := &lineReader{c: make(chan stdoutLine), more: make(chan struct{}), quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(lr.done)
		in := lines.NewReader(r, 0)
		for {
			b, err := in.Next()
			select {
			case lr.c <- stdoutLine{b, err}:
			case <-lr.quit:
				return
			}
			if err != nil {
				return
			}
			select {
			case <-lr.more:
			case <-lr.quit:
				return
			}
		}
	}()
	return lr
}

// next lets the reader read the next line: the last one is no longer used.
func (lr *lineReader) next() {
	select {
	case lr.more <- struct{}{}:
	case <-lr.done:
	}
}

// stop ends the reader once its stdout has ended or been closed (Kill),
// and waits for it.
func (lr *lineReader) stop() {
	close(lr.quit)
	<-lr.done
}
