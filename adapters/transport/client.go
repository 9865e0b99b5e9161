package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// NodeHandler is what the node's transport needs from the application. The
// client calls each method on a goroutine of its own, never on the read loop.
type NodeHandler interface {
	// ApplyConfig installs a config pushed by the edge (at register and on refresh).
	ApplyConfig(ctx context.Context, cfg domain.NodeConfig) error
	// ExecuteRun runs req to its end, sending events to out. It blocks.
	ExecuteRun(req domain.RunRequest, out ports.RunOutput)
	// CancelRun cancels a run; reason is the edge's, empty for a cancel by
	// request (CancelRequest.reason).
	CancelRun(ctx context.Context, runID, reason string) error
	TerminateSession(ctx context.Context, adapter, target, sessionID string) error
	RunCommand(ctx context.Context, name string, args []byte, progress func([]byte) error) ([]byte, error)
	// OpenTunnel relays one provider request. It blocks until the response
	// has been relayed or ctx ends.
	OpenTunnel(ctx context.Context, req domain.TunnelRequest, body io.Reader, out ports.TunnelSink)
}

// RejectedError is returned when the edge refuses the registration.
type RejectedError struct{ Reason string }

func (e *RejectedError) Error() string { return "edge refused registration: " + e.Reason }

// Fatal reports whether retrying cannot help (the token is unknown, or the
// client certificate names another node). The
// reason is a code, optionally followed by ": detail".
func (e *RejectedError) Fatal() bool {
	code, _, _ := strings.Cut(e.Reason, ":")
	return code == domain.CodeUnknownToken || code == domain.CodeIdentityMismatch
}

// ClientConfig configures the node's link to the edge.
type ClientConfig struct {
	Addr      string
	Token     string
	Info      domain.NodeInfo
	Transport Config
	// Reconnect backoff: full jitter, wait rand(0, min(MaxBackoff, MinBackoff·2ⁿ)).
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// HealthyAfter is how long a link must last before the backoff resets.
	HealthyAfter time.Duration
	// RepeatWarning is how often failures to reach the edge for a reason
	// already reported are logged at warn again (DefaultRepeatWarning);
	// the attempts between are logged at debug.
	RepeatWarning time.Duration
	// OnRegistered, if set, is called after every accepted registration,
	// on the goroutine that then reads the link: it must not block.
	OnRegistered func(nodeID string)
	// Stats, if set, is sent to the edge after registering and every
	// StatsInterval (DefaultStatsInterval) for its metrics.
	Stats         func() domain.NodeStats
	StatsInterval time.Duration
	// OnFatal, if set, is called once, on Run's goroutine, with the error
	// Run returns when the edge refuses the node for good or cannot be
	// trusted, as soon as that is known: Run then still waits for the
	// exchanges under way (a background run goes on after its link is
	// lost), so its caller learns of the refusal here, in time to say so
	// and to stop them.
	OnFatal func(err error)
}

// Client keeps a node connected to its edge.
type Client struct {
	cfg ClientConfig
	h   NodeHandler

	mu         sync.Mutex
	conn       *Conn
	stats      *statsReporter // the current link's, while it has one
	applying   chan struct{}  // closed when the last queued config apply has returned
	wg         sync.WaitGroup // per-stream handler goroutines
	reconnects atomic.Int64
	// linkedAt is when the current attempt registered (nil before that): a
	// failure is reported as a lost link only when there was one, and the
	// backoff restarts only after a link that stayed up HealthyAfter. A
	// time.Time, not unix nanoseconds, so that span is read on the monotonic
	// clock and a wall-clock step neither makes nor unmakes a healthy link.
	linkedAt atomic.Pointer[time.Time]
	// draining is set by Drain: every link tells the edge so (node_draining).
	draining atomic.Bool
}

// Drain tells the edge that this node is stopping and admits no new run:
// the edge sends it none from then on, while the runs in flight go on and
// their events still travel on the link. It is said on the current link at
// once (ahead of any data) and on every link registered after it. Call it
// before the node starts refusing runs, so that the edge stops choosing
// it first; an edge that predates node_draining ignores it.
func (c *Client) Drain() {
	c.draining.Store(true)
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn != nil {
		sendDraining(conn)
	}
}

