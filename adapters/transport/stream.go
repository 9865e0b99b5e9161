package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	ioppb "iop/proto/iop"
)

// ResetError is how a stream ends when the peer resets it.
type ResetError struct {
	Code    string
	Message string
}

func (e *ResetError) Error() string {
	if e.Message == "" {
		return "stream reset by peer: " + e.Code
	}
	return "stream reset by peer: " + e.Code + ": " + e.Message
}

// Stream errors.
var (
	ErrStreamClosed      = errors.New("stream closed")
	ErrStreamFrameTooBig = errors.New("frame larger than a quarter of the stream window")
)

// frameOverhead is charged per frame on top of its protobuf size, so a peer
// cannot queue unbounded numbers of tiny frames within its credit.
const frameOverhead = 16

func frameCost(f *ioppb.Frame) int { return proto.Size(f) + frameOverhead }

// queued is a received frame with the cost charged for it on arrival, so
// the frame is sized once, not again when it is consumed.
type queued struct {
	f    *ioppb.Frame // nil for a data frame
	d    dataFrame
	cost int
	// elems is the frame's element count (elements.go) where the decoder
	// counts them (the edge), one for a data frame; 0 otherwise.
	elems int
}

// Stream is one exchange on a Conn (a run, a command, a tunnel, a cancel).
//
// Receiving: frames the peer sends are queued here, never in the read loop;
// the queue never holds more than the window granted to the peer, and credit
// is returned as Recv consumes. A peer that overruns its credit gets the
// stream reset (flow_control); the connection and other streams go on.
//
// Sending: Send waits for credit from the peer, so a consumer that stops
// reading stalls only its own stream.
type Stream struct {
	id     uint64
	c      *Conn
	window int // receive window granted to the peer

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu    sync.Mutex
	queue []queued
	// one is the queue's array while it starts from empty: popping
	// reslices the queue forward, so a consumer that keeps up (one frame
	// in, one out) would otherwise have every frame allocate a new array.
	one    [1]queued
	queued int
	// elems is the element count of the queued frames (Conn.streamElements).
	elems    int
	unacked  int
	credit   int
	endErr   error // no more frames will arrive; set once
	notify   chan struct{}
	creditCh chan struct{}

	// last: this side has handed the stream's last frame to the writer
	// (SendLast); guarded by the Conn's mu (Conn.finishing).
	last bool
	// tunnel: this side opened the stream as a provider tunnel (counted in
	// Conn.tunnels); set before the stream is published, then read-only.
	tunnel bool

	// held is the pooled payload of the data frame Recv returned last; it
	// is given back on the next Recv (the consumer is done with it by then).
	// Only the stream's one consumer touches it.
	held *[]byte
}

func newStream(c *Conn, id uint64) *Stream {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Stream{
		id: id, c: c, window: int(c.cfg.StreamWindow), credit: int(c.peerWindow),
		ctx: ctx, cancel: cancel,
		notify: make(chan struct{}, 1), creditCh: make(chan struct{}, 1),
	}
}

// ID returns the stream id.
func (s *Stream) ID() uint64 { return s.id }

// Context is cancelled when the stream ends for any reason (reset by either
// side, finished, connection lost). Its cause says why.
func (s *Stream) Context() context.Context { return s.ctx }

// Recv returns the next frame from the peer. A data frame comes back as
// its protobuf equivalent; its body bytes are valid until the next Recv.
func (s *Stream) Recv(ctx context.Context) (*ioppb.Frame, error) {
	f, d, err := s.recv(ctx)
	if err != nil || f != nil {
		return f, err
	}
	return d.asProto(), nil
}

