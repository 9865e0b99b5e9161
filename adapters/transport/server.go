package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"time"

	"iop/adapters/internal/connquota"
	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// EdgeHandler is what the edge's transport needs from the application.
type EdgeHandler interface {
	// Register authenticates a node and admits link to the live registry.
	// Its error becomes the register response's reason.
	Register(ctx context.Context, token string, info domain.NodeInfo, remote string, link ports.NodeLink) (domain.NodeConfig, error)
	// Disconnected is called exactly once for every link Register admitted.
	Disconnected(nodeID string, link ports.NodeLink, reason string)
	// Draining is called, at most once per link, when a registered node
	// says it is stopping (node_draining): it admits no new run. It runs
	// on the link's read loop and must not block.
	Draining(nodeID string, link ports.NodeLink)
	// HandshakeFailed reports a connection dropped before it registered
	// (garbage, oversized or missing register frame, timeout).
	HandshakeFailed(remote, reason string)
	// HandshakeFailedUnreported counts such a connection that a flood's
	// rate limit kept from being reported (failed TLS handshakes,
	// connections refused at accept): the next report says how many.
	HandshakeFailedUnreported()
}

// Server accepts node connections for the edge.
type Server struct {
	addr string
	cfg  Config
	h    EdgeHandler
	// tlsReports rate-limits reports of failed TLS handshakes (tls.go),
	// refusals those of connections refused at accept.
	tlsReports, refusals reportLimiter

	ln       net.Listener
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
	sem      chan struct{}
	adm      *admission
	done     chan struct{}
	stopOnce sync.Once
}

// NewServer returns a server that will listen on addr.
func NewServer(addr string, cfg Config, h EdgeHandler) *Server {
	cfg = cfg.withDefaults()
	return &Server{
		addr: addr, cfg: cfg, h: h, conns: map[net.Conn]struct{}{},
		// Handshakes after an edge restart arrive in a burst; bounding the
		// authentication work keeps it from starving established links. A
		// slot is taken only once the register frame has arrived, so idle
		// sockets never hold one, and the accept loop itself never waits.
		sem:  make(chan struct{}, 64*runtime.GOMAXPROCS(0)),
		adm:  newAdmission(cfg),
		done: make(chan struct{}),
	}
}

// Start binds the listener synchronously (a busy port fails here) and
// accepts in the background.
func (s *Server) Start() error {
	if err := s.cfg.Verify(); err != nil {
		return fmt.Errorf("transport config: %w", err)
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("transport listen %s: %w", s.addr, err)
	}
	s.ln = ln
	s.wg.Add(1)
	go s.acceptLoop()
	return nil
}

// Addr returns the bound address (useful with port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Stop closes the listener and every connection, and waits for them.
func (s *Server) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.done) })
	if s.ln != nil {
		_ = s.ln.Close()
	}
	s.mu.Lock()
	for nc := range s.conns {
		_ = nc.Close()
	}
	s.mu.Unlock()
	waited := make(chan struct{})
	go func() { s.wg.Wait(); close(waited) }()
	select {
	case <-waited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Resource exhaustion (EMFILE and friends) is waited out, not fatal.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.cfg.Logger.Warn("accept failed; retrying", "err", err, "delay", delay)
			select {
			case <-time.After(delay):
			case <-s.done:
				return
			}
			continue
		}
		delay = 0
		remote := nc.RemoteAddr().String()
		key := connquota.Key(remote)
		t, victim, why := s.adm.enter(key, nc)
		if why != "" {
			_ = nc.Close()
			s.refused(remote, why)
			continue
		}
		if victim != nil {
			// Its handshake goroutine sees it evicted and ends without a
			// report of its own or a failure charged to its address.
			_ = victim.Close()
			s.refused(victim.RemoteAddr().String(), "closed to make room for another connection: too many unregistered connections, and its address held the most")
		}
		if !s.track(nc) {
			s.adm.leave(t)
			_ = nc.Close()
			return
		}
		s.wg.Add(1)
		go s.serve(nc, remote, key, t)
	}
}

