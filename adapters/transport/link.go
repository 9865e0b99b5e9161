package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// edgeLink is the edge's handle on one registered node: it implements
// ports.NodeLink over the node's Conn.
type edgeLink struct {
	conn   *Conn
	remote string

	mu sync.Mutex
	// nodeID and regVersion are set once Register has accepted the node,
	// when the link is already published (a reconciler may send it a
	// command meanwhile), so they are read under mu (see registered).
	nodeID string
	// regVersion is the version of the config sent with the register
	// response: a node that cannot apply it says so with an unsolicited
	// ack of that version and leaves.
	regVersion uint64
	acks       map[uint64]chan error // config version → waiter

	statsBox nodeStatsBox
	// h hears that the node is draining; draining makes that once.
	h        EdgeHandler
	draining atomic.Bool
}

var _ ports.NodeLink = (*edgeLink)(nil)

// Stats exposes the connection counters for the edge's node listing.
func (l *edgeLink) Stats() Stats { return l.conn.Stats() }

// Remote returns the node's address.
func (l *edgeLink) Remote() string { return l.remote }

// HandleOpen refuses streams opened by the node: none are defined yet.
func (l *edgeLink) HandleOpen(s *Stream, _ *ioppb.Frame) {
	s.resetFromReadLoop("unsupported", "the edge accepts no node-opened streams")
}

// setRegistered records the node and the config version Register gave it.
func (l *edgeLink) setRegistered(node string, version uint64) {
	l.mu.Lock()
	l.nodeID, l.regVersion = node, version
	l.mu.Unlock()
}

// registered returns what setRegistered recorded ("" and 0 before it).
func (l *edgeLink) registered() (node string, version uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nodeID, l.regVersion
}

// configTooLargeHint ends the error of a node config larger than a frame.
// The edge reads transport.max_frame_size at start (a reload does not change
// it); a node reads frames up to the largest limit an edge accepts, so
// raising it takes a restart of the edge only.
const configTooLargeHint = "give it fewer or smaller targets, or raise transport.max_frame_size in edge.yaml and restart the edge (a reload does not change it)"

// ConfigFits reports, as a config_error, a config too large to go to the
// node in its register response (one frame): the edge then refuses the
// registration with that reason instead of admitting the node first.
func (l *edgeLink) ConfigFits(cfg domain.NodeConfig) error {
	resp := &ioppb.RegisterResponse{Accepted: true, Config: configToProto(cfg)}
	_, err := AppendFrame(nil, &ioppb.Frame{Body: &ioppb.Frame_RegisterResponse{RegisterResponse: resp}}, l.conn.cfg.MaxFrameSize)
	if errors.Is(err, ErrFrameTooLarge) {
		return domain.Errorf(domain.CodeConfigError, "the node's config (%v) does not fit in one link frame: %s", err, configTooLargeHint)
	}
	return nil
}

// HandleControl receives config refresh acknowledgements, node stats and
// the node's word that it is draining.
func (l *edgeLink) HandleControl(f *ioppb.Frame) {
	if ns := f.GetNodeStats(); ns != nil {
		l.statsBox.set(statsToDomain(ns))
		return
	}
	if f.GetNodeDraining() != nil {
		if l.draining.CompareAndSwap(false, true) {
			node, _ := l.registered()
			l.h.Draining(node, l)
		}
		return
	}
	ack := f.GetConfigRefreshAck()
	if ack == nil {
		l.conn.dropped.Add(1)
		return
	}
	l.mu.Lock()
	ch := l.acks[ack.GetVersion()]
	delete(l.acks, ack.GetVersion())
	regVersion := l.regVersion
	l.mu.Unlock()
	// Cut as every error message a node reports (domain.PeerError): it
	// becomes a log line, a bus event, the node list's reason.
	ackErr := domain.ClipMessage(ack.GetError(), domain.MaxPeerMessage)
	if ch == nil {
		if ackErr != "" && ack.GetVersion() == regVersion {
			// The node leaves after this; its reason becomes the link's, so
			// the edge's log, bus event and node list say why.
			l.conn.shutdown(fmt.Errorf("node refused its config v%d: %s", ack.GetVersion(), ackErr))
		}
		return
	}
	if ackErr != "" {
		ch <- domain.Errorf(domain.CodeConfigError, "node rejected config v%d: %s", ack.GetVersion(), ackErr)
	} else {
		ch <- nil
	}
}

func (l *edgeLink) Close(reason string) { l.conn.Close(errors.New(reason)) }