// sendDraining queues node_draining on conn, waiting briefly for room in
// the control queue; a link that has ended or is stuck loses it, and the
// edge then learns of the drain from the runs the node refuses.
func sendDraining(conn *Conn) {
	conn.sendCtrlBounded(&ioppb.Frame{Body: &ioppb.Frame_NodeDraining{NodeDraining: &ioppb.NodeDraining{}}})
}

// nextApply queues a config apply behind every one queued before it, so the
// config in force is always the last one the edge sent. The caller waits for
// prev (nil when nothing is queued), applies, then calls done.
func (c *Client) nextApply() (prev <-chan struct{}, done func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.applying != nil {
		prev = c.applying
	}
	next := make(chan struct{})
	c.applying = next
	return prev, func() { close(next) }
}

var _ ports.TransportStatus = (*Client)(nil)

// NewClient returns a client; Run connects it.
func NewClient(cfg ClientConfig, h NodeHandler) *Client {
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 500 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.HealthyAfter <= 0 {
		cfg.HealthyAfter = 10 * time.Second
	}
	if cfg.RepeatWarning <= 0 {
		cfg.RepeatWarning = DefaultRepeatWarning
	}
	cfg.Transport = cfg.Transport.withDefaults()
	return &Client{cfg: cfg, h: h}
}

// Run connects, serves and reconnects until ctx ends, the edge refuses the
// node for good (a *RejectedError) or cannot be trusted (a *TrustError);
// only the latter two return an error, after OnFatal has been called with
// it. When ctx ends, the frames already handed to the link are written
// before it closes. Run returns once the exchanges it started (runs,
// commands, tunnels) have ended.
func (c *Client) Run(ctx context.Context) error {
	defer c.wg.Wait()
	// The link is read on this goroutine, inside session, so Run's own
	// frame stays under the idle read loop: the loop's state and logging
	// live in retry.
	var r retryState
	for {
		r.begin(c)
		err := c.session(ctx, &r)
		if stop, rerr := c.retry(ctx, err, &r); stop {
			if rerr != nil && c.cfg.OnFatal != nil {
				c.cfg.OnFatal(rerr)
			}
			return rerr
		}
	}
}

// DefaultRepeatWarning is how often a node that keeps failing to reach its
// edge for the same reason says so at warn; the attempts between go to
// debug.
const DefaultRepeatWarning = 5 * time.Minute

// maxWarnedReasons bounds the reasons warned about once each between two
// periodic warnings, so that errors alternating between many reasons
// cannot bring back a warning per attempt.
const maxWarnedReasons = 8

// retryState is Run's reconnect bookkeeping. Only Run's goroutine and the
// register exchange it waits for touch it.
type retryState struct {
	attempt int
	// now is the clock of the outage's log lines (time.Now when nil).
	now func() time.Time
	// The outage: the failures since the last registration. A lost link
	// opens one as its first failure.
	failures int
	lost     bool      // the outage began with a registered link's loss
	since    time.Time // its first failure
	// The last warning, the attempts logged at debug since, and the
	// reasons warned about since the last periodic warning.
	warnedAt time.Time
	quiet    int
	warned   map[string]bool
}

func (r *retryState) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

//go:noinline
func (r *retryState) begin(c *Client) {
	c.linkedAt.Store(nil)
}

// failed logs a failed attempt (or the loss of the link, lost): at warn
// when it opens an outage, when its reason is new since the last periodic
// warning, and when every has passed since the last warning (with the
// attempts since and the last error); at debug otherwise, so that an edge
// away for hours does not fill the log with a line per attempt.
func (r *retryState) failed(log *slog.Logger, edge string, err error, in time.Duration, lost bool, every time.Duration) {
	now := r.clock()
	reason := failureReason(err)
	in = in.Round(time.Millisecond)
	r.failures++
	if r.failures == 1 {
		r.lost, r.since, r.warnedAt, r.quiet = lost, now, now, 0
		r.warned = map[string]bool{reason: true}
		if lost {
			log.Warn("link to edge lost; reconnecting", "edge", edge, "err", err, "in", in)
		} else {
			log.Warn("cannot connect to the edge; retrying", "edge", edge, "err", err, "in", in)
		}
		return
	}
	attempts := r.failures
	if r.lost {
		attempts-- // the loss was no attempt
	}
	downFor := now.Sub(r.since).Round(time.Millisecond)
	switch {
	case now.Sub(r.warnedAt) >= every:
		log.Warn("still cannot connect to the edge; retrying", "edge", edge, "err", err, "in", in,
			"attempts", r.quiet+1, "down_for", downFor)
		r.warned = map[string]bool{reason: true}
	case !r.warned[reason] && len(r.warned) < maxWarnedReasons:
		log.Warn("cannot connect to the edge; retrying", "edge", edge, "err", err, "in", in,
			"attempts", r.quiet+1, "down_for", downFor)
		r.warned[reason] = true
	default:
		log.Debug("cannot connect to the edge; retrying", "edge", edge, "err", err, "in", in, "attempt", attempts)
		r.quiet++
		return
	}
	r.warnedAt, r.quiet = now, 0
}

