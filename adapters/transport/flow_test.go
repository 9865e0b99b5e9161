package transport

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// queuedOf reads a stream's receive-queue size.
func queuedOf(s *Stream) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued
}

func creditOf(s *Stream) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.credit
}

// One tunnel whose reader never reads must stall only itself: another
// tunnel on the same link moves 8 MiB while the first stays within its
// window, its node-side Send blocked rather than failed.
func TestStalledTunnelDoesNotBlockOthers(t *testing.T) {
	const big = 8 << 20
	bigBody := randomBytes(big)
	var stalledSent atomic.Int64
	stalledDone := make(chan error, 1)
	cfg := testConfig()
	cfg.HeartbeatInterval = 50 * time.Millisecond
	cfg.HeartbeatTimeout = 2 * time.Second
	p := newPair(t, pairOptions{server: cfg, client: ClientConfig{Transport: cfg}}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(ctx context.Context, req domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
			switch req.Path {
			case "/stall":
				chunk := make([]byte, maxDataChunk)
				for {
					if err := out.Send(domain.TunnelFrame{Kind: domain.TunnelBody, Body: chunk}); err != nil {
						stalledDone <- err
						return
					}
					stalledSent.Add(int64(len(chunk)))
				}
			case "/big":
				_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200})
				for off := 0; off < len(bigBody); off += 256 << 10 {
					if out.Send(domain.TunnelFrame{Kind: domain.TunnelBody, Body: bigBody[off : off+256<<10]}) != nil {
						return
					}
				}
				_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelEnd})
			}
		}
	})
	window := int(DefaultConfig().StreamWindow)
	chunkCost := frameCost(&ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Body{Body: make([]byte, maxDataChunk)}}}})

	t1, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Path: "/stall"}, nil)
	mustf(t, err, "open stalled tunnel")
	defer t1.Close()
	edgeS1 := t1.(*tunnelStream).s
	var nodeS1 *Stream
	eventually(t, p.ctx, "node-side stream", func() bool {
		nodeS1 = p.cli.currentConn().stream(edgeS1.ID())
		return nodeS1 != nil
	})
	// The node writes until its credit runs out: the edge holds a full window.
	eventually(t, p.ctx, "stalled tunnel to use up its credit", func() bool {
		return creditOf(nodeS1) < chunkCost && queuedOf(edgeS1) > window-chunkCost
	})

	// Watch stream 1's queue while the second tunnel runs.
	stopWatch := make(chan struct{})
	maxQueued := make(chan int, 1)
	go func() {
		m := 0
		for {
			m = max(m, queuedOf(edgeS1))
			select {
			case <-stopWatch:
				maxQueued <- m
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()

	t2, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Path: "/big"}, nil)
	mustf(t, err, "open second tunnel")
	defer t2.Close()
	_, body := drainTunnel(t, p.ctx, t2)
	close(stopWatch)
	if len(body) != big || sha256.Sum256(body) != sha256.Sum256(bigBody) {
		t.Fatalf("second tunnel got %d bytes, want %d identical", len(body), big)
	}
	if m := recv(t, p.ctx, maxQueued, "watcher"); m > window {
		t.Errorf("stalled stream queued %d bytes, window is %d", m, window)
	}
	if q := queuedOf(edgeS1); q > window {
		t.Errorf("stalled stream queued %d bytes, window is %d", q, window)
	}
	select {
	case err := <-stalledDone:
		t.Fatalf("stalled tunnel's Send failed instead of blocking: %v", err)
	default:
	}
	if sent := stalledSent.Load(); sent > int64(window) {
		t.Errorf("node sent %d bytes on a stream with a %d window and no reader", sent, window)
	}
	if p.edge.disconnectsOf(p.link) != 0 {
		t.Error("link dropped during the transfer")
	}

	// The stalled tunnel still delivers what it holds once read, then Close
	// unblocks the node's Send with an error.
	f, err := t1.Recv(p.ctx)
	mustf(t, err, "stalled tunnel Recv")
	if f.Kind != domain.TunnelBody || len(f.Body) != maxDataChunk {
		t.Errorf("stalled tunnel frame %+v", f.Kind)
	}
	t1.Close()
	if err := recv(t, p.ctx, stalledDone, "stalled Send to fail after Close"); err == nil {
		t.Error("nil error")
	}
}