// linkErr turns a stream failure into the domain error a caller sees.
func linkErr(err error) error {
	var re *ResetError
	var tb *tunnelsBusyError
	switch {
	case errors.As(err, &re) && re.Code == "too_many_streams":
		// The node refused to open the stream (it still holds as many as
		// it takes): nothing of the exchange began there, and the caller
		// may try again shortly, as with a full link on this side.
		return domain.Errorf(domain.CodeAtCapacity, "the node has too many open streams on its link")
	case errors.As(err, &re):
		return domain.Errorf(domain.CodeStreamReset, "node reset the stream: %s", re.Code)
	case errors.Is(err, ErrFrameEncode):
		return domain.Errorf(domain.CodeInvalidRequest, "request cannot be sent to the node: %v", err)
	case errors.Is(err, ErrFrameTooLarge):
		return domain.Errorf(domain.CodeInvalidRequest, "request too large for one frame: %v", err)
	case errors.As(err, &tb):
		// Tunnels hold their share of the link: the rest is kept for the
		// node's runs, cancels and commands (tunnelShare).
		return domain.Errorf(domain.CodeAtCapacity,
			"the node's link is busy with provider tunnels: they hold %d of its %d streams, the most they may (the rest is kept for runs, cancels and commands); try again shortly",
			tb.held, tb.streams)
	case errors.Is(err, ErrTooManyStreams):
		return domain.Errorf(domain.CodeAtCapacity, "the node link has too many open streams")
	case errors.Is(err, ErrConnClosed):
		return domain.Errorf(domain.CodeNodeDisconnected, "%v", err)
	}
	return err
}

func (l *edgeLink) StartRun(ctx context.Context, req domain.RunRequest) (ports.RunStream, error) {
	s, err := l.conn.open(ctx, &ioppb.Frame{Body: &ioppb.Frame_RunRequest{RunRequest: runRequestToProto(req)}}, classRun)
	if err != nil {
		return nil, linkErr(err)
	}
	return &runStream{s: s}, nil
}

type runStream struct {
	s    *Stream
	done bool
}

func (r *runStream) Recv(ctx context.Context) (domain.RunEvent, error) {
	for {
		if r.done {
			return domain.RunEvent{}, io.EOF
		}
		f, err := r.s.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return domain.RunEvent{}, err // the stream stays open
			}
			r.done = true
			return domain.RunEvent{}, linkErr(err)
		}
		p := f.GetRunEvent()
		if p == nil {
			r.s.c.dropped.Add(1)
			continue
		}
		ev, ok := runEventToDomain(p)
		if !ok {
			r.s.c.dropped.Add(1)
			continue
		}
		if ev.Type.Terminal() {
			r.done = true
			r.s.Finish()
		}
		return ev, nil
	}
}

// Close abandons the run stream; the node treats that as the caller leaving.
func (r *runStream) Close() {
	if !r.done {
		r.done = true
		r.s.Close()
	}
}

// cancelExchange opens a stream with req and waits for one CancelResponse.
// It may take the link's controlReserve (Conn.Open), so a run can be
// cancelled even when runs and tunnels fill the link.
func (l *edgeLink) cancelExchange(ctx context.Context, req *ioppb.CancelRequest) error {
	s, err := l.conn.Open(ctx, &ioppb.Frame{Body: &ioppb.Frame_CancelRequest{CancelRequest: req}})
	if err != nil {
		return linkErr(err)
	}
	defer s.Finish()
	for {
		f, err := s.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				s.Close()
				return fmt.Errorf("%w: %w", domain.ErrTimeout, ctx.Err())
			}
			return linkErr(err)
		}
		if r := f.GetCancelResponse(); r != nil {
			return errorToDomain(r.GetError())
		}
	}
}

func (l *edgeLink) CancelRun(ctx context.Context, runID, reason string) error {
	return l.cancelExchange(ctx, &ioppb.CancelRequest{Kind: ioppb.CancelKind_CANCEL_RUN, RunId: runID, Reason: reason})
}

func (l *edgeLink) TerminateSession(ctx context.Context, adapter, target, sessionID string) error {
	return l.cancelExchange(ctx, &ioppb.CancelRequest{
		Kind: ioppb.CancelKind_TERMINATE_SESSION, Adapter: adapter, Target: target, SessionId: sessionID,
	})
}

// Command may take the link's controlReserve (Conn.Open), as a cancel may.
func (l *edgeLink) Command(ctx context.Context, name string, args []byte) (ports.CommandStream, error) {
	s, err := l.conn.Open(ctx, &ioppb.Frame{Body: &ioppb.Frame_NodeCommandRequest{NodeCommandRequest: &ioppb.NodeCommandRequest{Command: name, ArgsJson: args}}})
	if err != nil {
		return nil, linkErr(err)
	}
	node, _ := l.registered()
	return &commandStream{s: s, name: name, node: node, limit: l.conn.cfg.commandResultLimit}, nil
}

