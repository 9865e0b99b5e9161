package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"iop/adapters/internal/deadline"
	"iop/domain"
	ioppb "iop/proto/iop"
)

// Link-level errors. Every stream of a connection that ends fails with an
// error wrapping ErrConnClosed and the connection's cause.
var (
	ErrConnClosed       = errors.New("connection closed")
	ErrHeartbeatTimeout = errors.New("peer silent past heartbeat timeout")
	ErrTooManyStreams   = errors.New("too many open streams")
	// ErrTunnelsBusy refuses a provider tunnel when tunnels already hold
	// their share of the link's streams (tunnelShare).
	ErrTunnelsBusy = errors.New("the link's streams for provider tunnels are all in use")
)

// streamClass is what a stream this side opens is for: it decides how much
// of MaxStreams the open may use, so that one kind of exchange cannot
// starve the others of streams. Only the opener's accounting uses it: the
// peer sees the same frames as before.
type streamClass uint8

const (
	// classControl (cancels, node commands) may take every stream of the
	// link, the controlReserve that nothing else may take included.
	classControl streamClass = iota
	// classRun may take all but controlReserve.
	classRun
	// classTunnel (provider tunnels) may take all but controlReserve, and
	// at most tunnelShare streams held by tunnels.
	classTunnel
)

// controlReserve is how many of a link's maxStreams only cancels and
// commands may take: 8 of 512. Those are short exchanges (a cancel is one
// request and one answer) that must get through when runs (up to their
// adapters' max_concurrency, which has no link-wide bound) fill the link:
// a cancel refused for lack of a stream would leave its run going. Zero
// below 64 streams (test links).
func controlReserve(maxStreams int) int { return maxStreams / 64 }

// tunnelShare is the most streams provider tunnels may hold on a link of
// maxStreams: all but an eighth, 448 of 512. A tunnel holds its stream as
// long as its caller reads (a slow or stalled caller holds it for as long
// as it likes), and tunnel callers have no per-node limit of their own, so
// without a share they could take every stream and leave the node's runs,
// and the cancels of its runs, refused at_capacity though its adapters are
// idle. The eighth (64, the same as the finishing margin a peer allows)
// keeps room for a node's runs beyond what its tunnels use: 56 runs at
// once and the controlReserve, more than the default max_concurrency (4)
// of all its adapters.
func tunnelShare(maxStreams int) int { return maxStreams - maxStreams/8 }

// tunnelsBusyError is ErrTunnelsBusy with the counts behind it.
type tunnelsBusyError struct{ held, streams int }

func (e *tunnelsBusyError) Error() string {
	return fmt.Sprintf("%v: tunnels hold %d of the link's %d streams", ErrTunnelsBusy, e.held, e.streams)
}

func (e *tunnelsBusyError) Is(target error) bool { return target == ErrTunnelsBusy }

// Side says which end of the link a Conn is; it decides stream id parity
// (edge odd, node even) so the two ends never pick the same id.
type Side int

const (
	SideEdge Side = iota + 1
	SideNode
)

// Handler receives the frames a Conn does not route to a stream the local
// side opened. Both methods run on the read loop and must not block.
type Handler interface {
	// HandleOpen receives a frame that opens a new stream from the peer.
	HandleOpen(s *Stream, f *ioppb.Frame)
	// HandleControl receives stream-0 frames other than heartbeats.
	HandleControl(f *ioppb.Frame)
}

// Conn multiplexes streams over one TCP connection. The read loop (never
// blocks on a consumer) runs on the goroutine that owns the link (run). The
// writer (sole owner of the socket's write side; control frames first, then
// data frames from streams in arrival order, which is round-robin because
// each stream offers at most one frame at a time) runs only while there is
// something to write: a sender that finds no writer starts one, and a
// writer ends once it has had nothing to write for writerLinger, or at once
// when all it wrote last was heartbeats (an idle link's traffic). Heartbeats
// come from a timer that queues one as a control frame. An idle link costs
// one goroutine per side.
type Conn struct {
	nc         net.Conn
	dec        *Decoder
	cfg        Config
	side       Side
	handler    Handler
	log        *slog.Logger
	peerWindow uint32
	// dataFrames: both ends agreed at registration to send tunnel bodies
	// as binary data frames. Received data frames are read either way.
	dataFrames bool
	// streamElements, when positive, is the most elements (elements.go)
	// the frames queued on one stream may hold: set on the edge, whose
	// decoder counts them.
	streamElements int
	// rawHeaders: both ends agreed at registration to read header values
	// that are not UTF-8 (Header.values as bytes); without it such values
	// are left out of what this side sends (headers).
	rawHeaders bool

	ctrl chan *ioppb.Frame
	data chan outFrame

	// ws is the writer's state: writerRunning while a writer goroutine
	// exists (or may be started only by start, before it), plus pendingOne
	// for every frame a sender has announced (offer) and the writer has not
	// yet taken. A writer ends only by swapping ws from exactly
	// writerRunning to zero, so it never leaves a frame behind: a sender
	// that announced one either sees the running bit and knows that writer
	// will take its frame, or finds none and starts one.
	ws atomic.Int64
	// wmu orders starting a writer and arming the heartbeat timer against
	// shutdown, so none starts (and wg is never added to) once done is
	// closed: Close's wait then covers every writer.
	wmu sync.Mutex
	hb  *time.Timer // heartbeat timer, set by start; under wmu
	// wd moves the write deadline (WriteTimeout ahead, once per quarter of
	// it). Only the running writer uses it; one writer hands it to the next
	// through ws.
	wd deadline.Lazy

	mu      sync.Mutex
	streams map[uint64]*Stream
	// finishing counts the streams in streams that have handed their last
	// frame to the writer (Stream.last): the peer may see those exchanges
	// end, and open new streams in their place, before this side's
	// handlers return and forget them. openFromPeer admits new streams
	// past them, within finishingMargin.
	finishing int
	// tunnels counts the streams in streams that this side opened as
	// provider tunnels (Stream.tunnel), against tunnelShare.
	tunnels    int
	nextID     uint64
	lastPeerID uint64
	// lateAllowance is what the peer may still send on streams that have
	// ended here (what was in flight when they ended): each ended stream
	// adds the credit the peer still held on it (remove), each frame for
	// an ended stream takes its cost. An edge side disconnects a node that
	// goes below zero: a flood.
	lateAllowance int
	// opening serialises Open from id allocation to enqueueing the open
	// frame, so ids reach the peer in increasing order (it drops any id not
	// above the last one it saw). A channel, so waiting honours ctx.
	opening chan struct{}

	done      chan struct{}
	closeOnce sync.Once
	err       error // set once, before done is closed
	wg        sync.WaitGroup

	since     time.Time
	framesIn  atomic.Int64
	framesOut atomic.Int64
	bytesIn   atomic.Int64
	bytesOut  atomic.Int64
	dropped   atomic.Int64
	// headerDrops counts header values left out because the peer cannot
	// read them; the first is logged.
	headerDrops atomic.Int64
	rtt         atomic.Int64
	// probe is the last heartbeat this side queued; its reply's echo must
	// be its stamp, and the round trip is timed from at, on the monotonic
	// clock: a wall-clock step between the two (NTP setting the clock)
	// made the RTT that step, or left it stale when negative. A reply to
	// an earlier probe (overtaken by this one) is no sample.
	probe    atomic.Pointer[heartbeatProbe]
	closeWhy atomic.Pointer[error]
}