// registered ends the outage, if one was under way, and returns what the
// registration's log line adds about it: how long the node was without a
// link and how many attempts failed.
func (r *retryState) registered() []any {
	if r == nil || r.failures == 0 {
		return nil
	}
	attempts := r.failures
	if r.lost {
		attempts--
	}
	attrs := []any{"down_for", r.clock().Sub(r.since).Round(time.Millisecond), "failed_attempts", attempts}
	r.failures, r.lost, r.quiet, r.warned = 0, false, 0, nil
	return attrs
}

// failureReason is err's text without what changes from one attempt to the next
// for the same reason: the local address of a network error ("read tcp
// 127.0.0.1:53412->…"), a refusal's detail after its code.
func failureReason(err error) string {
	var rej *RejectedError
	if errors.As(err, &rej) {
		code, _, _ := strings.Cut(rej.Reason, ":")
		return "refused: " + code
	}
	s := err.Error()
	var op *net.OpError
	if errors.As(err, &op) && op.Source != nil {
		bare := *op
		bare.Source = nil
		s = strings.Replace(s, op.Error(), bare.Error(), 1)
	}
	return s
}

// retry decides what follows a session that ended with err: stop (with
// Run's result) when ctx has ended or the refusal is final, otherwise report
// the failed attempt and wait out the backoff.
func (c *Client) retry(ctx context.Context, err error, r *retryState) (stop bool, rerr error) {
	if ctx.Err() != nil {
		return true, nil
	}
	// A refused token and an untrusted edge (TrustError) are final.
	var fatal interface{ Fatal() bool }
	if errors.As(err, &fatal) && fatal.Fatal() {
		return true, err
	}
	// Only a link that registered and stayed up restarts the backoff: an
	// attempt that merely took long (a handshake timing out against a
	// saturated edge) is a failure like any other.
	if at := c.linkedAt.Load(); at != nil && time.Since(*at) >= c.cfg.HealthyAfter {
		r.attempt = 0
	}
	delay := backoff(r.attempt, c.cfg.MinBackoff, c.cfg.MaxBackoff)
	r.attempt++
	c.reconnects.Add(1)
	r.failed(c.cfg.Transport.Logger, c.cfg.Addr, err, delay, c.linkedAt.Load() != nil, c.cfg.RepeatWarning)
	select {
	case <-time.After(delay):
		return false, nil
	case <-ctx.Done():
		return true, nil
	}
}

// backoff is "full jitter": uniform in [0, min(max, min·2ⁿ)].
func backoff(attempt int, lo, hi time.Duration) time.Duration {
	ceil := min(lo, hi)
	// Double step by step: lo<<attempt overflows for large lo.
	for i := 0; i < attempt && ceil < hi; i++ {
		ceil = min(hi, 2*ceil)
		if ceil <= 0 { // 2*ceil overflowed
			ceil = hi
		}
	}
	if ceil <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceil)))
}

// session registers and then reads the link on this goroutine until it
// ends. The register exchange (dial, TLS, protobuf, the config) runs on a
// goroutine of its own that ends with it: on this one it would grow the
// stack the idle read loop then sits on, and the runtime halves a stack only
// while less than a quarter of it is in use, which a read in progress is not.
func (c *Client) session(ctx context.Context, r *retryState) error {
	var conn *Conn
	var err error
	registered := make(chan struct{})
	go func() {
		defer close(registered)
		conn, err = c.register(ctx, r)
	}()
	<-registered
	if err != nil {
		return err
	}
	if c.draining.Load() {
		// Drain was called before this link registered (the last one broke
		// during the drain): this edge must hear it too.
		sendDraining(conn)
	}
	stopStats := func() {}
	if c.cfg.Stats != nil {
		r := reportStats(ctx, conn, c.cfg.Stats, c.cfg.StatsInterval)
		c.mu.Lock()
		c.stats = r
		c.mu.Unlock()
		stopStats = func() {
			c.mu.Lock()
			if c.stats == r {
				c.stats = nil
			}
			c.mu.Unlock()
			r.stop()
		}
	}
	// The read loop runs here until the link ends; shutting the node down
	// ends it (AfterFunc's goroutine exists only once ctx is done). What is
	// queued goes out first: a stopping node ends its runs before it ends
	// the link, and their last events (cancelled) must reach the edge, not
	// be cut off with the link.
	stop := context.AfterFunc(ctx, func() { conn.CloseAfterFlush(errors.New("node shutting down")) })
	conn.run()
	stop()
	conn.Close(nil)
	stopStats()
	return conn.Err()
}