// recv returns the next frame from the peer: a protobuf frame, or (f nil) a
// data frame whose payload is valid until the next recv. There is one
// consumer per stream.
func (s *Stream) recv(ctx context.Context) (*ioppb.Frame, dataFrame, error) {
	if s.held != nil {
		putPayload(s.held)
		s.held = nil
	}
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			f, d, cost := s.queue[0].f, s.queue[0].d, s.queue[0].cost
			s.elems -= s.queue[0].elems
			s.queue[0] = queued{}
			s.queue = s.queue[1:]
			s.queued -= cost
			s.unacked += cost
			var grant int
			if s.endErr == nil && (s.unacked >= s.window/2) {
				grant, s.unacked = s.unacked, 0
			}
			s.mu.Unlock()
			if grant > 0 {
				// Credit must not be lost (the peer would stall for good), so
				// wait for queue room; only the stream ending abandons it.
				_ = s.c.enqueueCtrl(s.ctx, &ioppb.Frame{StreamId: s.id, Body: &ioppb.Frame_WindowUpdate{WindowUpdate: &ioppb.WindowUpdate{Increment: uint32(grant)}}})
			}
			if f == nil {
				s.held = d.pool
			}
			return f, d, nil
		}
		if s.endErr != nil {
			err := s.endErr
			s.mu.Unlock()
			return nil, dataFrame{}, err
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-ctx.Done():
			return nil, dataFrame{}, ctx.Err()
		}
	}
}

// Send queues a credit-counted frame on this stream and waits until the
// writer has taken it.
func (s *Stream) Send(ctx context.Context, f *ioppb.Frame) error {
	f.StreamId = s.id
	return s.send(ctx, outFrame{f: f, stream: s.id}, frameCost(f))
}

// SendData sends payload as a data frame of kind under the stream's credit.
// The payload is copied before SendData returns, so the caller may reuse
// it. Use it only where c.dataFrames holds.
func (s *Stream) SendData(ctx context.Context, kind byte, payload []byte) error {
	raw, pool := encodeData(kind, s.id, payload)
	err := s.send(ctx, outFrame{raw: raw, pool: pool, stream: s.id}, dataBodyLen(s.id, len(payload))+frameOverhead)
	if err != nil {
		putPayload(pool)
	}
	return err
}

// SendBody sends payload as a data frame of kind where the link agreed to
// them (dataFrames), otherwise as the equivalent protobuf frame (asProto),
// under the stream's credit either way. The payload is copied before
// SendBody returns, so the caller may reuse it.
func (s *Stream) SendBody(ctx context.Context, kind byte, payload []byte) error {
	if s.c.dataFrames {
		return s.SendData(ctx, kind, payload)
	}
	d := dataFrame{kind: kind, stream: s.id, payload: bytes.Clone(payload)}
	return s.Send(ctx, d.asProto())
}

// send takes cost in credit and hands o to the writer. On error o was not
// taken.
func (s *Stream) send(ctx context.Context, o outFrame, cost int) error {
	if cost > int(s.c.peerWindow)/4 {
		return fmt.Errorf("%w: %d bytes", ErrStreamFrameTooBig, cost)
	}
	for {
		s.mu.Lock()
		if s.endErr != nil {
			err := s.endErr
			s.mu.Unlock()
			return err
		}
		if s.credit >= cost {
			s.credit -= cost
			s.mu.Unlock()
			break
		}
		s.mu.Unlock()
		select {
		case <-s.creditCh:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ctx.Done():
			return context.Cause(s.ctx)
		}
	}
	s.c.offer()
	var err error
	select {
	case s.c.data <- o:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-s.ctx.Done():
		err = context.Cause(s.ctx)
	case <-s.c.done:
		err = s.c.closedErr()
	}
	// Not sent: the credit taken for it is the stream's again (a send
	// abandoned by its caller must not shrink the window for good).
	s.c.withdraw()
	s.mu.Lock()
	s.credit += cost
	s.mu.Unlock()
	return err
}

// SendLast is Send for the frame that ends the exchange on this side (a
// terminal run event, a final command response, a tunnel's end or error).
// The peer may count the stream free as soon as it reads it, so from
// before the frame can reach the peer the stream no longer counts against
// the peer's MaxStreams here (Conn.openFromPeer), though it stays open
// until Finish.
func (s *Stream) SendLast(ctx context.Context, f *ioppb.Frame) error {
	s.c.setLast(s, true)
	err := s.Send(ctx, f)
	if err != nil {
		s.c.setLast(s, false)
	}
	return err
}

// SendControl queues a frame on this stream ahead of data, without credit.
// It is for small frames that end or steer an exchange.
func (s *Stream) SendControl(ctx context.Context, f *ioppb.Frame) error {
	f.StreamId = s.id
	return s.c.enqueueCtrl(ctx, f)
}