// heartbeatProbe is a heartbeat sent: its sent_unix_nano and when.
type heartbeatProbe struct {
	stamp int64
	at    time.Time
}

// closeSentinel asks the writer to flush and then close the connection.
var closeSentinel = &ioppb.Frame{}

// newConn wraps an established, registered connection. dec must be the
// decoder that read the handshake, so no buffered bytes are lost. The peer
// grants peerWindow bytes of credit per stream.
func newConn(nc net.Conn, dec *Decoder, cfg Config, side Side, peerWindow uint32, h Handler) *Conn {
	cfg = cfg.withDefaults()
	c := &Conn{
		nc: nc, dec: dec, cfg: cfg, side: side, handler: h, log: cfg.Logger, peerWindow: peerWindow,
		ctrl:    make(chan *ioppb.Frame, cfg.ControlQueue),
		data:    make(chan outFrame),
		streams: map[uint64]*Stream{},
		opening: make(chan struct{}, 1),
		done:    make(chan struct{}),
		wd:      deadline.Quarter(cfg.WriteTimeout),
		since:   time.Now(),
	}
	// Held as if a writer ran until start launches the first one: frames
	// queued before then wait, so they follow what the handshake wrote to
	// the socket directly.
	c.ws.Store(writerRunning)
	if side == SideEdge {
		c.nextID = 1
	} else {
		c.nextID = 2
	}
	if c.peerWindow == 0 {
		c.peerWindow = cfg.StreamWindow
	}
	if side == SideEdge && dec != nil {
		// What a node sends is bounded in decoded elements, per frame and
		// per stream (elements.go).
		dec.elements = nodeFrameElements
		c.streamElements = streamElements(int(cfg.StreamWindow))
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		// A second line behind heartbeats for peers that vanish silently.
		_ = tc.SetKeepAlive(true)
		_ = tc.SetKeepAlivePeriod(cfg.HeartbeatInterval)
	}
	return c
}

// start launches the connection's read loop on a goroutine of its own, the
// first writer (which writes what was queued before start, after anything
// the handshake wrote directly) and the heartbeat timer.
func (c *Conn) start() {
	c.wg.Add(1)
	c.launch()
	go c.readLoop()
}

// run is start with the read loop on the calling goroutine: it returns once
// the connection has ended (its writer may still be stopping; Close waits
// for it). The edge's serve and the node's session call it, so a link
// costs no goroutine that only waits for it to end.
func (c *Conn) run() {
	c.wg.Add(1)
	c.launch()
	c.readLoop()
}

// launch arms the heartbeat timer and starts the first writer, which holds
// the running bit newConn set.
func (c *Conn) launch() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.ended() {
		return
	}
	c.hb = time.AfterFunc(c.cfg.HeartbeatInterval, c.heartbeat)
	c.wg.Add(1)
	go c.writeLoop()
}

// ended reports whether the connection has ended (done is closed).
func (c *Conn) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Writer state (Conn.ws).
const (
	writerRunning = 1
	pendingOne    = 2
)

// writerLinger is the default of Config.writerLinger: how long a writer
// with nothing to write waits for more before it ends (it ends after
// between one and two of these), unless all it wrote last was heartbeats.
// A link busy in bursts keeps its writer; an idle one (a heartbeat each way
// every interval) has none between beats, and a writer is most of what an
// idle link would cost (docs/benchmarks.md, "Many idle nodes").
const writerLinger = 100 * time.Millisecond

// offer announces a frame the caller is about to hand to the writer and
// makes sure a writer runs to take it. A caller that then does not hand it
// over calls withdraw.
func (c *Conn) offer() {
	if c.ws.Add(pendingOne)&writerRunning == 0 {
		c.startWriter()
	}
}

