package transport

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// ---- heartbeats --------------------------------------------------------------

func TestServerDropsSilentNode(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	cfg := tinyHeartbeat()
	srv := startServer(t, "", cfg, edge)
	raw := dialRaw(t, srv.Addr().String())
	registeredAt := time.Now() // the server's clock starts after this
	raw.register(ctx, testToken, 1<<20)
	link := recv(t, ctx, edge.registered, "registration").Link

	// A run is in flight when the node goes silent.
	rs, err := link.StartRun(ctx, runReq("r"))
	mustf(t, err, "StartRun")
	defer rs.Close()

	d := recv(t, ctx, edge.disconnected, "Disconnected")
	if d.Link != link || d.NodeID != "node-a" || !strings.Contains(d.Reason, "heartbeat") {
		t.Errorf("Disconnected %+v", d)
	}
	if time.Since(registeredAt) < cfg.HeartbeatTimeout {
		t.Error("dropped before the heartbeat timeout")
	}
	if _, err := rs.Recv(ctx); !errors.Is(err, domain.ErrNodeDisconnected) {
		t.Errorf("run on a silent node: %v", err)
	}
	if _, err := link.StartRun(ctx, runReq("r2")); !errors.Is(err, domain.ErrNodeDisconnected) {
		t.Errorf("StartRun on a dropped link: %v", err)
	}
}

func TestClientDetectsSilentEdgeAndReconnects(t *testing.T) {
	ctx := testCtx(t)
	redge := listenRawEdge(t)
	node := newFakeNode()
	registered := make(chan string, 8)
	// The node's own settings are slow; the edge's (adopted) are tiny.
	cc := ClientConfig{Addr: redge.ln.Addr().String(), Token: testToken, Transport: testConfig(),
		OnRegistered: func(id string) { registered <- id }}
	cc.Transport.HeartbeatInterval = 10 * time.Second
	cc.Transport.HeartbeatTimeout = 20 * time.Second
	cli := startClient(t, cc, node)
	resp := &ioppb.RegisterResponse{Accepted: true, Config: configToProto(testNodeConfig()), HeartbeatIntervalMs: 50, HeartbeatTimeoutMs: 200, InitialWindow: 1 << 18}

	first, _ := redge.accept(ctx, resp)
	recv(t, ctx, registered, "first registration")
	// The raw edge now says nothing. The node must give up on it and dial again.
	second, _ := redge.accept(ctx, resp)
	stop := keepAlive(second)
	defer stop()
	recv(t, ctx, registered, "second registration")
	if st := cli.TransportStatus(); st.Reconnects < 1 {
		t.Errorf("status %+v", st)
	}
	// The node closed the first connection.
	for {
		if _, err := first.read(ctx); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Error("the node kept the silent connection open")
			}
			break
		}
	}
	// On the live link the node sends heartbeats at the adopted interval
	// and answers ours with an echo.
	sawHeartbeat := false
	reply := second.readUntil(ctx, "heartbeat reply", func(f *ioppb.Frame) bool {
		hb := f.GetHeartbeat()
		if hb != nil && !hb.GetReply() && hb.GetSentUnixNano() != 0 {
			sawHeartbeat = true
		}
		return hb.GetReply() && hb.GetEchoUnixNano() == 12345
	})
	if reply == nil {
		t.Fatal("no reply")
	}
	for !sawHeartbeat {
		f := second.readUntil(ctx, "node heartbeat", func(f *ioppb.Frame) bool { return f.GetHeartbeat() != nil })
		sawHeartbeat = !f.GetHeartbeat().GetReply()
	}
}

// keepAlive writes a heartbeat (sent time 12345) to a raw peer every 20 ms
// until stopped, so a node with tiny timeouts keeps the link.
func keepAlive(p *rawPeer) (stop func()) {
	b, _ := AppendFrame(nil, &ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{SentUnixNano: 12345}}}, DefaultMaxFrameSize)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			if p.writeBytes(b) != nil {
				return
			}
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() { close(quit); <-done }
}

