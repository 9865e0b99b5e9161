package transport

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// Server.Stop and Client.Run must leave nothing running. Started as
// BenchmarkIdleNodes's child (idleChildEnv set), the binary runs that
// instead of the tests.
func TestMain(m *testing.M) {
	if kind := os.Getenv(idleChildEnv); kind != "" {
		os.Exit(idleChild(kind))
	}
	goleak.VerifyTestMain(m)
}

// testTimeout bounds every test; no wait in this package is unbounded.
const testTimeout = 30 * time.Second

// testCtx returns a context that ends before the test binary's own deadline.
func testCtx(tb testing.TB) context.Context {
	tb.Helper()
	d := testTimeout
	if dl, ok := tb.(interface{ Deadline() (time.Time, bool) }); ok {
		if end, ok := dl.Deadline(); ok {
			if left := time.Until(end) - 2*time.Second; left < d {
				d = max(left, time.Second)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// recv waits for one value from ch or fails the test when ctx ends.
func recv[T any](tb testing.TB, ctx context.Context, ch <-chan T, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		tb.Fatalf("timed out waiting for %s", what)
	}
	panic("unreachable")
}

// eventually polls cond until it holds or fails the test when ctx ends.
func eventually(tb testing.TB, ctx context.Context, what string, cond func() bool) {
	tb.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			tb.Fatalf("timed out waiting for %s", what)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// quietLogger keeps expected warnings out of test output (IOP_TEST_LOG=1 shows them).
func quietLogger() *slog.Logger {
	if os.Getenv("IOP_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// testConfig is a link config with heartbeats frequent enough to be
// exercised but a wait generous enough that a loaded -race run never trips it.
func testConfig() Config {
	return Config{
		HeartbeatInterval: 100 * time.Millisecond,
		HeartbeatTimeout:  5 * time.Second,
		HandshakeTimeout:  5 * time.Second,
		Logger:            quietLogger(),
	}
}

// tinyHeartbeat is for tests where liveness is the point.
func tinyHeartbeat() Config {
	c := testConfig()
	c.HeartbeatInterval = 50 * time.Millisecond
	c.HeartbeatTimeout = 200 * time.Millisecond
	return c
}

// ---- fake edge ---------------------------------------------------------------

type registerCall struct {
	Token    string
	Info     domain.NodeInfo
	Remote   string
	Link     ports.NodeLink
	Accepted bool
}

type disconnectCall struct {
	NodeID string
	Link   ports.NodeLink
	Reason string
}

type handshakeFailure struct{ Remote, Reason string }

// fakeEdge is the application side of the edge: a token → config map that
// records every call.
type fakeEdge struct {
	mu          sync.Mutex
	configs     map[string]domain.NodeConfig
	reject      func(token string, attempt int) error
	calls       []registerCall
	disconnects []disconnectCall
	failures    []handshakeFailure

	attempted    chan registerCall // every Register call
	registered   chan registerCall // accepted ones
	disconnected chan disconnectCall
	failed       chan handshakeFailure
	draining     chan disconnectCall // Reason unset
	// onRegister, if set, sees every link Register accepts before Register
	// returns, as the edge's register use case (which publishes it).
	onRegister func(link ports.NodeLink)
	unreported atomic.Int64 // HandshakeFailedUnreported calls
}

func newFakeEdge() *fakeEdge {
	return &fakeEdge{
		configs:      map[string]domain.NodeConfig{},
		attempted:    make(chan registerCall, 1024),
		registered:   make(chan registerCall, 1024),
		disconnected: make(chan disconnectCall, 1024),
		failed:       make(chan handshakeFailure, 1024),
		draining:     make(chan disconnectCall, 1024),
	}
}

func (e *fakeEdge) addNode(token string, cfg domain.NodeConfig) {
	e.mu.Lock()
	e.configs[token] = cfg
	e.mu.Unlock()
}

func (e *fakeEdge) Register(ctx context.Context, token string, info domain.NodeInfo, remote string, link ports.NodeLink) (domain.NodeConfig, error) {
	e.mu.Lock()
	call := registerCall{Token: token, Info: info, Remote: remote, Link: link}
	attempt := len(e.calls) + 1
	var err error
	if e.reject != nil {
		err = e.reject(token, attempt)
	}
	cfg, ok := e.configs[token]
	if err == nil && !ok {
		err = &domain.Error{Code: domain.CodeUnknownToken}
	}
	call.Accepted = err == nil
	e.calls = append(e.calls, call)
	e.mu.Unlock()
	e.attempted <- call
	if err != nil {
		return domain.NodeConfig{}, err
	}
	if e.onRegister != nil {
		e.onRegister(link)
	}
	e.registered <- call
	return cfg, nil
}

func (e *fakeEdge) Disconnected(nodeID string, link ports.NodeLink, reason string) {
	d := disconnectCall{NodeID: nodeID, Link: link, Reason: reason}
	e.mu.Lock()
	e.disconnects = append(e.disconnects, d)
	e.mu.Unlock()
	e.disconnected <- d
}

func (e *fakeEdge) Draining(nodeID string, link ports.NodeLink) {
	e.draining <- disconnectCall{NodeID: nodeID, Link: link}
}

func (e *fakeEdge) HandshakeFailed(remote, reason string) {
	f := handshakeFailure{Remote: remote, Reason: reason}
	e.mu.Lock()
	e.failures = append(e.failures, f)
	e.mu.Unlock()
	e.failed <- f
}

func (e *fakeEdge) HandshakeFailedUnreported() { e.unreported.Add(1) }

func (e *fakeEdge) registerCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.calls)
}

func (e *fakeEdge) disconnectsOf(link ports.NodeLink) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, d := range e.disconnects {
		if d.Link == link {
			n++
		}
	}
	return n
}

// ---- fake node ---------------------------------------------------------------

type runOutcome struct {
	RunID   string
	Outcome string // "completed", "abandoned", "emit_error"
	Err     error
}

type terminateCall struct{ Adapter, Target, SessionID string }

// fakeNode is the application side of the node. Each behaviour can be
// scripted per test; the defaults emit a short run and refuse the rest.
type fakeNode struct {
	mu      sync.Mutex
	configs []domain.NodeConfig

	applyErr    func(cfg domain.NodeConfig) error
	runScript   func(req domain.RunRequest) []domain.RunEvent
	holdRuns    bool // after the script, wait for out.Done()
	onRun       func(req domain.RunRequest, out ports.RunOutput)
	onCommand   func(ctx context.Context, name string, args []byte, progress func([]byte) error) ([]byte, error)
	onTunnel    func(ctx context.Context, req domain.TunnelRequest, body io.Reader, out ports.TunnelSink)
	cancelErr   func(runID string) error
	reasons     []string // each cancel's reason, in order (under mu)
	terminateFn func(c terminateCall) error

	applied    chan domain.NodeConfig
	runStarted chan domain.RunRequest
	runEnded   chan runOutcome
	cancels    chan string
	terminates chan terminateCall
}

func newFakeNode() *fakeNode {
	return &fakeNode{
		applied:    make(chan domain.NodeConfig, 1024),
		runStarted: make(chan domain.RunRequest, 1024),
		runEnded:   make(chan runOutcome, 1024),
		cancels:    make(chan string, 1024),
		terminates: make(chan terminateCall, 1024),
	}
}

func (n *fakeNode) ApplyConfig(ctx context.Context, cfg domain.NodeConfig) error {
	n.mu.Lock()
	n.configs = append(n.configs, cfg)
	fn := n.applyErr
	n.mu.Unlock()
	n.applied <- cfg
	if fn != nil {
		return fn(cfg)
	}
	return nil
}

// defaultScript is start, one delta, complete.
func defaultScript(req domain.RunRequest) []domain.RunEvent {
	return []domain.RunEvent{
		{RunID: req.RunID, Seq: 1, Type: domain.EventStart},
		{RunID: req.RunID, Seq: 2, Type: domain.EventDelta, Text: "hello"},
		{RunID: req.RunID, Seq: 3, Type: domain.EventComplete, Usage: &domain.Usage{TotalTokens: 3}},
	}
}

func (n *fakeNode) ExecuteRun(req domain.RunRequest, out ports.RunOutput) {
	n.runStarted <- req
	if n.onRun != nil {
		n.onRun(req, out)
		return
	}
	script := defaultScript
	if n.runScript != nil {
		script = n.runScript
	}
	for _, ev := range script(req) {
		select {
		case <-out.Done():
			n.runEnded <- runOutcome{RunID: req.RunID, Outcome: "abandoned"}
			return
		default:
		}
		if err := out.Emit(context.Background(), ev); err != nil {
			n.runEnded <- runOutcome{RunID: req.RunID, Outcome: "emit_error", Err: err}
			return
		}
		if ev.Type.Terminal() {
			out.Close()
			n.runEnded <- runOutcome{RunID: req.RunID, Outcome: "completed"}
			return
		}
	}
	if n.holdRuns {
		<-out.Done()
		n.runEnded <- runOutcome{RunID: req.RunID, Outcome: "abandoned"}
		return
	}
	out.Close()
	n.runEnded <- runOutcome{RunID: req.RunID, Outcome: "completed"}
}

func (n *fakeNode) CancelRun(ctx context.Context, runID, reason string) error {
	n.mu.Lock()
	n.reasons = append(n.reasons, reason)
	n.mu.Unlock()
	n.cancels <- runID
	if n.cancelErr != nil {
		return n.cancelErr(runID)
	}
	return nil
}

func (n *fakeNode) TerminateSession(ctx context.Context, adapter, target, sessionID string) error {
	c := terminateCall{adapter, target, sessionID}
	n.terminates <- c
	if n.terminateFn != nil {
		return n.terminateFn(c)
	}
	return nil
}

func (n *fakeNode) RunCommand(ctx context.Context, name string, args []byte, progress func([]byte) error) ([]byte, error) {
	if n.onCommand != nil {
		return n.onCommand(ctx, name, args, progress)
	}
	return nil, domain.Errorf(domain.CodeUnknownCommand, "no command %q", name)
}

func (n *fakeNode) OpenTunnel(ctx context.Context, req domain.TunnelRequest, body io.Reader, out ports.TunnelSink) {
	if n.onTunnel != nil {
		n.onTunnel(ctx, req, body, out)
		return
	}
	_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderNotFound}})
}