// refused reports a connection refused at accept, rate-limited like failed
// TLS handshakes: a throttled or over-cap address is closed at once, so its
// flood comes at accept speed and must not be reported one by one.
func (s *Server) refused(remote, why string) {
	n, ok := s.refusals.allow(time.Now())
	if !ok {
		s.h.HandshakeFailedUnreported()
		return
	}
	if n > 0 {
		why += fmt.Sprintf(" (%d more connections refused, not reported)", n)
	}
	s.h.HandshakeFailed(remote, why)
}

func (s *Server) track(nc net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.done:
		return false
	default:
	}
	s.conns[nc] = struct{}{}
	return true
}

func (s *Server) untrack(nc net.Conn) {
	s.mu.Lock()
	delete(s.conns, nc)
	s.mu.Unlock()
}

// serve runs the handshake of an accepted connection; a registered link is
// then read by readLink, on a goroutine that takes over this one's place in
// s.wg, and this one ends. The handshake (TLS, protobuf, the registry) grows
// this goroutine's stack; an idle read loop sitting on it would pin the
// grown stack, because the runtime halves a stack only while less than a
// quarter of it is in use and a read in progress uses more. A fresh stack
// grows only to what reading needs (4 KiB), which is what 10,000 idle links
// pay (docs/benchmarks.md, "Many idle nodes").
func (s *Server) serve(nc net.Conn, remote, key string, t *ticket) {
	link, nodeID, ok := s.handshake(nc, remote, key, t)
	s.adm.leave(t)
	if !ok {
		s.untrack(nc)
		s.wg.Done()
		return
	}
	go s.readLink(nc, link, nodeID)
}

// readLink reads a registered link until it ends, on its own goroutine (the
// writer is the link's other one), and reports the disconnection.
func (s *Server) readLink(nc net.Conn, link *edgeLink, nodeID string) {
	defer s.wg.Done()
	defer s.untrack(nc)
	link.conn.run()
	link.conn.Close(nil)
	s.h.Disconnected(nodeID, link, reasonOf(link.conn.Err()))
}