// register dials the edge, registers and applies the config it sends; the
// returned connection is ready to run. A registration ends r's outage (r
// may be nil).
func (c *Client) register(ctx context.Context, r *retryState) (*Conn, error) {
	tc := c.cfg.Transport
	d := net.Dialer{Timeout: tc.HandshakeTimeout, KeepAlive: tc.HeartbeatInterval}
	nc, err := d.DialContext(ctx, "tcp", c.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", c.cfg.Addr, err)
	}
	_ = nc.SetDeadline(time.Now().Add(tc.HandshakeTimeout))
	// A stop (ctx) ends the exchange at once: a node stopping while an edge
	// that took the connection does not answer (a load balancer with no
	// backend, a frozen edge) waited out the handshake timeout.
	raw := nc
	unwatch := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Now()) })
	defer unwatch()
	if nc, err = secureClient(nc, tc.TLS); err != nil {
		return nil, err
	}
	req := &ioppb.RegisterRequest{
		Token: c.cfg.Token, NodeVersion: c.cfg.Info.Version, Hostname: c.cfg.Info.Hostname, AdapterTypes: c.cfg.Info.AdapterTypes,
		Os: c.cfg.Info.OS, Arch: c.cfg.Info.Arch, InitialWindow: tc.StreamWindow,
		DataFrames: !tc.NoDataFrames, RawHeaderValues: !tc.noRawHeaders,
	}
	buf, err := AppendFrame(nil, &ioppb.Frame{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: req}}, tc.MaxFrameSize)
	if err == nil {
		_, err = nc.Write(buf)
	}
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("send register: %w", err)
	}
	dec := NewDecoder(nc, tc.MaxFrameSize)
	f := new(ioppb.Frame)
	if _, err := dec.Decode(f); err != nil {
		_ = nc.Close()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The handshake's own limit, not the link's heartbeat.
			return nil, fmt.Errorf("read register response: the edge did not answer within the handshake timeout (%v)", tc.HandshakeTimeout)
		}
		return nil, plaintextHint(tc.TLS, clientCertHint(fmt.Errorf("read register response: %w", classifyReadErr(err, tc.HandshakeTimeout))))
	}
	resp := f.GetRegisterResponse()
	if resp == nil {
		_ = nc.Close()
		return nil, fmt.Errorf("expected register_response, got %T", f.Body)
	}
	if !resp.GetAccepted() {
		_ = nc.Close()
		return nil, &RejectedError{Reason: resp.GetReason()}
	}
	// Adopt the edge's liveness settings so both ends agree.
	if ms := resp.GetHeartbeatIntervalMs(); ms > 0 {
		tc.HeartbeatInterval = time.Duration(ms) * time.Millisecond
	}
	if ms := resp.GetHeartbeatTimeoutMs(); ms > 0 {
		tc.HeartbeatTimeout = time.Duration(ms) * time.Millisecond
		tc.WriteTimeout = tc.HeartbeatTimeout
	}
	if err := checkEdgeSettings(tc, resp.GetInitialWindow()); err != nil {
		_ = nc.Close()
		return nil, err
	}
	cfg := configToDomain(resp.GetConfig())
	prev, applied := c.nextApply()
	if prev != nil {
		// A refresh from the previous connection is still being applied;
		// this newer config must not be overwritten by it.
		select {
		case <-prev:
		case <-ctx.Done():
			applied()
			_ = nc.Close()
			return nil, ctx.Err()
		}
	}
	err = c.h.ApplyConfig(ctx, cfg)
	applied()
	if err != nil {
		// The edge admitted this node with the whole config and routes runs
		// by it, but the node refused it (all or nothing) and runs its
		// previous one, if any. Staying linked would leave the edge's view
		// false, so the node leaves and retries with backoff; the edge lists
		// it as disconnected meanwhile, with this reason: an ack of the
		// registration's version with the error tells it (best effort,
		// within the handshake's deadline).
		ack := &ioppb.ConfigRefreshAck{Version: cfg.Version, Error: validText(err.Error())}
		if b, aerr := AppendFrame(nil, &ioppb.Frame{Body: &ioppb.Frame_ConfigRefreshAck{ConfigRefreshAck: ack}}, tc.MaxFrameSize); aerr == nil {
			_, _ = nc.Write(b)
		}
		_ = nc.Close()
		return nil, fmt.Errorf("config from edge (version %d) cannot be applied, disconnecting: %w", cfg.Version, err)
	}
	if !unwatch() {
		// The stop came as the exchange ended: the deadline it set stands.
		_ = nc.Close()
		return nil, ctx.Err()
	}
	_ = nc.SetDeadline(time.Time{})
	conn := newConn(nc, dec, tc, SideNode, resp.GetInitialWindow(), &nodeDispatch{c: c})
	conn.dataFrames = resp.GetDataFrames() && !tc.NoDataFrames
	conn.rawHeaders = resp.GetRawHeaderValues() && !tc.noRawHeaders
	c.mu.Lock()
	c.conn = conn
	c.mu.Unlock()
	now := time.Now()
	c.linkedAt.Store(&now)
	tc.Logger.Info("registered with edge", append([]any{"edge", c.cfg.Addr, "node", cfg.NodeID, "adapters", len(cfg.Adapters)}, r.registered()...)...)
	if c.cfg.OnRegistered != nil {
		c.cfg.OnRegistered(cfg.NodeID)
	}
	return conn, nil
}