func TestHeartbeatRTTAndCounters(t *testing.T) {
	cfg := tinyHeartbeat()
	cfg.HeartbeatTimeout = 2 * time.Second // liveness is not under test here
	p := newPair(t, pairOptions{server: cfg}, nil)
	eventually(t, p.ctx, "an RTT sample on both ends", func() bool {
		return p.cli.TransportStatus().LastRTTNanos > 0 && p.link.Stats().RTT > 0
	})
	st := p.cli.TransportStatus()
	if !st.Connected || st.FramesIn == 0 || st.FramesOut == 0 || st.BytesIn == 0 || st.BytesOut == 0 {
		t.Errorf("status %+v", st)
	}
	es := p.link.Stats()
	if es.FramesIn == 0 || es.FramesOut == 0 || es.BytesIn == 0 || es.BytesOut == 0 || es.Since.IsZero() {
		t.Errorf("edge stats %+v", es)
	}
	// The node adopted the edge's interval: frames keep flowing while idle.
	in := p.link.Stats().FramesIn
	eventually(t, p.ctx, "idle heartbeats", func() bool { return p.link.Stats().FramesIn >= in+3 })
}

// Idle links with tiny heartbeats stay up for many intervals.
func TestIdleLinkStaysUp(t *testing.T) {
	cfg := tinyHeartbeat()
	p := newPair(t, pairOptions{server: cfg}, nil)
	in := p.link.Stats().FramesIn
	// Ten intervals' worth of heartbeats from the node.
	eventually(t, p.ctx, "ten heartbeats", func() bool { return p.link.Stats().FramesIn >= in+10 })
	if p.edge.disconnectsOf(p.link) != 0 || p.link.conn.Err() != nil {
		t.Fatalf("idle link dropped: %v", p.link.conn.Err())
	}
	rs, err := p.link.StartRun(p.ctx, runReq("r"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	for {
		if _, err := rs.Recv(p.ctx); err != nil {
			if err != io.EOF {
				t.Fatal(err)
			}
			break
		}
	}
}

// ---- link loss ---------------------------------------------------------------

// openEverything starts a run, a tunnel and a command that all hold until
// the link ends, and returns a function that checks each ends with
// node_disconnected.
func openEverything(t *testing.T, p *pair) func() {
	t.Helper()
	rs, err := p.link.StartRun(p.ctx, runReq("held"))
	mustf(t, err, "StartRun")
	ev, err := rs.Recv(p.ctx)
	mustf(t, err, "run start")
	if ev.Type != domain.EventStart {
		t.Fatalf("event %+v", ev)
	}
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa"}, endlessReader{})
	mustf(t, err, "OpenTunnel")
	_, err = ts.Recv(p.ctx)
	mustf(t, err, "tunnel status")
	cs, err := p.link.Command(p.ctx, "hold", nil)
	mustf(t, err, "Command")
	_, err = cs.Recv(p.ctx)
	mustf(t, err, "command progress")
	return func() {
		t.Helper()
		if _, err := rs.Recv(p.ctx); !errors.Is(err, domain.ErrNodeDisconnected) {
			t.Errorf("run Recv: %v", err)
		}
		if _, err := rs.Recv(p.ctx); err != io.EOF {
			t.Errorf("run Recv after the error: %v", err)
		}
		for {
			_, err := ts.Recv(p.ctx)
			if err != nil {
				if !errors.Is(err, domain.ErrNodeDisconnected) {
					t.Errorf("tunnel Recv: %v", err)
				}
				break
			}
		}
		if _, err := cs.Recv(p.ctx); !errors.Is(err, domain.ErrNodeDisconnected) {
			t.Errorf("command Recv: %v", err)
		}
		rs.Close()
		ts.Close()
		cs.Close()
		if err := p.link.CancelRun(p.ctx, "held", ""); !errors.Is(err, domain.ErrNodeDisconnected) {
			t.Errorf("CancelRun on a lost link: %v", err)
		}
		if err := p.link.PushConfig(p.ctx, testNodeConfig()); !errors.Is(err, domain.ErrNodeDisconnected) {
			t.Errorf("PushConfig on a lost link: %v", err)
		}
		if _, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{}, nil); !errors.Is(err, domain.ErrNodeDisconnected) {
			t.Errorf("OpenTunnel on a lost link: %v", err)
		}
	}
}

func holdingNode(n *fakeNode) {
	n.runScript = func(req domain.RunRequest) []domain.RunEvent {
		return []domain.RunEvent{{RunID: req.RunID, Seq: 1, Type: domain.EventStart}}
	}
	n.holdRuns = true
	n.onTunnel = func(ctx context.Context, _ domain.TunnelRequest, body io.Reader, out ports.TunnelSink) {
		_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200})
		for {
			if err := out.Send(domain.TunnelFrame{Kind: domain.TunnelBody, Body: []byte("tick")}); err != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Millisecond):
			}
		}
	}
	n.onCommand = func(ctx context.Context, _ string, _ []byte, prog func([]byte) error) ([]byte, error) {
		_ = prog([]byte(`{}`))
		<-ctx.Done()
		return nil, ctx.Err()
	}
}