// withdraw takes back an offer whose frame was not handed over.
func (c *Conn) withdraw() { c.ws.Add(-pendingOne) }

// startWriter starts a writer unless one runs or the connection has ended.
func (c *Conn) startWriter() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.ended() {
		return
	}
	for {
		v := c.ws.Load()
		if v&writerRunning != 0 {
			return
		}
		if c.ws.CompareAndSwap(v, v|writerRunning) {
			break
		}
	}
	c.wg.Add(1)
	go c.writeLoop()
}

// heartbeat runs on the heartbeat timer: it queues a heartbeat and re-arms.
// With the control queue full the writer is busy and the peer hears from
// this side anyway (any frame counts as a sign of life), so that beat is
// skipped.
func (c *Conn) heartbeat() {
	c.offer()
	now := time.Now()
	p := &heartbeatProbe{stamp: now.UnixNano(), at: now}
	// Stored before the send, so that no reply can come before it; a beat
	// skipped puts the previous probe back, whose reply may be on its way
	// (else the RTT stopped updating exactly while the link was busy).
	prev := c.probe.Swap(p)
	select {
	case c.ctrl <- heartbeatFrame(now):
	default:
		c.probe.CompareAndSwap(p, prev)
		c.withdraw()
	}
	c.wmu.Lock()
	if !c.ended() {
		c.hb.Reset(c.cfg.HeartbeatInterval)
	}
	c.wmu.Unlock()
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended, or nil while it is up.
func (c *Conn) Err() error {
	if c.ended() {
		return c.err
	}
	return nil
}

// closedErr is what a call on the ended connection fails with; only once
// done is closed.
func (c *Conn) closedErr() error { return fmt.Errorf("%w: %w", ErrConnClosed, c.err) }

// Close ends the connection with cause and waits for its goroutines.
// It is idempotent and safe to call from any goroutine but the connection's own.
func (c *Conn) Close(cause error) {
	c.shutdown(cause)
	c.wg.Wait()
}

// closeGrace is the default of Config.closeGrace: how long CloseAfterFlush
// gives what is queued to be written before it closes anyway. Short of the
// write deadline on purpose: that one (WriteTimeout, the heartbeat timeout:
// 45 s by default) tells a peer that stopped reading from a slow link, while
// a stopping node must be gone well within its stop timeout (fx's 15 s,
// after up to 5 s of waiting for its runs), and a peer that takes longer
// than this to read the last frames of a link being closed is not reading.
const closeGrace = 2 * time.Second

// CloseAfterFlush writes everything already queued, then closes; it returns
// once the connection has ended. What is not written within the close grace
// (Config.closeGrace) is dropped: the link closes then whatever state the
// writer is in, even stuck in a write to a peer that stopped reading.
func (c *Conn) CloseAfterFlush(cause error) {
	c.closeWhy.Store(&cause)
	grace := time.NewTimer(c.cfg.closeGrace)
	defer grace.Stop()
	late := func() {
		c.log.Warn("closing the link without writing what is queued: the peer has not read it", "within", c.cfg.closeGrace)
		c.shutdown(fmt.Errorf("%w (what was queued was not written within %v)", cause, c.cfg.closeGrace))
	}
	c.offer()
	select {
	case c.ctrl <- closeSentinel:
	case <-c.done:
		c.withdraw()
		return
	case <-grace.C:
		// The control queue is full and the writer is not taking from it.
		c.withdraw()
		late()
		return
	}
	select {
	case <-c.done:
	case <-grace.C:
		late()
	}
}

func (c *Conn) shutdown(cause error) {
	c.closeOnce.Do(func() {
		if cause == nil {
			cause = ErrConnClosed
		}
		c.err = cause
		c.wmu.Lock()
		close(c.done)
		if c.hb != nil {
			c.hb.Stop()
		}
		c.wmu.Unlock()
		_ = c.nc.Close()
		c.mu.Lock()
		streams := c.streams
		c.streams = map[uint64]*Stream{}
		c.finishing = 0
		c.tunnels = 0
		c.mu.Unlock()
		err := c.closedErr()
		for _, s := range streams {
			s.end(err)
		}
	})
}

func (c *Conn) readLoop() {
	defer c.wg.Done()
	var f *ioppb.Frame
	// The read deadline is the peer's liveness check. It moves forward at
	// most every 1/16 of the timeout, so a silent peer is dropped after
	// between 15/16 of the heartbeat timeout and all of it.
	rd := deadline.Lazy{Timeout: c.cfg.HeartbeatTimeout, Slack: c.cfg.HeartbeatTimeout / 16}
	move := func() {
		if t, due := rd.Next(time.Now()); due {
			_ = c.nc.SetReadDeadline(t)
		}
	}
	// Bytes arriving count as life too: the decoder moves the deadline as
	// each piece of a large frame arrives (Decoder.progress), so a frame
	// that takes longer than the timeout to arrive on a slow link is read
	// to its end, while a peer that sends nothing at all, mid-frame or
	// between frames, is still dropped after the timeout.
	c.dec.progress = move
	for {
		move()
		if f == nil {
			f = new(ioppb.Frame) // a data frame leaves it unused for the next one
		}
		var df dataFrame
		n, isData, err := c.dec.next(f, &df)
		if err != nil {
			if errors.Is(err, ErrEmptyFrame) {
				c.dropped.Add(1)
				continue
			}
			if c.side == SideEdge && errors.Is(err, errTooManyElements) {
				c.violation(err.Error())
				return
			}
			c.shutdown(classifyReadErr(err, c.cfg.HeartbeatTimeout))
			return
		}
		c.framesIn.Add(1)
		c.bytesIn.Add(int64(n))
		if isData {
			c.dispatchData(&df)
			continue
		}
		c.dispatch(f, c.dec.counted)
		f = nil
	}
}

// dispatchData routes a data frame to its stream, which takes the payload.
func (c *Conn) dispatchData(df *dataFrame) {
	cost := dataBodyLen(df.stream, len(df.payload)) + frameOverhead
	if !knownDataKind(df.kind) {
		putPayload(df.pool)
		c.dropped.Add(1)
		return
	}
	if s := c.stream(df.stream); s != nil {
		s.deliverData(df, cost)
		return
	}
	putPayload(df.pool)
	c.unroutedCost(df.stream, cost, fmt.Sprintf("data frame (kind %d)", df.kind))
}

func classifyReadErr(err error, wait time.Duration) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%w (%v)", ErrHeartbeatTimeout, wait)
	case errors.Is(err, io.EOF):
		return fmt.Errorf("peer closed the connection: %w", io.EOF)
	case errors.Is(err, net.ErrClosed):
		// Only this side closes the socket under a running read loop: a
		// server or client stopping.
		return fmt.Errorf("%w: this side is shutting down", ErrConnClosed)
	}
	return err
}