// handshake reads the register request and answers it. On success the
// returned link's connection is ready to start. key is the connection's
// prefix (failed registrations are charged to it), t its admission.
func (s *Server) handshake(nc net.Conn, remote, key string, t *ticket) (*edgeLink, string, bool) {
	deadline := time.Now().Add(s.cfg.HandshakeTimeout)
	_ = nc.SetDeadline(deadline)
	// A peer that has not authenticated may not make the edge allocate a
	// full-size frame: the register request is small.
	// TLS (tls.go) comes first, under the same deadline.
	nc, peer, ok := s.secure(nc, remote, key, t)
	if !ok {
		return nil, "", false
	}
	// The first bytes are kept until the register request has arrived:
	// what a browser sends (driven by any web page) is not charged.
	head := &headReader{rd: nc}
	dec := NewDecoder(head, min(s.cfg.MaxFrameSize, maxRegisterFrame))
	dec.elements = handshakeElements // the peer has shown no token yet
	f := new(ioppb.Frame)
	if _, err := dec.Decode(f); err != nil {
		if errors.Is(err, errTLSClient) && s.cfg.TLS == nil && !s.adm.evicted(t) {
			// A TLS client on a plaintext link: a node given --ca-pin or
			// --ca-file, or a browser that a web page sends to
			// https://127.0.0.1:7700 or to a turns: TURN server. It guesses
			// no token and costs a plaintext link no crypto, so it is not
			// charged to the address (a web page must not throttle the
			// nodes on its machine); its reports are rate-limited like
			// failed TLS handshakes. It is answered in plaintext, which its
			// TLS client reports as an answer that is not TLS, with the
			// hint to match the edge's mode, rather than as a reset
			// connection.
			reason := domain.CodeInvalidRequest + ": " + tlsOnPlaintextReason
			if b, err := AppendFrame(nil, &ioppb.Frame{Body: &ioppb.Frame_RegisterResponse{RegisterResponse: &ioppb.RegisterResponse{Reason: reason}}}, s.cfg.MaxFrameSize); err == nil {
				_, _ = nc.Write(b)
			}
			_ = nc.Close()
			s.handshakeFailed(remote, "handshake: "+tlsOnPlaintextReason+" (not charged to the address)")
			return nil, "", false
		}
		_ = nc.Close()
		if s.adm.evicted(t) {
			return nil, "", false // reported when it was closed to make room
		}
		err = classifyReadErr(err, s.cfg.HandshakeTimeout)
		switch {
		case errors.Is(err, ErrHeartbeatTimeout), errors.Is(err, io.EOF):
			// A slow or vanished peer.
		case browserStart(head.bytes()) != "":
			err = fmt.Errorf("%s, not a node; not charged to the address: %w", browserStart(head.bytes()), err)
		default:
			s.adm.failed(key) // garbage
		}
		s.h.HandshakeFailed(remote, "handshake: "+reasonOf(err))
		return nil, "", false
	}
	dec.r.rd = nc // the link reads without the recorder
	// From here the connection is no longer closed to make room (see
	// admission); if it already was, its frame came too late.
	if !s.adm.authenticating(t) {
		_ = nc.Close()
		return nil, "", false
	}
	req := f.GetRegisterRequest()
	if req == nil {
		_ = nc.Close()
		if browserStart(head.bytes()) == "" {
			s.adm.failed(key)
		}
		s.h.HandshakeFailed(remote, fmt.Sprintf("handshake: expected register_request, got %T", f.Body))
		return nil, "", false
	}
	if err := windowTooSmall(req.GetInitialWindow()); err != nil {
		// Nothing over a quarter of it could be sent to the node (a tunnel's
		// request body in 32 KiB pieces would stall after its first). 0
		// means the edge's own window (older nodes).
		reason := fmt.Sprintf("%s: %v", domain.CodeInvalidRequest, err)
		if s.adm.failed(key) {
			if b, err := AppendFrame(nil, &ioppb.Frame{Body: &ioppb.Frame_RegisterResponse{RegisterResponse: &ioppb.RegisterResponse{Reason: reason}}}, s.cfg.MaxFrameSize); err == nil {
				_, _ = nc.Write(b)
			}
		}
		_ = nc.Close()
		s.h.HandshakeFailed(remote, "handshake: "+reason)
		return nil, "", false
	}
	// The wait for a slot is part of the handshake and ends with its deadline.
	slot := time.NewTimer(time.Until(deadline))
	select {
	case s.sem <- struct{}{}:
		slot.Stop()
	case <-slot.C:
		_ = nc.Close()
		s.h.HandshakeFailed(remote, "handshake: timed out waiting for a handshake slot")
		return nil, "", false
	case <-s.done:
		slot.Stop()
		_ = nc.Close()
		return nil, "", false
	}
	defer func() { <-s.sem }()
	// newConn sets the element bound for the rest of the link.
	dec.max = s.cfg.MaxFrameSize
	link := &edgeLink{remote: remote, acks: map[uint64]chan error{}, h: s.h}
	link.conn = newConn(nc, dec, s.cfg, SideEdge, req.GetInitialWindow(), link)
	// Set before Register publishes the link: a caller may open a tunnel
	// on it at once, and its frames are encoded by these.
	link.conn.dataFrames = req.GetDataFrames() && !s.cfg.NoDataFrames
	link.conn.rawHeaders = req.GetRawHeaderValues() && !s.cfg.noRawHeaders
	info := reportedInfo(req, peer)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HandshakeTimeout)
	cfg, err := s.h.Register(ctx, req.GetToken(), info, remote, link)
	cancel()
	// The heartbeat settings are within [MinHeartbeat, MaxHeartbeat]
	// (Verify): whole milliseconds that fit in 32 bits.
	resp := &ioppb.RegisterResponse{
		Accepted:            err == nil,
		HeartbeatIntervalMs: uint32(s.cfg.HeartbeatInterval.Milliseconds()),
		HeartbeatTimeoutMs:  uint32(s.cfg.HeartbeatTimeout.Milliseconds()),
		InitialWindow:       s.cfg.StreamWindow,
		DataFrames:          link.conn.dataFrames,
		RawHeaderValues:     link.conn.rawHeaders,
	}
	if err != nil {
		resp.Reason = rejectReason(err)
		if errors.Is(err, domain.ErrUnknownToken) {
			if !s.adm.failed(key) {
				// Over its budget of wrong tokens: a guesser gets no answer.
				_ = nc.Close()
				return nil, "", false
			}
		}
	} else {
		resp.Config = configToProto(cfg)
		link.setRegistered(cfg.NodeID, cfg.Version)
	}
	buf, werr := AppendFrame(nil, &ioppb.Frame{Body: &ioppb.Frame_RegisterResponse{RegisterResponse: resp}}, s.cfg.MaxFrameSize)
	if err == nil && errors.Is(werr, ErrFrameTooLarge) {
		// The node's config does not fit in a frame: say so, as a
		// refusal the node logs and retries on, rather than close the
		// connection unanswered (the node blamed its TLS trust for that).
		reason := fmt.Sprintf("%s: the node's config (%v) does not fit in one link frame: %s",
			domain.CodeConfigError, werr, configTooLargeHint)
		refusal := &ioppb.RegisterResponse{Reason: reason}
		if b, e := AppendFrame(nil, &ioppb.Frame{Body: &ioppb.Frame_RegisterResponse{RegisterResponse: refusal}}, s.cfg.MaxFrameSize); e == nil {
			_, _ = nc.Write(b)
		}
		link.conn.shutdown(errors.New(reason))
		s.h.Disconnected(cfg.NodeID, link, reason)
		return nil, "", false
	}
	if werr == nil {
		_, werr = nc.Write(buf)
	}
	if err != nil {
		_ = nc.Close()
		return nil, "", false
	}
	if werr != nil {
		link.conn.shutdown(fmt.Errorf("write register response: %w", werr))
		s.h.Disconnected(cfg.NodeID, link, reasonOf(link.conn.Err()))
		return nil, "", false
	}
	_ = nc.SetDeadline(time.Time{})
	return link, cfg.NodeID, true
}