// checkEdgeSettings refuses the settings an edge's register response gave
// (tc with the edge's heartbeat adopted, and its window) when they cannot
// work: a broken or hostile edge. The node then retries with backoff.
func checkEdgeSettings(tc Config, window uint32) error {
	errs := []error{windowTooSmall(window)}
	errs = append(errs, heartbeatRangeErrs(tc.HeartbeatInterval, tc.HeartbeatTimeout)...)
	if tc.HeartbeatTimeout <= tc.HeartbeatInterval {
		errs = append(errs, fmt.Errorf("heartbeat timeout %v does not exceed the interval %v", tc.HeartbeatTimeout, tc.HeartbeatInterval))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("the edge's register response has settings that cannot work: %w", err)
	}
	return nil
}

// TransportStatus reports the current link for the transport_status command.
func (c *Client) TransportStatus() ports.TransportStats {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	st := ports.TransportStats{Reconnects: c.reconnects.Load(), Edge: c.cfg.Addr}
	if conn == nil {
		return st
	}
	s := conn.Stats()
	st.Connected = conn.Err() == nil
	if st.Connected {
		st.ConnectedSince = s.Since.UnixNano()
	}
	st.LastRTTNanos = int64(s.RTT)
	st.FramesIn, st.FramesOut, st.BytesIn, st.BytesOut = s.FramesIn, s.FramesOut, s.BytesIn, s.BytesOut
	return st
}

// nodeDispatch routes the edge's frames to the application. Each exchange
// gets its own goroutine, owned by the client and ended by its stream.
type nodeDispatch struct{ c *Client }

func (d *nodeDispatch) HandleOpen(s *Stream, f *ioppb.Frame) {
	c := d.c
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		switch b := f.Body.(type) {
		case *ioppb.Frame_RunRequest:
			c.h.ExecuteRun(runRequestToDomain(b.RunRequest), &runOutput{s: s})
			// Normally Close already ended the stream and this does nothing;
			// otherwise the edge learns the run is over instead of waiting
			// forever, and the stream does not leak.
			s.Reset("internal", "run ended without a terminal event")
		case *ioppb.Frame_CancelRequest:
			d.cancel(s, b.CancelRequest)
		case *ioppb.Frame_NodeCommandRequest:
			d.command(s, b.NodeCommandRequest)
		case *ioppb.Frame_ProviderTunnelRequest:
			d.tunnel(s, b.ProviderTunnelRequest)
		default:
			s.Reset("unsupported", fmt.Sprintf("unexpected %T", f.Body))
		}
	}()
}