func TestLinkLossEdgeStops(t *testing.T) {
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) { holdingNode(n) })
	check := openEverything(t, p)
	stopServer(t, p.srv)
	check()
	d := recv(t, p.ctx, p.edge.disconnected, "Disconnected")
	if d.Link != p.link || d.NodeID != "node-a" {
		t.Errorf("Disconnected %+v", d)
	}
	if n := p.edge.disconnectsOf(p.link); n != 1 {
		t.Errorf("Disconnected called %d times", n)
	}
	// The node's handlers all saw the link go.
	if o := recv(t, p.ctx, p.node.runEnded, "node run end"); o.Outcome != "abandoned" {
		t.Errorf("node run outcome %+v", o)
	}
}

func TestLinkLossNodeStops(t *testing.T) {
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) { holdingNode(n) })
	check := openEverything(t, p)
	mustf(t, p.cli.stop(t), "client Run")
	check()
	d := recv(t, p.ctx, p.edge.disconnected, "Disconnected")
	// "peer closed the connection: EOF", or a reset when the node closed
	// with unread bytes (the tunnel upload) in its socket.
	if d.Link != p.link || d.Reason == "" {
		t.Errorf("Disconnected %+v", d)
	}
	stopServer(t, p.srv)
	if n := p.edge.disconnectsOf(p.link); n != 1 {
		t.Errorf("Disconnected called %d times", n)
	}
}

func TestLinkCloseByEdge(t *testing.T) {
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) { holdingNode(n) })
	check := openEverything(t, p)
	p.link.Close("replaced by a newer connection")
	check()
	d := recv(t, p.ctx, p.edge.disconnected, "Disconnected")
	if d.Reason != "replaced by a newer connection" {
		t.Errorf("reason %q", d.Reason)
	}
	// The node reconnects on its own.
	reg := recv(t, p.ctx, p.edge.registered, "re-registration")
	if reg.Link == p.reg.Link {
		t.Error("same link after reconnect")
	}
}

// A node that stops answering mid-stream (no FIN, no RST) is detected by
// heartbeat, and its streams end with node_disconnected.
func TestSilentDropMidRun(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", tinyHeartbeat(), edge)
	raw := dialRaw(t, srv.Addr().String())
	raw.register(ctx, testToken, 1<<20)
	link := recv(t, ctx, edge.registered, "registration").Link
	rs, err := link.StartRun(ctx, runReq("r"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	id := raw.readUntil(ctx, "run request", func(f *ioppb.Frame) bool { return f.GetRunRequest() != nil }).StreamId
	raw.write(&ioppb.Frame{StreamId: id, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "r", Seq: 1, Type: ioppb.EventType_EVENT_TYPE_START}}})
	ev, err := rs.Recv(ctx)
	mustf(t, err, "start")
	if ev.Type != domain.EventStart {
		t.Fatalf("event %+v", ev)
	}
	// Silence.
	if _, err := rs.Recv(ctx); !errors.Is(err, domain.ErrNodeDisconnected) || !strings.Contains(err.Error(), "heartbeat") {
		t.Errorf("Recv after silence: %v", err)
	}
	recv(t, ctx, edge.disconnected, "Disconnected")
}

// ---- reconnect ---------------------------------------------------------------