// maxRegisterFrame bounds the first frame of a connection.
const maxRegisterFrame = 64 << 10

// rejectReason puts the error's code first ("unknown_token: detail"), so the
// node can tell a fatal refusal from one worth retrying.
func rejectReason(err error) string {
	code, msg := domain.CodeOf(err), domain.MessageOf(err)
	if msg == "" || msg == code {
		return code
	}
	return code + ": " + msg
}

func reasonOf(err error) string {
	if err == nil {
		return "closed"
	}
	return err.Error()
}

// Bounds of what a node says about itself at registration, which the edge
// logs at every registration and lists in /v1/nodes: only the handshake
// frame's 64 KiB bounded them, so a node reconnecting in a loop wrote tens
// of KiB of log each time.
const (
	maxInfoField    = 256 // version, hostname, OS, architecture, one adapter type
	maxAdapterTypes = 64
)

// reportedInfo is the NodeInfo of req, its fields cut to the bounds above.
func reportedInfo(req *ioppb.RegisterRequest, peer domain.PeerIdentity) domain.NodeInfo {
	clip := func(s string) string { return domain.ClipMessage(s, maxInfoField) }
	types := req.GetAdapterTypes()
	if len(types) > maxAdapterTypes {
		types = types[:maxAdapterTypes]
	}
	clipped := make([]string, 0, len(types))
	for _, t := range types {
		clipped = append(clipped, clip(t))
	}
	if len(clipped) == 0 {
		clipped = nil // "did not say", as before
	}
	return domain.NodeInfo{Version: clip(req.GetNodeVersion()), Hostname: clip(req.GetHostname()), OS: clip(req.GetOs()),
		Arch: clip(req.GetArch()), Peer: peer, AdapterTypes: clipped}
}