func (d *nodeDispatch) HandleControl(f *ioppb.Frame) {
	r := f.GetConfigRefresh()
	if r == nil {
		return
	}
	c := d.c
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	// Refreshes are applied one at a time in arrival order: applied
	// concurrently, an older config could end up in force.
	prev, applied := c.nextApply()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer applied()
		if prev != nil {
			<-prev
		}
		cfg := configToDomain(r.GetConfig())
		ack := &ioppb.ConfigRefreshAck{Version: cfg.Version}
		ctx, cancel := context.WithTimeout(context.Background(), conn.cfg.HeartbeatTimeout)
		defer cancel()
		err := c.h.ApplyConfig(ctx, cfg)
		if err != nil {
			ack.Error = validText(err.Error())
		}
		_ = conn.sendControl(ctx, &ioppb.Frame{Body: &ioppb.Frame_ConfigRefreshAck{ConfigRefreshAck: ack}})
		if err == nil {
			// The config sets the adapters' slots the stats report: the
			// edge's metrics show the new ones now, not at the next tick.
			c.mu.Lock()
			r := c.stats
			c.mu.Unlock()
			if r != nil {
				r.now()
			}
		}
	}()
}

func (d *nodeDispatch) cancel(s *Stream, r *ioppb.CancelRequest) {
	ctx, cancel := context.WithTimeout(s.Context(), 30*time.Second)
	defer cancel()
	var err error
	switch r.GetKind() {
	case ioppb.CancelKind_CANCEL_RUN:
		err = d.c.h.CancelRun(ctx, r.GetRunId(), r.GetReason())
	case ioppb.CancelKind_TERMINATE_SESSION:
		err = d.c.h.TerminateSession(ctx, r.GetAdapter(), r.GetTarget(), r.GetSessionId())
	default:
		err = domain.Errorf(domain.CodeInvalidRequest, "unknown cancel kind %v", r.GetKind())
	}
	s.c.setLast(s, true) // the stream is finished right after, sent or not
	_ = s.SendControl(ctx, &ioppb.Frame{Body: &ioppb.Frame_CancelResponse{CancelResponse: &ioppb.CancelResponse{Error: errorToProto(err)}}})
	s.Finish()
}

func (d *nodeDispatch) command(s *Stream, r *ioppb.NodeCommandRequest) {
	ctx := s.Context()
	progress := func(p []byte) error {
		return s.Send(ctx, &ioppb.Frame{Body: &ioppb.Frame_NodeCommandResponse{NodeCommandResponse: &ioppb.NodeCommandResponse{ProgressJson: p}}})
	}
	result, err := d.c.h.RunCommand(ctx, r.GetCommand(), r.GetArgsJson(), progress)
	// Results larger than one data frame go out in chunks; the last carries final.
	for len(result) > maxDataChunk {
		if s.Send(ctx, &ioppb.Frame{Body: &ioppb.Frame_NodeCommandResponse{NodeCommandResponse: &ioppb.NodeCommandResponse{ResultJson: result[:maxDataChunk]}}}) != nil {
			return
		}
		result = result[maxDataChunk:]
	}
	if serr := s.SendLast(ctx, &ioppb.Frame{Body: &ioppb.Frame_NodeCommandResponse{NodeCommandResponse: &ioppb.NodeCommandResponse{
		Final: true, ResultJson: result, Error: errorToProto(err),
	}}}); serr != nil {
		// The edge must not be left waiting for a final reply that never comes.
		s.Reset("internal", "command result could not be sent: "+serr.Error())
		return
	}
	s.Finish()
}

func (d *nodeDispatch) tunnel(s *Stream, r *ioppb.ProviderTunnelRequest) {
	req := domain.TunnelRequest{
		Provider: r.GetProvider(), Method: r.GetMethod(), Path: r.GetPath(), Query: r.GetQuery(),
		Header: headersToDomain(r.GetHeaders()), Body: r.GetBody(),
	}
	var body io.Reader
	if r.GetBodyFollows() {
		body = &streamBody{s: s}
	}
	sink := &tunnelSink{s: s}
	d.c.h.OpenTunnel(s.Context(), req, body, sink)
	if sink.ended.Load() {
		s.Finish()
	} else {
		// No end or error frame: tell the edge rather than leave it waiting.
		s.Reset("internal", "tunnel ended without an end frame")
	}
}

// streamBody reads a tunnel request body that follows its request frame.
type streamBody struct {
	s    *Stream
	buf  []byte
	done bool
}

