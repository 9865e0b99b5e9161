// Package ports holds the small interfaces the use cases need, named by what
// the consumer needs rather than by technology.
package ports

import (
	"context"
	"fmt"
	"io"

	"iop/domain"
)

// EventSink receives the events of one run. Emit may block while the
// receiver applies back-pressure; it returns an error once the run's stream
// is gone (cancelled, connection lost), after which the caller should stop.
// The run manager fills RunID, Seq and Time; adapters set the rest.
type EventSink interface {
	Emit(ev domain.RunEvent) error
}

// Finisher is implemented by the EventSink the run manager gives an
// adapter. An adapter about to write what only a completed run may leave
// behind (a chat turn in its session's history) calls Finish first: it
// fails, as Emit does, once the run is being cancelled, and after it has
// succeeded no cancel can claim the run, so a run reported cancelled never
// leaves that write behind. The adapter then emits its terminal event, or
// returns an error and the run fails.
type Finisher interface {
	Finish() error
}

// RuntimeAdapter executes runs of one configured adapter instance.
//
// Execute blocks until the run is over. It should emit at most one terminal
// event (complete, error or cancelled); if it returns without one, the run
// manager synthesizes it from the returned error. When ctx is cancelled,
// Execute must stop the work (kill the process, close the upstream request)
// and return promptly.
type RuntimeAdapter interface {
	Capabilities() domain.Capabilities
	Execute(ctx context.Context, req domain.RunRequest, sink EventSink) error
}

// RunAdmitter is implemented by runtime adapters that can tell before a run
// starts whether they can serve it (an exec target that exists). The node
// refuses such a run before acknowledging it, so the edge can answer the
// caller with an honest status instead of a started run that fails.
type RunAdmitter interface {
	Admit(req domain.RunRequest) error
}

// SessionTerminator is implemented by runtime adapters that keep logical
// sessions. Terminating an unknown session is not an error.
type SessionTerminator interface {
	TerminateSession(ctx context.Context, target, sessionID string) error
}

// SessionLister is implemented by runtime adapters that keep logical
// sessions. ListSessions returns the page q asks for (see
// domain.SessionQuery), in listing order, the sessions keyed by the
// adapter's configured name (as its store keeps them).
type SessionLister interface {
	ListSessions(ctx context.Context, q domain.SessionQuery) ([]domain.SessionInfo, error)
}

// CommandRunner is implemented by runtime adapters that serve node commands
// (for example the ollama.* family). progress may be called any number of
// times before the final result; it returns an error when the caller is gone.
type CommandRunner interface {
	RunCommand(ctx context.Context, name string, args []byte, progress func(json []byte) error) (result []byte, err error)
}

// AdapterFactory builds a runtime adapter instance from its pushed config.
// Instances may implement io.Closer; they are closed once no run uses them.
type AdapterFactory interface {
	Build(cfg domain.AdapterConfig) (RuntimeAdapter, error)
}

// RunStore is the node's local record of runs.
type RunStore interface {
	CreateRun(ctx context.Context, run *domain.Run) error
	// UpdateRun loads the run, applies fn and saves it in one transaction.
	UpdateRun(ctx context.Context, id string, fn func(*domain.Run) error) error
	GetRun(ctx context.Context, id string) (*domain.Run, error) // domain.ErrRunNotFound
	ListRuns(ctx context.Context, f domain.RunFilter) ([]*domain.Run, error)
	UsageByAdapter(ctx context.Context) ([]domain.UsageSummary, error)
}

// ChatSessionStore keeps the message history of chat sessions (ollama, openai
// runtime adapters) so they survive a node restart.
type ChatSessionStore interface {
	// LoadChat returns the session's messages in order; an unknown session
	// has none. With maxBytes > 0 it returns only what a turn may replay:
	// the leading system/developer messages, then the newest whole turns (a
	// turn starts at a user message) whose messages' JSON sizes sum to at
	// most maxBytes, and always the latest turn; of a latest turn alone past
	// maxBytes (a tool loop: one user message, then tool calls and results),
	// its opening (its user message up to its first assistant message) and
	// its newest tool-call groups (each from an assistant message up to the
	// next) that fit with it, at least the newest — so a long session costs
	// a turn its bound, not its length.
	LoadChat(ctx context.Context, adapter, sessionID string, maxBytes int) ([]domain.ChatMessage, error)
	// AppendChat adds messages to the end of a session, creating it if needed.
	AppendChat(ctx context.Context, adapter, target, sessionID string, msgs []domain.ChatMessage) error
	// DeleteChat removes the session's history and reports whether there
	// was any: an unknown session is no error, but found is false.
	DeleteChat(ctx context.Context, adapter, sessionID string) (found bool, err error)
	// ListChats returns the page q asks for of the chat sessions of adapter
	// ("" means every adapter), in listing order (domain.SessionQuery).
	// Target is the one given with the most recent append; Turns counts the
	// replies of completed runs; LastUsed is the last append.
	ListChats(ctx context.Context, adapter string, q domain.SessionQuery) ([]domain.SessionInfo, error)
}