// ---- server and client -------------------------------------------------------

// startServer listens on 127.0.0.1:0 (or addr) and stops at cleanup.
func startServer(tb testing.TB, addr string, cfg Config, h EdgeHandler) *Server {
	tb.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	srv := NewServer(addr, cfg, h)
	if err := srv.Start(); err != nil {
		tb.Fatalf("start server: %v", err)
	}
	tb.Cleanup(func() { stopServer(tb, srv) })
	return srv
}

func stopServer(tb testing.TB, srv *Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Stop(ctx); err != nil {
		tb.Errorf("server stop: %v", err)
	}
}

// runningClient is a Client whose Run goroutine the test owns.
type runningClient struct {
	*Client
	done   chan struct{}
	err    error
	cancel context.CancelFunc
	once   sync.Once
}

// stop cancels Run and waits for it to return; it reports Run's error.
func (r *runningClient) stop(tb testing.TB) error {
	r.once.Do(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			tb.Errorf("client.Run did not return after cancel")
		}
	})
	return r.err
}

func startClient(tb testing.TB, cc ClientConfig, h NodeHandler) *runningClient {
	tb.Helper()
	if cc.Transport.Logger == nil {
		cc.Transport.Logger = quietLogger()
	}
	if cc.MinBackoff == 0 {
		cc.MinBackoff = 10 * time.Millisecond
	}
	if cc.MaxBackoff == 0 {
		cc.MaxBackoff = 100 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningClient{Client: NewClient(cc, h), done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(r.done)
		r.err = r.Run(ctx)
	}()
	tb.Cleanup(func() { _ = r.stop(tb) })
	return r
}

// currentConn is the client's live connection (internal tests only).
func (r *runningClient) currentConn() *Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conn
}