func (b *streamBody) Read(p []byte) (int, error) {
	for len(b.buf) == 0 {
		if b.done {
			return 0, io.EOF
		}
		f, d, err := b.s.recv(b.s.Context())
		if err != nil {
			// The stream's own context ends with the stream: say why it
			// ended (a reset's code), not "context canceled".
			if cause := context.Cause(b.s.Context()); cause != nil && errors.Is(err, context.Canceled) {
				err = cause
			}
			return 0, err
		}
		if f == nil {
			if d.kind == dataRequestBody {
				b.buf = d.payload // valid until the next recv, which comes once it is used up
			}
			continue
		}
		chunk := f.GetTunnelRequestBody()
		if chunk == nil {
			continue
		}
		b.buf, b.done = chunk.GetData(), chunk.GetEnd()
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	return n, nil
}

// runOutput sends one run's events to the edge under the stream's credit.
type runOutput struct {
	s        *Stream
	terminal atomic.Bool // a terminal event was sent
}

func (o *runOutput) Emit(ctx context.Context, ev domain.RunEvent) error {
	f := &ioppb.Frame{StreamId: o.s.id, Body: &ioppb.Frame_RunEvent{RunEvent: runEventToProto(ev)}}
	// An error message too long for one frame (an upstream error body) is
	// cut rather than lose the event: a terminal error that cannot be sent
	// leaves the caller with a bare stream reset.
	if e := f.GetRunEvent().GetError(); e != nil {
		if over := frameCost(f) - int(o.s.c.peerWindow)/4; over > 0 {
			e.Message = truncateUTF8(e.Message, len(e.Message)-over-len("…")) + "…"
		}
	}
	send := o.s.Send
	if ev.Type.Terminal() {
		send = o.s.SendLast
	}
	err := send(ctx, f)
	if err == nil && ev.Type.Terminal() {
		o.terminal.Store(true)
	}
	return err
}
func (o *runOutput) Done() <-chan struct{} { return o.s.Context().Done() }

// Close ends the stream. Without a terminal event first, the edge is told
// (a reset) instead of being left waiting for one.
func (o *runOutput) Close() {
	if o.terminal.Load() {
		o.s.Finish()
	} else {
		o.s.Reset("internal", "run ended without a terminal event")
	}
}

// tunnelSink sends provider response frames; bodies are split into chunks so
// no tunnel hogs the socket. Send copies the body before it returns (the
// port's contract), so the caller can reuse its read buffer.
type tunnelSink struct {
	s     *Stream
	ended atomic.Bool // an end or error frame was sent
}

func (t *tunnelSink) Send(f domain.TunnelFrame) error {
	ctx := t.s.Context()
	// An empty body goes out as one empty frame on a protobuf link (below)
	// and not at all on a data-frame link.
	if f.Kind == domain.TunnelBody && (len(f.Body) > 0 || t.s.c.dataFrames) {
		for len(f.Body) > 0 {
			n := min(len(f.Body), maxDataChunk)
			if err := t.s.SendBody(ctx, dataTunnelBody, f.Body[:n]); err != nil {
				return err
			}
			f.Body = f.Body[n:]
		}
		return nil
	}
	pf := t.s.c.tunnelFrame(f)
	if n := headerFrameElements(pf); n > headerElements {
		// The edge would count them and drop the link (elements.go).
		return &ports.FrameTooLargeError{Elements: n, MaxElements: headerElements}
	}
	frame := &ioppb.Frame{Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: pf}}
	send := t.s.Send
	if f.Kind == domain.TunnelEnd || f.Kind == domain.TunnelError {
		send = t.s.SendLast
	}
	err := send(ctx, frame)
	if err == nil && (f.Kind == domain.TunnelEnd || f.Kind == domain.TunnelError) {
		t.ended.Store(true)
	}
	if errors.Is(err, ErrStreamFrameTooBig) {
		// Nothing was sent and the stream is intact: the port's refusal
		// lets the node end the tunnel with an error that says why (large
		// headers cannot be cut into pieces as bodies are).
		return &ports.FrameTooLargeError{Size: frameCost(frame), Max: int(t.s.c.peerWindow) / 4}
	}
	return err
}

// truncateUTF8 returns at most n bytes of s, never cutting a UTF-8 sequence.
func truncateUTF8(s string, n int) string {
	if n >= len(s) {
		return s
	}
	if n <= 0 {
		return ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