// On the node, a frame from the edge that overruns the window resets that
// stream (flow_control) and nothing else. This drives deliver directly. (An
// edge disconnects a node that does this: TestPeerViolatingCreditIsDisconnected.)
func TestDeliverBeyondWindowResetsStream(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cfg := testConfig()
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideNode, 0, nopHandler{})
	s, err := c.Open(testCtx(t), &ioppb.Frame{Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{RunId: "r"}}})
	mustf(t, err, "Open")
	other, err := c.Open(testCtx(t), &ioppb.Frame{Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{RunId: "r2"}}})
	mustf(t, err, "Open")
	<-c.ctrl
	<-c.ctrl

	ev := &ioppb.Frame{StreamId: s.ID(), Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{Text: strings.Repeat("e", 30<<10)}}}
	cost := frameCost(ev)
	n := int(cfg.withDefaults().StreamWindow) / cost
	for i := 0; i < n; i++ {
		s.deliver(ev, 0)
	}
	if q := queuedOf(s); q != n*cost {
		t.Fatalf("queued %d, want %d", q, n*cost)
	}
	s.deliver(ev, 0) // one too many
	select {
	case f := <-c.ctrl:
		if f.StreamId != s.ID() || f.GetStreamReset().GetCode() != "flow_control" {
			t.Fatalf("control frame %v", f)
		}
	default:
		t.Fatal("no reset queued")
	}
	if c.stream(s.ID()) != nil {
		t.Error("overrun stream still registered")
	}
	if c.stream(other.ID()) == nil || c.Err() != nil {
		t.Error("overrun affected the rest of the connection")
	}
	// What was accepted is still readable; then the stream reports the fault.
	for i := 0; i < n; i++ {
		if _, err := s.Recv(testCtx(t)); err != nil {
			t.Fatalf("queued frame %d: %v", i, err)
		}
	}
	if _, err := s.Recv(testCtx(t)); !errors.Is(err, ErrStreamClosed) {
		t.Errorf("after the queue: %v", err)
	}
	before := c.dropped.Load()
	s.deliver(ev, 0)
	if c.dropped.Load() != before+1 {
		t.Error("frame for an ended stream not counted as dropped")
	}
	c.shutdown(nil)
}

type nopHandler struct{}

func (nopHandler) HandleOpen(s *Stream, _ *ioppb.Frame) { s.Reset("unsupported", "") }
func (nopHandler) HandleControl(*ioppb.Frame)           {}

// A raw node that ignores credit is disconnected with the reason; a run
// of another node on the same edge is untouched.
func TestPeerViolatingCreditIsDisconnected(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", testConfig(), edge)
	raw := dialRaw(t, srv.Addr().String())
	resp := raw.register(ctx, testToken, 1<<20)
	link := recv(t, ctx, edge.registered, "registration").Link.(*edgeLink)

	rs, err := link.StartRun(ctx, runReq("r1"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	id := raw.readUntil(ctx, "run request", func(f *ioppb.Frame) bool { return f.GetRunRequest() != nil }).StreamId

	// Push well past the granted window without waiting for updates.
	text := strings.Repeat("v", 40<<10)
	for sent := 0; sent <= int(resp.GetInitialWindow())+80<<10; sent += len(text) {
		if raw.writeBytes(mustFrame(t, &ioppb.Frame{StreamId: id, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "r1", Type: ioppb.EventType_EVENT_TYPE_DELTA, Text: text}}})) != nil {
			break
		}
	}
	d := recv(t, ctx, edge.disconnected, "disconnect")
	if d.Link != link || !strings.Contains(d.Reason, "protocol violation") || !strings.Contains(d.Reason, "overran its credit") {
		t.Fatalf("disconnect %+v", d)
	}
}

func mustFrame(tb testing.TB, f *ioppb.Frame) []byte {
	tb.Helper()
	b, err := AppendFrame(nil, f, DefaultMaxFrameSize)
	mustf(tb, err, "encode")
	return b
}