const testToken = "tok-1"

func testNodeConfig() domain.NodeConfig {
	return domain.NodeConfig{
		NodeID:  "node-a",
		Version: 7,
		Adapters: []domain.AdapterConfig{{
			Name: "sh", Type: domain.AdapterExec, MaxConcurrency: 2,
			Targets: map[string]domain.ExecTarget{"echo": {Command: []string{"echo", "hi"}, Timeout: 3 * time.Second, Dir: "/tmp", Env: map[string]string{"A": "1"}}},
		}},
		Providers: []domain.ProviderConfig{{Name: "oa", Type: domain.ProviderOpenAI, BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}},
	}
}

// pair is a Server and a registered Client on loopback.
type pair struct {
	ctx  context.Context
	edge *fakeEdge
	node *fakeNode
	srv  *Server
	cli  *runningClient
	reg  registerCall
	link *edgeLink
}

type pairOptions struct {
	server Config
	client ClientConfig
}

// newPair starts a server and a client and waits for the registration.
// setup, if given, adjusts the fakes before anything connects.
func newPair(t testing.TB, opt pairOptions, setup func(e *fakeEdge, n *fakeNode)) *pair {
	t.Helper()
	ctx := testCtx(t)
	p := &pair{ctx: ctx, edge: newFakeEdge(), node: newFakeNode()}
	p.edge.addNode(testToken, testNodeConfig())
	if setup != nil {
		setup(p.edge, p.node)
	}
	if opt.server.Logger == nil {
		opt.server = mergeConfig(testConfig(), opt.server)
	}
	p.srv = startServer(t, "", opt.server, p.edge)
	cc := opt.client
	cc.Addr = p.srv.Addr().String()
	if cc.Token == "" {
		cc.Token = testToken
	}
	if cc.Transport.Logger == nil {
		cc.Transport = mergeConfig(testConfig(), cc.Transport)
	}
	p.cli = startClient(t, cc, p.node)
	p.reg = recv(t, ctx, p.edge.registered, "registration")
	p.link = p.reg.Link.(*edgeLink)
	// The client's connection is live once OnRegistered would fire; wait
	// for it so internal tests can inspect it.
	eventually(t, ctx, "client connection", func() bool { return p.cli.currentConn() != nil })
	return p
}