// dispatch routes a protobuf frame of elems elements (as the decoder
// counted them; 0 where it counts none).
func (c *Conn) dispatch(f *ioppb.Frame, elems int) {
	id := f.StreamId
	switch b := f.Body.(type) {
	case *ioppb.Frame_Heartbeat:
		c.onHeartbeat(b.Heartbeat)
	case *ioppb.Frame_WindowUpdate:
		if s := c.stream(id); s != nil {
			s.addCredit(b.WindowUpdate.GetIncrement())
		} else {
			c.unrouted(f)
		}
	case *ioppb.Frame_StreamReset:
		if s := c.stream(id); s != nil {
			c.remove(s)
			// Cut as every text a peer reports is (domain.PeerError):
			// the reset's code and message end up in logs and answers.
			s.end(&ResetError{Code: domain.ClipMessage(b.StreamReset.GetCode(), domain.MaxPeerCode),
				Message: domain.ClipMessage(b.StreamReset.GetMessage(), domain.MaxPeerMessage)})
		} else {
			c.unrouted(f)
		}
	case *ioppb.Frame_RunRequest, *ioppb.Frame_NodeCommandRequest, *ioppb.Frame_ProviderTunnelRequest, *ioppb.Frame_CancelRequest:
		c.openFromPeer(f)
	case *ioppb.Frame_RegisterRequest, *ioppb.Frame_RegisterResponse:
		c.dropped.Add(1)
		if c.side == SideEdge {
			c.violation("register frame after the handshake")
			return
		}
		c.log.Warn("register frame after handshake dropped")
	default:
		if id == 0 {
			c.handler.HandleControl(f)
			return
		}
		if s := c.stream(id); s != nil {
			s.deliver(f, elems)
		} else {
			c.unrouted(f)
		}
	}
}

// unrouted takes a frame for a stream that is not open. A node may still
// send on a stream the edge has ended (what was in flight), within the
// window it had; on the edge, a frame for a stream that never existed, or
// more late frames than any window allowed, is a protocol violation.
func (c *Conn) unrouted(f *ioppb.Frame) {
	// A frame whose body this version does not know is skipped, not fatal.
	if f.Body == nil {
		c.dropped.Add(1)
		return
	}
	c.unroutedCost(f.StreamId, frameCost(f), frameKind(f))
}

// unroutedCost is unrouted for a frame of the given credit cost and kind.
func (c *Conn) unroutedCost(id uint64, cost int, kind string) {
	c.dropped.Add(1)
	if c.side != SideEdge {
		return
	}
	c.mu.Lock()
	never := id > c.lastPeerID
	if !c.peerParity(id) {
		never = id >= c.nextID
	}
	var flood bool
	if !never {
		c.lateAllowance -= cost
		flood = c.lateAllowance < 0
	}
	c.mu.Unlock()
	switch {
	case never:
		c.violation(fmt.Sprintf("%s for stream %d, which was never opened", kind, id))
	case flood:
		c.violation(fmt.Sprintf("flood of frames for ended streams (%s for stream %d)", kind, id))
	}
}

// ErrProtocolViolation is why an edge drops a node that broke the protocol.
var ErrProtocolViolation = errors.New("protocol violation")

// violation ends the connection of a peer that broke the protocol; the
// reason is logged and becomes the connection's error.
func (c *Conn) violation(reason string) {
	c.log.Warn("peer violated the protocol; closing the connection", "reason", reason)
	c.shutdown(fmt.Errorf("%w: %s", ErrProtocolViolation, reason))
}