// Close abandons the stream: the peer is told with a reset (code cancel) so
// it stops its work, and frames still in flight are dropped. Idempotent.
func (s *Stream) Close() { s.Reset("cancel", "") }

// Reset abandons the stream with a code and message for the peer.
func (s *Stream) Reset(code, msg string) {
	if s.end(ErrStreamClosed) {
		s.c.remove(s)
		s.c.sendCtrlBounded(resetFrame(s.id, code, msg))
	}
}

// resetFromReadLoop is Reset for callers on the read loop, which must never
// wait for the writer: if the control queue is full the reset is dropped
// and counted, and the peer's frames for the stream are dropped as unknown.
func (s *Stream) resetFromReadLoop(code, msg string) {
	if s.end(ErrStreamClosed) {
		s.c.remove(s)
		s.c.trySendCtrl(resetFrame(s.id, code, msg))
	}
}

// Finish forgets a stream whose exchange completed normally (the terminal
// frame was sent or received); the peer is not told.
func (s *Stream) Finish() { s.finish() }

func (s *Stream) finish() {
	s.end(ErrStreamClosed)
	s.c.remove(s)
}

// end marks the stream over; it reports whether this call ended it.
func (s *Stream) end(err error) bool {
	s.mu.Lock()
	if s.endErr != nil {
		s.mu.Unlock()
		return false
	}
	s.endErr = err
	s.mu.Unlock()
	s.cancel(err)
	signal(s.notify)
	signal(s.creditCh)
	return true
}

// deliver queues a frame from the peer, of elems elements where the
// decoder counts them (read loop; never blocks).
func (s *Stream) deliver(f *ioppb.Frame, elems int) {
	s.enqueue(queued{f: f, cost: frameCost(f), elems: elems})
}

// deliverData queues a data frame of the given cost; the stream takes its
// payload (read loop; never blocks).
func (s *Stream) deliverData(d *dataFrame, cost int) {
	elems := 0
	if s.c.streamElements > 0 {
		elems = 1
	}
	if !s.enqueue(queued{d: *d, cost: cost, elems: elems}) {
		putPayload(d.pool)
	}
}

// enqueue queues q unless the stream has ended or the peer overran its
// credit; it reports whether q was queued.
func (s *Stream) enqueue(q queued) bool {
	cost := q.cost
	s.mu.Lock()
	if s.endErr != nil {
		s.mu.Unlock()
		s.c.dropped.Add(1)
		return false
	}
	// The peer's credit is the window less what it has sent that has not
	// been returned: frames still queued and frames read but not yet acked.
	if s.queued+s.unacked+cost > s.window {
		queued, unacked := s.queued, s.unacked
		s.mu.Unlock()
		if s.c.side == SideEdge {
			// A node that ignores the credit it was granted is broken or hostile.
			s.c.violation(fmt.Sprintf("stream %d overran its credit: %d queued + %d unacknowledged + %d > window %d", s.id, queued, unacked, cost, s.window))
			return false
		}
		s.c.log.Warn("peer overran stream credit; resetting stream", "stream", s.id, "queued", queued, "unacked", unacked, "frame", cost)
		if s.end(fmt.Errorf("%w: peer overran the stream window", ErrStreamClosed)) {
			s.c.remove(s)
			s.c.trySendCtrl(resetFrame(s.id, "flow_control", "credit window exceeded"))
		}
		return false
	}
	if limit := s.c.streamElements; limit > 0 && s.elems+q.elems > limit {
		elems, size := s.elems+q.elems, s.queued+cost
		s.mu.Unlock()
		// Only the edge counts: a node whose frames are this dense is
		// broken or hostile (no legitimate stream comes near).
		s.c.violation(fmt.Sprintf("stream %d would hold %d messages, strings and bytes values in its queued frames, more than %d (%d bytes queued)",
			s.id, elems, limit, size))
		return false
	}
	if len(s.queue) == 0 {
		s.queue = s.one[:0]
	}
	s.queue = append(s.queue, q)
	s.queued += cost
	s.elems += q.elems
	s.mu.Unlock()
	signal(s.notify)
	return true
}

func (s *Stream) addCredit(n uint32) {
	s.mu.Lock()
	s.credit += int(n)
	s.mu.Unlock()
	signal(s.creditCh)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