func TestReconnectAfterEdgeRestart(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", testConfig(), edge)
	addr := srv.Addr().String()
	node := newFakeNode()
	cli := startClient(t, ClientConfig{Addr: addr, Token: testToken, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}, node)
	first := recv(t, ctx, edge.registered, "first registration")

	stopServer(t, srv)
	recv(t, ctx, edge.disconnected, "Disconnected")
	eventually(t, ctx, "client to notice", func() bool { return !cli.TransportStatus().Connected })

	srv2 := startServer(t, addr, testConfig(), edge)
	second := recv(t, ctx, edge.registered, "registration with the restarted edge")
	if second.Link == first.Link {
		t.Fatal("same link")
	}
	if n := edge.registerCount(); n != 2 {
		t.Errorf("%d Register calls", n)
	}
	// The new link works.
	rs, err := second.Link.StartRun(ctx, runReq("after-restart"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	for {
		_, err := rs.Recv(ctx)
		if err == io.EOF {
			break
		}
		mustf(t, err, "Recv")
	}
	if st := cli.TransportStatus(); !st.Connected || st.Reconnects < 1 {
		t.Errorf("status %+v", st)
	}
	_ = srv2
}

func TestClientStopsWhileEdgeDown(t *testing.T) {
	ctx := testCtx(t)
	ln := listenRawEdge(t)
	addr := ln.ln.Addr().String()
	_ = ln.ln.Close() // nothing listens: every dial fails
	cli := startClient(t, ClientConfig{Addr: addr, Token: testToken, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, newFakeNode())
	eventually(t, ctx, "a few failed dials", func() bool { return cli.TransportStatus().Reconnects >= 3 })
	if err := cli.stop(t); err != nil {
		t.Errorf("Run: %v", err)
	}
	if cli.TransportStatus().Connected {
		t.Error("connected to nothing")
	}
}

// ceiling computes min(hi, lo·2ⁿ) without overflow.
func ceiling(n int, lo, hi time.Duration) time.Duration {
	c := lo
	for i := 0; i < n && c < hi; i++ {
		c *= 2
	}
	return min(c, hi)
}

func TestBackoffFullJitter(t *testing.T) {
	lo, hi := 500*time.Millisecond, 30*time.Second
	for n := 0; n < 70; n++ {
		c := ceiling(n, lo, hi)
		var maxSeen time.Duration
		for i := 0; i < 2000; i++ {
			d := backoff(n, lo, hi)
			if d < 0 || d > c {
				t.Fatalf("backoff(%d) = %v outside [0, %v]", n, d, c)
			}
			maxSeen = max(maxSeen, d)
		}
		// Full jitter spreads over the whole range (not a fixed delay).
		if maxSeen < c/2 {
			t.Errorf("backoff(%d): max of 2000 samples %v, ceiling %v", n, maxSeen, c)
		}
	}
	// Defaults: the first retry waits at most a second.
	c := NewClient(ClientConfig{}, newFakeNode())
	if b := c.cfg.MinBackoff; b <= 0 || b > time.Second {
		t.Errorf("default MinBackoff %v", b)
	}
	for i := 0; i < 1000; i++ {
		if d := backoff(0, c.cfg.MinBackoff, c.cfg.MaxBackoff); d > time.Second {
			t.Fatalf("first retry after %v", d)
		}
	}
}

// Large minimum backoffs must not overflow into negative ceilings.
func TestBackoffNoOverflow(t *testing.T) {
	for _, lo := range []time.Duration{20 * time.Second, time.Hour, 1 << 62} {
		hi := max(lo, 2*time.Hour)
		for n := 0; n < 100; n++ {
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("backoff(%d, %v, %v) panicked: %v", n, lo, hi, r)
					}
				}()
				if d := backoff(n, lo, hi); d < 0 || d > ceiling(n, lo, hi) {
					t.Fatalf("backoff(%d, %v, %v) = %v", n, lo, hi, d)
				}
			}()
		}
	}
}

// The RTT is timed on the monotonic clock from the probe this side sent: a
// reply whose echo is not that probe's stamp is no sample. Computed as
// "wall clock now minus the echo", a wall-clock step between a probe and
// its reply (NTP setting the clock an hour forward) made the RTT an hour,
// as this echo an hour old by the wall clock did.
func TestHeartbeatRTTIsTimedFromTheProbeSent(t *testing.T) {
	cfg := tinyHeartbeat()
	cfg.HeartbeatTimeout = 2 * time.Second // liveness is not under test here
	p := newPair(t, pairOptions{server: cfg}, nil)
	eventually(t, p.ctx, "an RTT sample", func() bool { return p.link.Stats().RTT > 0 })
	c := p.link.conn
	c.onHeartbeat(&ioppb.Heartbeat{Reply: true, EchoUnixNano: time.Now().Add(-time.Hour).UnixNano()})
	if rtt := p.link.Stats().RTT; rtt >= time.Hour {
		t.Fatalf("RTT %v from an echo of no probe sent", rtt)
	}
}