func frameKind(f *ioppb.Frame) string {
	if f.Body == nil {
		return "frame without body"
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", f.Body), "*ioppb.Frame_")
}

func (c *Conn) peerParity(id uint64) bool {
	if c.side == SideEdge {
		return id%2 == 0
	}
	return id%2 == 1
}

func (c *Conn) openFromPeer(f *ioppb.Frame) {
	id := f.StreamId
	c.mu.Lock()
	if c.ended() {
		// shutdown has already ended every stream; one added now would
		// never end and its handler would wait on it forever.
		c.mu.Unlock()
		c.dropped.Add(1)
		return
	}
	if id == 0 || !c.peerParity(id) || id <= c.lastPeerID {
		c.mu.Unlock()
		c.dropped.Add(1)
		if c.side == SideEdge {
			c.violation(fmt.Sprintf("%s opening stream %d (not a new id of the node's parity)", frameKind(f), id))
			return
		}
		c.log.Warn("open frame with invalid stream id dropped", "stream", id)
		return
	}
	c.lastPeerID = id
	// The peer counts a stream free once it has read the stream's last
	// frame; this side frees it once its handler returns, a little later.
	// Streams that have sent their last frame are not counted, so the peer
	// is not refused a stream it rightly thinks is free, but only within a
	// margin, so handlers that linger after their last frame cannot pile
	// up without bound.
	if n := len(c.streams); n-c.finishing >= c.cfg.MaxStreams || n >= c.cfg.MaxStreams+finishingMargin(c.cfg.MaxStreams) {
		c.mu.Unlock()
		c.trySendCtrl(resetFrame(id, "too_many_streams", fmt.Sprintf("peer has %d streams open", c.cfg.MaxStreams)))
		return
	}
	s := newStream(c, id)
	c.streams[id] = s
	c.mu.Unlock()
	c.handler.HandleOpen(s, f)
}

// finishingMargin is how many streams that have sent their last frame a
// side keeps beyond MaxStreams before it refuses the peer new ones.
func finishingMargin(maxStreams int) int { return max(4, maxStreams/8) }

// setLast marks s as having handed its last frame to the writer (on), or
// takes the mark back (a last frame that was not sent after all).
func (c *Conn) setLast(s *Stream, on bool) {
	c.mu.Lock()
	if c.streams[s.id] == s && s.last != on {
		s.last = on
		if on {
			c.finishing++
		} else {
			c.finishing--
		}
	}
	c.mu.Unlock()
}

// Open starts a new local stream whose first frame is f; it may take any
// of the link's MaxStreams (classControl).
func (c *Conn) Open(ctx context.Context, f *ioppb.Frame) (*Stream, error) {
	return c.open(ctx, f, classControl)
}

// open is Open for a stream of class, which bounds the streams it may take
// (streamClass).
func (c *Conn) open(ctx context.Context, f *ioppb.Frame, class streamClass) (*Stream, error) {
	// The writer would drop an oversized frame; refuse it here instead, so
	// the opener gets an error rather than a stream that never answers.
	// (The stream id is not set yet: allow for its varint.)
	if size := proto.Size(f) + binary.MaxVarintLen64 + 1; size > c.cfg.MaxFrameSize {
		return nil, fmt.Errorf("%w: %d > %d bytes", ErrFrameTooLarge, size, c.cfg.MaxFrameSize)
	}
	select {
	case c.opening <- struct{}{}:
		defer func() { <-c.opening }()
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.done:
		return nil, c.closedErr()
	}
	c.mu.Lock()
	if c.ended() {
		c.mu.Unlock()
		return nil, c.closedErr()
	}
	limit := c.cfg.MaxStreams
	if class != classControl {
		limit -= controlReserve(c.cfg.MaxStreams)
	}
	if len(c.streams) >= limit {
		c.mu.Unlock()
		return nil, ErrTooManyStreams
	}
	if class == classTunnel && c.tunnels >= tunnelShare(c.cfg.MaxStreams) {
		err := &tunnelsBusyError{held: c.tunnels, streams: c.cfg.MaxStreams}
		c.mu.Unlock()
		return nil, err
	}
	id := c.nextID
	c.nextID += 2
	s := newStream(c, id)
	if class == classTunnel {
		s.tunnel = true
		c.tunnels++
	}
	c.streams[id] = s
	c.mu.Unlock()
	f.StreamId = id
	if err := c.enqueueCtrl(ctx, f); err != nil {
		s.finish()
		return nil, err
	}
	return s, nil
}

func (c *Conn) stream(id uint64) *Stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[id]
}

func (c *Conn) remove(s *Stream) {
	c.mu.Lock()
	if c.streams[s.id] == s {
		delete(c.streams, s.id)
		if s.tunnel {
			c.tunnels--
		}
		if s.last {
			s.last = false
			c.finishing--
		}
		// What the peer may still send on s is the credit it still holds:
		// the window less what arrived and was not yet granted back. The
		// sum is capped at the most a peer can have in flight on all its
		// streams at once, so that many ended streams do not add up to a
		// licence to flood; a lower cap would cut off an honest node whose
		// streams were abandoned together (a caller that leaves with many
		// tunnels open).
		s.mu.Lock()
		left := max(s.window-s.queued-s.unacked, 0)
		s.mu.Unlock()
		c.lateAllowance = min(c.lateAllowance+left, c.cfg.MaxStreams*s.window)
	}
	c.mu.Unlock()
}

// enqueueCtrl queues a control frame, waiting for room.
func (c *Conn) enqueueCtrl(ctx context.Context, f *ioppb.Frame) error {
	c.offer()
	select {
	case c.ctrl <- f:
		return nil
	case <-c.done:
		c.withdraw()
		return c.closedErr()
	case <-ctx.Done():
		c.withdraw()
		return ctx.Err()
	}
}

// sendCtrlBounded queues a control frame that the peer should see (a
// reset), waiting briefly for room; it is for callers off the read loop.
func (c *Conn) sendCtrlBounded(f *ioppb.Frame) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if c.enqueueCtrl(ctx, f) != nil {
		c.dropped.Add(1)
	}
}

// trySendCtrl queues a control frame if there is room; the read loop uses it
// so that it never blocks on the writer.
func (c *Conn) trySendCtrl(f *ioppb.Frame) bool {
	c.offer()
	select {
	case c.ctrl <- f:
		return true
	default:
		c.withdraw()
		c.dropped.Add(1)
		return false
	}
}