// mergeConfig overlays the non-zero fields of o on base.
func mergeConfig(base, o Config) Config {
	if o.HeartbeatInterval > 0 {
		base.HeartbeatInterval = o.HeartbeatInterval
	}
	if o.HeartbeatTimeout > 0 {
		base.HeartbeatTimeout = o.HeartbeatTimeout
	}
	if o.MaxFrameSize > 0 {
		base.MaxFrameSize = o.MaxFrameSize
	}
	if o.StreamWindow > 0 {
		base.StreamWindow = o.StreamWindow
	}
	if o.MaxStreams > 0 {
		base.MaxStreams = o.MaxStreams
	}
	if o.ControlQueue > 0 {
		base.ControlQueue = o.ControlQueue
	}
	if o.WriteTimeout > 0 {
		base.WriteTimeout = o.WriteTimeout
	}
	if o.HandshakeTimeout > 0 {
		base.HandshakeTimeout = o.HandshakeTimeout
	}
	if o.commandResultLimit > 0 {
		base.commandResultLimit = o.commandResultLimit
	}
	base.NoDataFrames = base.NoDataFrames || o.NoDataFrames
	base.noRawHeaders = base.noRawHeaders || o.noRawHeaders
	return base
}

// wireMode is one way the two ends can agree to carry tunnel bodies.
type wireMode struct {
	name       string
	opt        pairOptions
	dataFrames bool // what the link must have negotiated
}

// wireModes: current ends on both sides, and each side as an older version
// that neither sends nor asks for data frames.
var wireModes = []wireMode{
	{"data frames", pairOptions{}, true},
	{"older edge", pairOptions{server: Config{NoDataFrames: true}}, false},
	{"older node", pairOptions{client: ClientConfig{Transport: Config{NoDataFrames: true}}}, false},
}

// newPairIn is newPair for a wire mode; it checks both ends negotiated it.
func newPairIn(t *testing.T, m wireMode, setup func(e *fakeEdge, n *fakeNode)) *pair {
	t.Helper()
	p := newPair(t, m.opt, setup)
	if got, node := p.link.conn.dataFrames, p.cli.currentConn().dataFrames; got != m.dataFrames || node != m.dataFrames {
		t.Fatalf("%s: data frames negotiated edge=%v node=%v, want %v", m.name, got, node, m.dataFrames)
	}
	return p
}