type commandStream struct {
	s      *Stream
	name   string
	node   string
	limit  int // the most result bytes collected (Config.commandResultLimit)
	result []byte
	done   bool
}

// Recv returns progress replies as they come and the final reply with the
// whole result, reassembled from its chunks.
func (c *commandStream) Recv(ctx context.Context) (ports.CommandReply, error) {
	for {
		if c.done {
			return ports.CommandReply{}, io.EOF
		}
		f, err := c.s.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return ports.CommandReply{}, err // the stream stays open
			}
			c.done = true
			return ports.CommandReply{}, linkErr(err)
		}
		r := f.GetNodeCommandResponse()
		if r == nil {
			continue
		}
		if len(c.result)+len(r.GetResultJson()) > c.limit {
			c.done = true
			c.result = nil
			c.s.Reset("result_too_large", fmt.Sprintf("command result over %d bytes", c.limit))
			c.s.c.log.Warn("node sent a command result over the limit: stream reset, command failed",
				"node", c.node, "command", c.name, "limit", c.limit)
			return ports.CommandReply{}, domain.Errorf(domain.CodeResultTooLarge,
				"node %q sent a result for command %q larger than the edge accepts (%d bytes): ask for less", c.node, c.name, c.limit)
		}
		c.result = append(c.result, r.GetResultJson()...)
		if r.GetFinal() {
			c.done = true
			c.s.Finish()
			return ports.CommandReply{Final: true, Result: c.result, Err: errorToDomain(r.GetError())}, nil
		}
		if len(r.GetProgressJson()) > 0 {
			return ports.CommandReply{Progress: r.GetProgressJson()}, nil
		}
	}
}

func (c *commandStream) Close() {
	if !c.done {
		c.done = true
		c.s.Close()
	}
}

func (l *edgeLink) OpenTunnel(ctx context.Context, req domain.TunnelRequest, body io.Reader) (ports.TunnelStream, error) {
	first := req.Body
	var rest io.Reader
	if len(first) > maxDataChunk {
		rest = readerOf(first[maxDataChunk:])
		first = first[:maxDataChunk]
	}
	if body != nil {
		if rest != nil {
			rest = io.MultiReader(rest, body)
		} else {
			rest = body
		}
	}
	preq := &ioppb.ProviderTunnelRequest{
		Provider: req.Provider, Method: req.Method, Path: req.Path, Query: req.Query,
		Headers: l.conn.headers(req.Header), Body: first, BodyFollows: rest != nil,
	}
	s, err := l.conn.open(ctx, &ioppb.Frame{Body: &ioppb.Frame_ProviderTunnelRequest{ProviderTunnelRequest: preq}}, classTunnel)
	if err != nil {
		return nil, linkErr(err)
	}
	t := &tunnelStream{s: s}
	if rest != nil {
		t.upload = make(chan struct{})
		if c, ok := body.(io.Closer); ok {
			t.body = c
		}
		go t.sendBody(rest)
	}
	return t, nil
}

type tunnelStream struct {
	s      *Stream
	done   bool
	upload chan struct{} // closed when the body uploader has returned
	// body, when the caller's body is an io.Closer, is closed by Close to
	// end a read of it in progress (ports.NodeLink.OpenTunnel).
	body io.Closer
	// bodyErr is why the uploader reset the stream: the request body failed.
	bodyErr atomic.Pointer[error]
	// sendErr is why the uploader reset the stream: a piece of the body
	// could not be sent to the node.
	sendErr atomic.Pointer[error]
}

// sendBody streams the request body in chunks under the node's credit. It
// ends when the body does or when the stream ends.
func (t *tunnelStream) sendBody(r io.Reader) {
	defer close(t.upload)
	buf := make([]byte, maxDataChunk)
	ctx := t.s.Context()
	// A piece that cannot be sent while the stream lives would leave the
	// node waiting for the rest of a body it was told follows, and the
	// caller for its answer: the stream is reset. (Once the stream has
	// ended, which is what a send mostly fails on, Reset does nothing; a
	// link that closed ends the stream with its own error, node_disconnected,
	// even when the send saw it before the stream did.)
	failed := func(err error) {
		if t.s.Context().Err() == nil && !errors.Is(err, ErrConnClosed) {
			t.sendErr.Store(&err)
			t.s.Reset("internal", "the edge could not send the request body: "+err.Error())
		}
	}
	for {
		// What one read returns goes on at once: the body streams as the
		// caller sends it (a read of a full buffer would hold a slow
		// upload's pieces back). Only io.EOF is the body's end: a caller's
		// body cut before its declared length or last chunk reads as
		// io.ErrUnexpectedEOF, and the provider must not get it as a
		// finished request.
		n, err := r.Read(buf)
		if n > 0 {
			if serr := t.s.SendBody(ctx, dataRequestBody, buf[:n]); serr != nil {
				failed(serr)
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				// Recv then says this, not a bare "stream closed" (an
				// internal error to whoever relays it).
				t.bodyErr.Store(&err)
				t.s.Reset("body_error", err.Error())
				return
			}
			if serr := t.s.Send(ctx, &ioppb.Frame{Body: &ioppb.Frame_TunnelRequestBody{TunnelRequestBody: &ioppb.TunnelRequestBody{End: true}}}); serr != nil {
				failed(serr)
			}
			return
		}
	}
}