// coalesceLimit is how many encoded bytes the writer gathers before it
// writes: frames ready together (a tunnel's status, headers and first body
// chunk; run events of many streams) share one write system call, and with
// TLS one record, instead of one each.
const coalesceLimit = 32 << 10

// writePiece is the most the writer hands the socket in one write when a
// batch is large (more than twice this): the write deadline is moved
// between pieces, so it bounds how long a piece may take, not a frame.
const writePiece = 64 << 10

// writeLoop is the writer: it writes what senders queue, in batches, until
// it has had nothing to write for writerLinger, or has just written a batch
// of heartbeats alone and finds nothing more, or the connection ends. At
// most one runs at a time (ws).
func (c *Conn) writeLoop() {
	defer c.wg.Done()
	// Frames are encoded straight into a buffer borrowed from the pool for
	// the length of one batch and written from it, so an idle link holds no
	// write buffer and a busy one copies each frame once.
	// A batch that starts with a heartbeat (an idle link's traffic) takes
	// a small buffer, and moves to a full-size one if other frames join it,
	// so a beat in flight pins 256 bytes, not 64 KiB.
	var pooled *[]byte
	var buf []byte
	var small bool
	release := func() {
		switch {
		case pooled == nil:
			return
		case small:
			if cap(buf) == beatBufferSize {
				*pooled = buf[:cap(buf)]
				beatPool.Put(pooled)
			}
		default:
			putPayload(pooled)
		}
		pooled, buf = nil, nil
	}
	defer release()
	// The write deadline is re-armed as the writer makes progress, so it
	// catches a peer that stopped reading, not a long busy spell on a slow
	// link (a batch can go on for as long as senders keep frames ready).
	arm := func() {
		if t, due := c.wd.Next(time.Now()); due {
			_ = c.nc.SetWriteDeadline(t)
		}
	}
	// writeAll writes b. A large batch (a big control frame: a run request,
	// a tunnel request's first body piece, a config refresh; up to
	// MaxFrameSize) goes in pieces of writePiece with the deadline moved
	// before each, so a write that goes on longer than WriteTimeout on a
	// slow link whose peer keeps reading is not cut off, while a peer that
	// reads nothing for WriteTimeout still fails it (a piece that makes no
	// progress). Ordinary batches (up to coalesceLimit and the frame that
	// crosses it) stay one write.
	writeAll := func(b []byte) error {
		for len(b) > 2*writePiece {
			arm()
			if _, err := c.nc.Write(b[:writePiece]); err != nil {
				return err
			}
			b = b[writePiece:]
		}
		arm()
		_, err := c.nc.Write(b)
		return err
	}
	flush := func() bool {
		if len(buf) == 0 {
			return true
		}
		if err := writeAll(buf); err != nil {
			c.shutdown(fmt.Errorf("write: %w", err))
			return false
		}
		buf = buf[:0]
		return true
	}
	_, vectored := c.nc.(*net.TCPConn)
	// writeRaw writes the batch so far and a large pre-encoded data frame
	// with one writev, so its payload is not copied again. The writev list
	// escapes (WriteTo hands it to the socket), so it is made at the first
	// writev and reused: once per writer, not once per frame, and never by
	// a writer that only writes heartbeats.
	var wv *writevList
	writeRaw := func(raw []byte) bool {
		arm()
		var err error
		if len(buf) == 0 {
			_, err = c.nc.Write(raw)
		} else {
			if wv == nil {
				wv = new(writevList)
			}
			wv.vec = [2][]byte{buf, raw}
			wv.bufs = wv.vec[:]
			_, err = wv.bufs.WriteTo(c.nc)
			wv.vec = [2][]byte{} // hold no pooled buffer past its write
		}
		if err != nil {
			c.shutdown(fmt.Errorf("write: %w", err))
			return false
		}
		buf = buf[:0]
		return true
	}
	// taken counts the frames received since ws was last told; wrote says
	// whether any arrived since the linger timer last fired; beatsOnly, that
	// the last batch held nothing but heartbeats and replies.
	var taken int64
	wrote, beatsOnly := false, false
	// ahead holds frames already taken from the channels, to be written
	// before anything else is taken (ordered).
	var ahead []outFrame
	// end ends the writer if no frame has been announced that it has not
	// taken. A sender announcing one after the swap finds no writer and
	// starts one.
	end := func() bool {
		if c.cfg.writerStays {
			return false
		}
		c.ws.Add(-taken * pendingOne)
		taken = 0
		return c.ws.CompareAndSwap(writerRunning, 0)
	}
	var linger *time.Timer // made at the first wait: an idle link's writer never waits
	defer func() {
		if linger != nil {
			linger.Stop()
		}
	}()
	for {
		var o outFrame
		select {
		case o.f = <-c.ctrl:
		default:
			// A batch of heartbeats alone is an idle link's traffic: its
			// writer ends at once instead of lingering, so an idle link pays
			// for no timer and no wake-up beyond the beat itself.
			if beatsOnly && end() {
				return
			}
			beatsOnly = false
			if linger == nil {
				linger = time.NewTimer(c.cfg.writerLinger)
			}
			select {
			case o.f = <-c.ctrl:
			case o = <-c.data:
				o = c.ordered(o, &ahead)
			case <-linger.C:
				// Nothing written for a whole linger period: end.
				if !wrote && end() {
					return
				}
				wrote = false
				linger.Reset(c.cfg.writerLinger)
				continue
			case <-c.done:
				return
			}
		}
		wrote, beatsOnly = true, true
		for o.f != nil || o.raw != nil {
			taken++
			_, beat := o.f.GetBody().(*ioppb.Frame_Heartbeat)
			beatsOnly = beatsOnly && beat
			if o.f == closeSentinel {
				flush()
				cause := ErrConnClosed
				if p := c.closeWhy.Load(); p != nil {
					cause = *p
				}
				c.shutdown(cause)
				return
			}
			// Through TLS every write is a record and a system call of its
			// own: there one copy into the batch beats a second write.
			if len(o.raw) >= rawDirectSize && (len(buf) == 0 || vectored) {
				ok := writeRaw(o.raw)
				putPayload(o.pool)
				if !ok {
					return
				}
				c.framesOut.Add(1)
				c.bytesOut.Add(int64(len(o.raw)))
			} else {
				switch {
				case pooled == nil && beat:
					pooled, small = beatPool.Get().(*[]byte), true
					buf = (*pooled)[:0]
				case pooled == nil:
					buf, pooled = getFrameBuf(pooledFrameSize)
					buf, small = buf[:0], false
				case small && (!beat || len(buf) > beatBufferSize/2):
					nb, big := getFrameBuf(pooledFrameSize)
					nb = append(nb[:0], buf...)
					release()
					pooled, buf, small = big, nb, false
				}
				n := len(buf)
				var err error
				if o.raw != nil {
					buf = append(buf, o.raw...)
					putPayload(o.pool)
				} else if buf, err = AppendFrame(buf, o.f, c.cfg.MaxFrameSize); err != nil {
					// Not one byte of it may reach the peer (AppendFrame may
					// have written the length prefix and most of the frame):
					// the peer would reject the frame as malformed and close
					// the link, ending every run and tunnel on it.
					buf = c.unencodable(buf[:n], o.f, err)
				}
				if err == nil {
					c.framesOut.Add(1)
					c.bytesOut.Add(int64(len(buf) - n))
				}
			}
			if len(buf) >= coalesceLimit && !flush() {
				return
			}
			o = c.nextQueued(&ahead)
			if o.f == nil && o.raw == nil {
				// The sender just released often has its next frame ready
				// (a tunnel's status, header, first body chunk): let it run
				// once so they share one write instead of one each.
				runtime.Gosched()
				o = c.nextQueued(&ahead)
			}
		}
		if !flush() {
			return
		}
		release()
	}
}

