package ports

import (
	"context"
	"io"

	"iop/domain"
)

// NodeDirectory is the edge's source of truth for nodes (edge.yaml nodes[]).
type NodeDirectory interface {
	// Authenticate returns the record whose token matches, comparing in
	// constant time; domain.ErrUnknownToken otherwise.
	Authenticate(token string) (domain.NodeRecord, error)
	Records() []domain.NodeRecord
}

// ReadyOnly is an ended context for polling a stream: RunStream.Recv and
// TunnelStream.Recv (and the edge's RunHandle.Next and Tunnel.Next) given
// it return what has already arrived, or its error at once with the stream
// still open.
var ReadyOnly = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// EventPublisher puts events on the edge's bus. Publish never blocks.
type EventPublisher interface {
	Publish(ev domain.BusEvent)
}

// RunStream is the edge's view of one run on a node. Recv returns the next
// event; after the terminal event it returns io.EOF. If the link fails first
// it returns an error matching domain.ErrNodeDisconnected. With ctx done
// (ReadyOnly), Recv still returns an event already received, so a caller
// can take what is queued without waiting; with nothing there it returns
// ctx's error at once and consumes nothing. A failure of the stream is
// returned as that failure, never as ctx's error.
type RunStream interface {
	Recv(ctx context.Context) (domain.RunEvent, error)
	Close()
}

// CommandReply is one answer to a node command: progress, or the final result.
type CommandReply struct {
	Final    bool
	Result   []byte
	Progress []byte
	Err      error
}

// CommandStream yields a command's replies; the last has Final set.
type CommandStream interface {
	Recv(ctx context.Context) (CommandReply, error)
	Close()
}

// TunnelStream yields a provider response's frames in order, ending with a
// TunnelEnd or TunnelError frame. Close abandons it (the node aborts the
// upstream request) and returns once its request body is no longer read
// (NodeLink.OpenTunnel); it is called once the stream ended too.
type TunnelStream interface {
	// Recv returns the next frame. A body frame's bytes are valid only until
	// the next Recv or Close: the link may reuse their buffer.
	Recv(ctx context.Context) (domain.TunnelFrame, error)
	Close()
}

// NodeLink is a live connection to one registered node.
type NodeLink interface {
	StartRun(ctx context.Context, req domain.RunRequest) (RunStream, error)
	// CancelRun cancels a run on the node. reason says why the edge
	// cancels it (the caller left, the edge is shutting down, ...), and is
	// the cancelled run's message; empty, the node records "cancelled by
	// request" (a user's cancel).
	CancelRun(ctx context.Context, runID, reason string) error
	TerminateSession(ctx context.Context, adapter, target, sessionID string) error
	Command(ctx context.Context, name string, args []byte) (CommandStream, error)
	// OpenTunnel sends req; if body is non-nil it is streamed after req.Body,
	// read on a goroutine of the stream's own. The stream's Close waits for
	// that goroutine: when body is also an io.Closer, Close closes it first
	// if a read may still be under way, and its Close must make a Read in
	// progress return soon and later ones fail (a body that can block
	// should be one). A body read that fails, other than with io.EOF,
	// fails the tunnel.
	OpenTunnel(ctx context.Context, req domain.TunnelRequest, body io.Reader) (TunnelStream, error)
	PushConfig(ctx context.Context, cfg domain.NodeConfig) error
	// Close drops the connection; reason goes into the disconnect event.
	Close(reason string)
}

// NodeSource reads the node directory afresh (edge.yaml on reload).
type NodeSource interface {
	// LoadNodes returns the node records, and the names of the source's
	// other settings whose value differs from the one the edge runs with:
	// the edge reads those at start only, so they take effect after a
	// restart. Names only, never values (some are secrets).
	LoadNodes() (nodes []domain.NodeRecord, needsRestart []string, err error)
}

// DirectoryReplacer swaps the node directory's records atomically.
type DirectoryReplacer interface {
	Replace(records []domain.NodeRecord)
}

// ModelLister knows how a provider of each type (domain.ProviderOpenAI,
// ProviderOllama, ProviderAnthropic) lists its models: the path the edge
// GETs through a tunnel, the query of each page, and how to read the
// answer. A body that is not the type's list is a domain.CodeProviderError.
type ModelLister interface {
	ModelListPath(providerType string) string
	// ModelListQuery is the query of the list's first page (prev nil) or
	// of the page after the one answered with prev; ok is false when prev
	// was the last page.
	ModelListQuery(providerType string, prev []byte) (query string, ok bool)
	ParseModelList(providerType string, body []byte) ([]domain.ListedModel, error)
}