// ---- raw peers ---------------------------------------------------------------

// rawPeer speaks the wire by hand, to play a misbehaving or silent peer.
type rawPeer struct {
	tb  testing.TB
	nc  net.Conn
	dec *Decoder
}

func newRawPeer(tb testing.TB, nc net.Conn) *rawPeer {
	tb.Cleanup(func() { _ = nc.Close() })
	return &rawPeer{tb: tb, nc: nc, dec: NewDecoder(nc, DefaultMaxFrameSize)}
}

func dialRaw(tb testing.TB, addr string) *rawPeer {
	tb.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	return newRawPeer(tb, nc)
}

func (p *rawPeer) writeBytes(b []byte) error {
	_ = p.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := p.nc.Write(b)
	return err
}

func (p *rawPeer) write(f *ioppb.Frame) {
	p.tb.Helper()
	b, err := AppendFrame(nil, f, DefaultMaxFrameSize)
	if err != nil {
		p.tb.Fatalf("encode: %v", err)
	}
	if err := p.writeBytes(b); err != nil {
		p.tb.Fatalf("raw write: %v", err)
	}
}

// read returns the next frame, heartbeats included.
func (p *rawPeer) read(ctx context.Context) (*ioppb.Frame, error) {
	dl, _ := ctx.Deadline()
	_ = p.nc.SetReadDeadline(dl)
	f := new(ioppb.Frame)
	_, err := p.dec.Decode(f)
	return f, err
}

// readUntil skips frames until match accepts one.
func (p *rawPeer) readUntil(ctx context.Context, what string, match func(*ioppb.Frame) bool) *ioppb.Frame {
	p.tb.Helper()
	for {
		f, err := p.read(ctx)
		if err != nil {
			p.tb.Fatalf("raw peer waiting for %s: %v", what, err)
		}
		if match(f) {
			return f
		}
	}
}

// register plays a node's side of the handshake.
func (p *rawPeer) register(ctx context.Context, token string, window uint32) *ioppb.RegisterResponse {
	p.tb.Helper()
	p.write(&ioppb.Frame{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: &ioppb.RegisterRequest{
		Token: token, NodeVersion: "raw", Hostname: "raw-host", InitialWindow: window,
	}}})
	f := p.readUntil(ctx, "register response", func(f *ioppb.Frame) bool { return f.GetRegisterResponse() != nil })
	return f.GetRegisterResponse()
}

// rawEdge is a listener that plays the edge by hand.
type rawEdge struct {
	tb    testing.TB
	ln    net.Listener
	conns chan *rawPeer
}

func listenRawEdge(tb testing.TB) *rawEdge {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	e := &rawEdge{tb: tb, ln: ln, conns: make(chan *rawPeer, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			e.conns <- &rawPeer{tb: tb, nc: nc, dec: NewDecoder(nc, DefaultMaxFrameSize)}
		}
	}()
	tb.Cleanup(func() {
		_ = ln.Close()
		<-done
		close(e.conns)
		for p := range e.conns {
			_ = p.nc.Close()
		}
	})
	return e
}

// accept waits for the next connection and answers its register request.
func (e *rawEdge) accept(ctx context.Context, resp *ioppb.RegisterResponse) (*rawPeer, *ioppb.RegisterRequest) {
	e.tb.Helper()
	p := recv(e.tb, ctx, e.conns, "a node connection")
	e.tb.Cleanup(func() { _ = p.nc.Close() })
	f := p.readUntil(ctx, "register request", func(f *ioppb.Frame) bool { return f.GetRegisterRequest() != nil })
	p.write(&ioppb.Frame{Body: &ioppb.Frame_RegisterResponse{RegisterResponse: resp}})
	return p, f.GetRegisterRequest()
}

// ---- small helpers -----------------------------------------------------------

func runReq(id string) domain.RunRequest {
	return domain.RunRequest{RunID: id, Adapter: "sh", Target: "echo", Input: []byte("in-" + id)}
}

func mustf(tb testing.TB, err error, format string, args ...any) {
	tb.Helper()
	if err != nil {
		tb.Fatalf("%s: %v", fmt.Sprintf(format, args...), err)
	}
}