// ErrFrameEncode ends a stream one of whose outgoing frames could not be
// encoded (a string field that is not UTF-8, a frame over the size limit):
// a bug on the sending side that only that stream pays for.
var ErrFrameEncode = errors.New("outgoing frame could not be encoded")

// unencodable handles a frame the writer could not encode, with buf holding
// the batch without it. The frame is dropped and its stream, if any, ends
// here with ErrFrameEncode (its sender's next Send or Recv fails with it).
// The peer is told with a reset written where the frame would have been,
// unless the frame was the one opening the stream (the peer never heard of
// that stream). A stream-0 frame is only dropped. The link goes on.
func (c *Conn) unencodable(buf []byte, f *ioppb.Frame, err error) []byte {
	c.dropped.Add(1)
	kind := frameKind(f)
	c.log.Error("outgoing frame could not be encoded: dropped, and its stream (if any) failed", "stream", f.StreamId, "frame", kind, "err", err)
	if f.StreamId == 0 {
		return buf
	}
	if s := c.stream(f.StreamId); s != nil && s.end(fmt.Errorf("%w: %s: %w", ErrFrameEncode, kind, err)) {
		c.remove(s)
	}
	if opensStream(f) {
		return buf
	}
	// The reset's own text must encode: the protobuf error is ASCII, but
	// nothing here may depend on that.
	msg := validText(fmt.Sprintf("%s frame could not be encoded: %v", kind, err))
	n := len(buf)
	out, rerr := AppendFrame(buf, resetFrame(f.StreamId, "internal", msg), c.cfg.MaxFrameSize)
	if rerr != nil {
		return buf[:n]
	}
	c.framesOut.Add(1)
	c.bytesOut.Add(int64(len(out) - n))
	return out
}

// outFrame is one frame for the writer: a protobuf frame it encodes, or a
// data frame a sender already encoded into a pooled buffer (raw), which
// the writer gives back once written.
type outFrame struct {
	f    *ioppb.Frame
	raw  []byte
	pool *[]byte
	// stream is the stream a data-channel frame belongs to (Stream.send).
	stream uint64
}

// writevList is the writer's batch and raw frame for one writev.
type writevList struct {
	vec  [2][]byte
	bufs net.Buffers
}

// rawDirectSize is the encoded size from which a data frame is written from
// its own buffer (with the batch before it, in one writev) instead of being
// copied into the batch.
const rawDirectSize = 8 << 10

// nextQueued returns a frame that is ready without waiting: those in ahead
// (ordered), then control frames, then data.
func (c *Conn) nextQueued(ahead *[]outFrame) outFrame {
	if len(*ahead) > 0 {
		o := (*ahead)[0]
		(*ahead)[0] = outFrame{}
		*ahead = (*ahead)[1:]
		return o
	}
	select {
	case f := <-c.ctrl:
		return outFrame{f: f}
	default:
	}
	select {
	case f := <-c.ctrl:
		return outFrame{f: f}
	case o := <-c.data:
		return c.ordered(o, ahead)
	default:
		return outFrame{}
	}
}