// The receiver returns credit as it consumes: a sender that respects the
// window can stream many windows' worth without a reset.
func TestWindowUpdatesRefillCredit(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	cfg := testConfig()
	srv := startServer(t, "", cfg, edge)
	raw := dialRaw(t, srv.Addr().String())
	resp := raw.register(ctx, testToken, 1<<20)
	link := recv(t, ctx, edge.registered, "registration").Link.(*edgeLink)
	rs, err := link.StartRun(ctx, runReq("r"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	id := raw.readUntil(ctx, "run request", func(f *ioppb.Frame) bool { return f.GetRunRequest() != nil }).StreamId

	// The edge reads in the background; the raw node sends only within credit.
	const events = 200
	got := make(chan error, 1)
	go func() {
		for i := 0; i < events; i++ {
			if _, err := rs.Recv(ctx); err != nil {
				got <- err
				return
			}
		}
		got <- nil
	}()
	credit := int(resp.GetInitialWindow())
	text := strings.Repeat("w", 16<<10)
	updates := 0
	for i := 0; i < events; i++ {
		f := &ioppb.Frame{StreamId: id, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "r", Seq: uint64(i + 1), Type: ioppb.EventType_EVENT_TYPE_DELTA, Text: text}}}
		for credit < frameCost(f) {
			wu := raw.readUntil(ctx, "window update", func(f *ioppb.Frame) bool { return f.GetWindowUpdate() != nil || f.GetStreamReset() != nil })
			if wu.GetStreamReset() != nil {
				t.Fatalf("stream reset while within credit: %v", wu)
			}
			credit += int(wu.GetWindowUpdate().GetIncrement())
			updates++
		}
		credit -= frameCost(f)
		raw.write(f)
	}
	mustf(t, recv(t, ctx, got, "edge to read every event"), "edge Recv")
	if updates == 0 {
		t.Error("no window updates for 3 MiB of events")
	}
}

// Credit returned by Recv is never lost: if the control queue is full
// when a window update is due, Recv waits for room instead of dropping it
// (a dropped update would stall the stream for good).
func TestWindowUpdateNotLostWhenControlQueueFull(t *testing.T) {
	ctx := testCtx(t)
	a, _ := pipeConns(t)
	cfg := testConfig()
	cfg.ControlQueue = 1
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideNode, 0, nopHandler{})
	defer c.shutdown(nil)
	c.mu.Lock()
	s := newStream(c, 1)
	c.streams[1] = s
	c.mu.Unlock()

	ev := &ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{Text: strings.Repeat("e", 30<<10)}}}
	n := int(c.cfg.StreamWindow) / frameCost(ev)
	for i := 0; i < n; i++ {
		s.deliver(ev, 0)
	}
	c.ctrl <- &ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{}}} // the queue is full

	// A writer that catches up later.
	granted := make(chan uint32, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		time.Sleep(20 * time.Millisecond)
		for {
			select {
			case f := <-c.ctrl:
				if wu := f.GetWindowUpdate(); wu != nil {
					granted <- wu.GetIncrement()
					return
				}
			case <-stop:
				return
			}
		}
	}()
	for i := 0; i < n; i++ {
		_, err := s.Recv(ctx)
		mustf(t, err, "Recv %d", i)
	}
	select {
	case got := <-granted:
		if int(got) < int(c.cfg.StreamWindow)/2 {
			t.Errorf("granted %d, want at least half the window", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("credit for %d consumed bytes was never granted back (dropped=%d)", n*frameCost(ev), c.dropped.Load())
	}
}

// Credit the receiver has not yet returned counts against the sender too:
// a peer that sends more than one window before any window_update has
// exceeded its credit even if the consumer has read part of it, and the
// stream is reset (docs/wire.md, flow control).
func TestDeliverCountsConsumedButUnreturnedCredit(t *testing.T) {
	a, _ := pipeConns(t)
	cfg := testConfig()
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideNode, 0, nopHandler{})
	defer c.shutdown(nil)
	s, err := c.Open(testCtx(t), &ioppb.Frame{Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{RunId: "r"}}})
	mustf(t, err, "Open")
	<-c.ctrl

	ev := &ioppb.Frame{StreamId: s.ID(), Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{Text: strings.Repeat("e", 30<<10)}}}
	cost := frameCost(ev)
	window := int(cfg.withDefaults().StreamWindow)
	n := window / cost
	for i := 0; i < n; i++ {
		s.deliver(ev, 0)
	}
	// The consumer reads one frame: less than half a window, so no credit
	// goes back to the peer.
	if _, err := s.Recv(testCtx(t)); err != nil {
		t.Fatalf("Recv: %v", err)
	}
	select {
	case f := <-c.ctrl:
		t.Fatalf("unexpected control frame %v", f)
	default:
	}
	// The peer has now sent (n+1)·cost > window bytes on one window of credit.
	s.deliver(ev, 0)
	select {
	case f := <-c.ctrl:
		if f.StreamId != s.ID() || f.GetStreamReset().GetCode() != "flow_control" {
			t.Fatalf("control frame %v", f)
		}
	default:
		t.Fatalf("peer sent %d bytes on a %d-byte window and was not reset", (n+1)*cost, window)
	}
}