// AgentSessionStore maps a run's session id to a CLI agent's own session id
// (claude-code, codex, gemini), so the next run resumes it, and counts the
// session's completed turns.
type AgentSessionStore interface {
	GetAgentSession(ctx context.Context, adapter, sessionID string) (s domain.AgentSession, ok bool, err error)
	// PutAgentSession stores the agent's id for the session; when it differs
	// from the one stored, the stored Totals restart from zero.
	PutAgentSession(ctx context.Context, adapter, target, sessionID, agentID string) error
	// EndAgentTurn counts one completed turn of a stored session and keeps
	// the agent's running totals as of its end; an unknown session is not
	// an error (it was terminated meanwhile).
	EndAgentTurn(ctx context.Context, adapter, sessionID string, totals domain.AgentTotals) error
	// DeleteAgentSession removes the mapping and reports whether there was
	// one: an unknown session is no error, but found is false.
	DeleteAgentSession(ctx context.Context, adapter, sessionID string) (found bool, err error)
	// ListAgentSessions returns the page q asks for of the mappings of
	// adapter ("" means every adapter), in listing order
	// (domain.SessionQuery). LastUsed is the last Put or EndAgentTurn.
	ListAgentSessions(ctx context.Context, adapter string, q domain.SessionQuery) ([]domain.SessionInfo, error)
}

// TransportStatus reports the node's link to the edge for transport_status.
type TransportStatus interface {
	TransportStatus() TransportStats
}

// TransportStats is a snapshot of the node's link.
type TransportStats struct {
	Connected      bool
	ConnectedSince int64 // unix nanoseconds; 0 when not connected
	Reconnects     int64
	LastRTTNanos   int64
	FramesIn       int64
	FramesOut      int64
	BytesIn        int64
	BytesOut       int64
	Edge           string
}

// ProviderResponse is an open upstream response: status and headers are
// known, the body is read as it arrives.
type ProviderResponse struct {
	Status int
	Header domain.Header
	Body   io.ReadCloser
	// Usage, if set, reports the token usage seen in the body once it has
	// been read to the end; nil when the provider reported none.
	Usage func() *domain.Usage
	// StreamError, if set, reports the first error the provider stated
	// inside a streamed body (an Anthropic `event: error`, an OpenAI
	// `data: {"error":…}` chunk, an Ollama `{"error":…}` line) once it has
	// been read; nil when it stated none.
	StreamError func() *domain.ProviderStreamError
}

// ProviderClient makes HTTP requests to a node's providers for the raw tunnel.
type ProviderClient interface {
	Do(ctx context.Context, p domain.ProviderConfig, req domain.TunnelRequest, body io.Reader) (*ProviderResponse, error)
}

// RunOutput is where the node sends one run's events (the link to the edge).
// Emit waits for the edge's credit; it returns ctx's error if ctx ends first,
// and an error once the stream is gone. An event Emit failed on was not sent.
// Done is closed when the edge abandons the run or the link is lost; Close
// ends the stream after the terminal event.
type RunOutput interface {
	Emit(ctx context.Context, ev domain.RunEvent) error
	Done() <-chan struct{}
	Close()
}

// TunnelSink is where the node sends one provider response, frame by frame.
// Send blocks under back-pressure and fails once the edge is gone. Send does
// not keep f.Body after it returns: the caller may reuse the buffer.
//
// A frame the link cannot carry at all (headers larger than one frame may
// be; bodies are cut into pieces and never are) fails with a
// *FrameTooLargeError before anything of it is sent: the sink is still
// usable, and the response should end with an error frame saying why.
type TunnelSink interface {
	Send(f domain.TunnelFrame) error
}

// FrameTooLargeError is TunnelSink.Send's refusal of a frame of Size bytes
// on a link that carries at most Max bytes in one or, when MaxElements is
// set, of a frame of Elements messages, strings and bytes values (header
// entries, names and values) on a link that carries at most MaxElements.
type FrameTooLargeError struct {
	Size, Max             int
	Elements, MaxElements int
}

func (e *FrameTooLargeError) Error() string {
	if e.MaxElements > 0 {
		return fmt.Sprintf("frame of %d header entries, names and values is more than the link carries (at most %d)", e.Elements, e.MaxElements)
	}
	return fmt.Sprintf("frame of %d bytes is larger than the link carries (at most %d)", e.Size, e.Max)
}

// ProviderCommands builds a command runner for a provider, so a node whose
// Ollama is declared only as a tunnel provider still answers ollama.*
// commands. ok is false when the provider's type serves no commands.
type ProviderCommands interface {
	CommandsFor(p domain.ProviderConfig) (runner CommandRunner, names []string, ok bool)
}