// ordered is called with a data frame o just taken from c.data, and
// returns the frame to write first, leaving the rest of the order in ahead
// (empty on entry). When both channels are ready a select picks either,
// so o may have been taken while control frames waited — among them,
// possibly, the frame that opens o's stream: a sender queues the opening
// frame on ctrl and then sends the stream's first data, so the opening
// frame is in ctrl by the time o is received. Written after o, the data
// would reach a peer that has no such stream yet and be dropped, a hole
// in a request body. So the control frames waiting now go first (control
// first, as always), except those of o's own stream that do not open it
// (an end or reset its sender may have queued right after o): those keep
// their place after o. The look is bounded by the control queue's size.
//
// CloseAfterFlush's sentinel goes last: o was handed over before it was
// queued (its sender's Send has returned, and the writer may take o and
// run this only after the closer queued the sentinel), so o is among what
// the close must write first.
func (c *Conn) ordered(o outFrame, ahead *[]outFrame) outFrame {
	var after []*ioppb.Frame // o's stream's own, queued after o
	first := len(*ahead)
	closing := false
	for range cap(c.ctrl) {
		var f *ioppb.Frame
		select {
		case f = <-c.ctrl:
		default:
		}
		if f == nil {
			break
		}
		if f == closeSentinel {
			closing = true
			continue
		}
		if f.StreamId == o.stream && o.stream != 0 && !opensStream(f) {
			after = append(after, f)
			continue
		}
		*ahead = append(*ahead, outFrame{f: f})
	}
	if closing {
		after = append(after, closeSentinel)
	}
	if len(*ahead) == first {
		for _, f := range after {
			*ahead = append(*ahead, outFrame{f: f})
		}
		return o
	}
	*ahead = append(*ahead, o)
	for _, f := range after {
		*ahead = append(*ahead, outFrame{f: f})
	}
	next := (*ahead)[first]
	(*ahead)[first] = outFrame{}
	*ahead = (*ahead)[first+1:]
	return next
}

// opensStream reports whether f opens a stream (the frames the peer's read
// loop hands to openFromPeer).
func opensStream(f *ioppb.Frame) bool {
	switch f.Body.(type) {
	case *ioppb.Frame_RunRequest, *ioppb.Frame_NodeCommandRequest, *ioppb.Frame_ProviderTunnelRequest, *ioppb.Frame_CancelRequest:
		return true
	}
	return false
}

// heartbeatFrame is the periodic probe (Conn.heartbeat). It goes ahead of
// data frames; a writer stuck on the socket is caught by its write deadline.
func heartbeatFrame(now time.Time) *ioppb.Frame {
	return &ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{SentUnixNano: now.UnixNano()}}}
}

func (c *Conn) onHeartbeat(h *ioppb.Heartbeat) {
	if h.GetReply() {
		if p := c.probe.Load(); p != nil && h.GetEchoUnixNano() == p.stamp {
			c.rtt.Store(int64(time.Since(p.at)))
		}
		return
	}
	c.trySendCtrl(&ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{
		Reply: true, EchoUnixNano: h.GetSentUnixNano(), SentUnixNano: time.Now().UnixNano(),
	}}})
}

// sendControl queues a frame of the connection itself (stream 0).
func (c *Conn) sendControl(ctx context.Context, f *ioppb.Frame) error {
	f.StreamId = 0
	// The writer would drop an oversized frame; refuse it here, as Open
	// does, so the sender learns it instead of waiting for an answer.
	if size := proto.Size(f); size > c.cfg.MaxFrameSize {
		return fmt.Errorf("%w: %d > %d bytes", ErrFrameTooLarge, size, c.cfg.MaxFrameSize)
	}
	return c.enqueueCtrl(ctx, f)
}

// headers converts h for the wire to the peer: header values that are not
// UTF-8 go only where both ends agreed to raw_header_values; otherwise (an
// older peer, which would reject the frame) they are left out, so the
// request or response still goes through without them. Those are counted
// (Stats.HeaderValuesDropped) and the first is logged.
func (c *Conn) headers(h domain.Header) []*ioppb.Header {
	var d headerDrops
	out := headersToProto(h, c.rawHeaders, &d)
	c.noteHeaderDrops(d)
	return out
}

// tunnelFrame converts f for the wire to the peer, its headers as headers
// does.
func (c *Conn) tunnelFrame(f domain.TunnelFrame) *ioppb.ProviderTunnelFrame {
	var d headerDrops
	pf := tunnelFrameToProto(f, c.rawHeaders, &d)
	c.noteHeaderDrops(d)
	return pf
}

func (c *Conn) noteHeaderDrops(d headerDrops) {
	if d.values == 0 {
		return
	}
	if c.headerDrops.Add(int64(d.values)) == int64(d.values) {
		c.log.Warn("header values that are not UTF-8 left out: the peer is an older version that cannot read them (logged once per link)",
			"header", d.name, "values", d.values)
	}
}

// Stats is a snapshot of a connection's counters.
type Stats struct {
	Since     time.Time
	FramesIn  int64
	FramesOut int64
	BytesIn   int64
	BytesOut  int64
	Dropped   int64
	RTT       time.Duration
	Streams   int
	// HeaderValuesDropped counts header values left out because the peer
	// cannot read values that are not UTF-8 (an older version).
	HeaderValuesDropped int64
}

// Stats returns the connection's counters.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	n := len(c.streams)
	c.mu.Unlock()
	return Stats{
		Since: c.since, FramesIn: c.framesIn.Load(), FramesOut: c.framesOut.Load(),
		BytesIn: c.bytesIn.Load(), BytesOut: c.bytesOut.Load(), Dropped: c.dropped.Load(),
		RTT: time.Duration(c.rtt.Load()), Streams: n, HeaderValuesDropped: c.headerDrops.Load(),
	}
}

func resetFrame(id uint64, code, msg string) *ioppb.Frame {
	return &ioppb.Frame{StreamId: id, Body: &ioppb.Frame_StreamReset{StreamReset: &ioppb.StreamReset{Code: code, Message: msg}}}
}