// Recv returns the next frame; a body frame's bytes are valid until the
// next Recv (they may live in a buffer the link reuses).
func (t *tunnelStream) Recv(ctx context.Context) (domain.TunnelFrame, error) {
	for {
		if t.done {
			return domain.TunnelFrame{}, io.EOF
		}
		f, d, err := t.s.recv(ctx)
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return domain.TunnelFrame{}, err // the stream stays open
			}
			t.done = true
			if be := t.bodyErr.Load(); be != nil && errors.Is(err, ErrStreamClosed) {
				return domain.TunnelFrame{}, domain.Errorf(domain.CodeInvalidRequest, "request body: %v", *be)
			}
			if se := t.sendErr.Load(); se != nil && errors.Is(err, ErrStreamClosed) {
				return domain.TunnelFrame{}, fmt.Errorf("tunnel request body could not be sent to the node: %w", *se)
			}
			return domain.TunnelFrame{}, linkErr(err)
		}
		if f == nil {
			if d.kind != dataTunnelBody {
				t.s.c.dropped.Add(1)
				continue
			}
			return domain.TunnelFrame{Kind: domain.TunnelBody, Body: d.payload}, nil
		}
		p := f.GetProviderTunnelFrame()
		if p == nil {
			continue
		}
		tf, ok := tunnelFrameToDomain(p)
		if !ok {
			continue
		}
		if tf.Kind == domain.TunnelEnd || tf.Kind == domain.TunnelError {
			t.done = true
			t.s.Finish()
		}
		return tf, nil
	}
}

// Close abandons the tunnel: the node aborts the upstream request.
func (t *tunnelStream) Close() {
	if !t.done {
		t.done = true
		t.s.Close()
	}
	// The uploader stops once the stream is gone, unless it is blocked
	// reading the caller's body: closing the body ends that read (the
	// HTTP handler's body cuts it off with a read deadline), and Close
	// returns only once the uploader has, so nothing reads the body after
	// its owner is done with the tunnel (an HTTP server forbids reading a
	// request's body once its handler returned).
	if t.upload != nil {
		select {
		case <-t.upload:
		default:
			if t.body != nil {
				_ = t.body.Close()
			}
			// A body that cannot cut its read off (no io.Closer, or a
			// connection without read deadlines) must not hold its
			// owner for ever: a second after the body's Close returned
			// (which may itself have waited its own bound) the read is
			// left to end with the request.
			select {
			case <-t.upload:
			case <-time.After(time.Second):
			}
		}
	}
}

func (l *edgeLink) PushConfig(ctx context.Context, cfg domain.NodeConfig) error {
	ch := make(chan error, 1)
	l.mu.Lock()
	l.acks[cfg.Version] = ch
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.acks, cfg.Version)
		l.mu.Unlock()
	}()
	f := &ioppb.Frame{Body: &ioppb.Frame_ConfigRefresh{ConfigRefresh: &ioppb.ConfigRefresh{Config: configToProto(cfg)}}}
	if err := l.conn.sendControl(ctx, f); errors.Is(err, ErrFrameTooLarge) {
		return domain.Errorf(domain.CodeConfigError, "the node's config does not fit in one link frame (%v): %s", err, configTooLargeHint)
	} else if err != nil {
		return linkErr(err)
	}
	select {
	case err := <-ch:
		return err
	case <-l.conn.Done():
		return linkErr(fmt.Errorf("%w: %w", ErrConnClosed, l.conn.Err()))
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("%w: waiting for config ack: %w", domain.ErrTimeout, ctx.Err())
		}
		// The caller gave up (the edge stopping a reload), not the node.
		return domain.Errorf(domain.CodeCancelled, "stopped waiting for the config ack: %v", context.Cause(ctx))
	}
}
