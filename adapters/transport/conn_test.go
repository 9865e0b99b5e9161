package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"iop/domain"
	ioppb "iop/proto/iop"
)

// Frames for streams that have ended, empty frames and frames without a
// body are dropped and counted; the connection goes on. (What a node may
// not do at all is in TestEdgeDisconnectsMisbehavingNode.)
func TestEdgeDropsBadFramesFromNode(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", testConfig(), edge)
	raw := dialRaw(t, srv.Addr().String())
	raw.register(ctx, testToken, 1<<20)
	link := recv(t, ctx, edge.registered, "registration").Link.(*edgeLink)

	// A completed run leaves a closed stream id behind.
	rs, err := link.StartRun(ctx, runReq("done"))
	mustf(t, err, "StartRun")
	closedID := raw.readUntil(ctx, "run request", func(f *ioppb.Frame) bool { return f.GetRunRequest() != nil }).StreamId
	raw.write(&ioppb.Frame{StreamId: closedID, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "done", Seq: 1, Type: ioppb.EventType_EVENT_TYPE_COMPLETE}}})
	ev, err := rs.Recv(ctx)
	mustf(t, err, "Recv")
	if ev.Type != domain.EventComplete {
		t.Fatalf("event %+v", ev)
	}
	eventually(t, ctx, "stream forgotten", func() bool { return link.Stats().Streams == 0 })

	before := link.Stats().Dropped
	delta := &ioppb.RunEvent{RunId: "x", Type: ioppb.EventType_EVENT_TYPE_DELTA, Text: "x"}
	bad := []*ioppb.Frame{
		{StreamId: closedID, Body: &ioppb.Frame_RunEvent{RunEvent: delta}},                                     // closed stream
		{StreamId: closedID, Body: &ioppb.Frame_WindowUpdate{WindowUpdate: &ioppb.WindowUpdate{Increment: 1}}}, // closed stream
		{StreamId: closedID, Body: &ioppb.Frame_StreamReset{StreamReset: &ioppb.StreamReset{Code: "cancel"}}},  // closed stream
		{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{}}},                                          // an empty heartbeat is fine, not dropped
	}
	for _, f := range bad {
		raw.write(f)
	}
	mustf(t, raw.writeBytes([]byte{0}), "empty frame")
	mustf(t, raw.writeBytes(encodeRaw([]byte{0x08, 0x09})), "frame without body")
	// A valid node-opened stream: the edge refuses it with a reset...
	raw.write(&ioppb.Frame{StreamId: 4, Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{RunId: "n"}}})
	reset := raw.readUntil(ctx, "reset of node-opened stream", func(f *ioppb.Frame) bool { return f.GetStreamReset() != nil })
	if reset.StreamId != 4 || reset.GetStreamReset().GetCode() != "unsupported" {
		t.Errorf("reset %v", reset)
	}

	const want = 3 + 2
	eventually(t, ctx, "bad frames counted", func() bool { return link.Stats().Dropped >= before+want })
	// Make sure every frame was processed, then check the exact count.
	rs2, err := link.StartRun(ctx, runReq("after"))
	mustf(t, err, "StartRun after bad frames")
	defer rs2.Close()
	id := raw.readUntil(ctx, "run request", func(f *ioppb.Frame) bool { return f.GetRunRequest() != nil }).StreamId
	raw.write(&ioppb.Frame{StreamId: id, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "after", Seq: 1, Type: ioppb.EventType_EVENT_TYPE_COMPLETE}}})
	ev, err = rs2.Recv(ctx)
	mustf(t, err, "Recv after bad frames")
	if ev.Type != domain.EventComplete {
		t.Errorf("event %+v", ev)
	}
	if got := link.Stats().Dropped - before; got != want {
		t.Errorf("dropped %d frames, want %d", got, want)
	}
	if link.conn.Err() != nil || edge.disconnectsOf(link) != 0 {
		t.Error("bad frames closed the connection")
	}
}

// The node side applies the same rules to frames from the edge.
func TestNodeDropsBadFramesFromEdge(t *testing.T) {
	ctx := testCtx(t)
	redge := listenRawEdge(t)
	node := newFakeNode()
	cli := startClient(t, ClientConfig{Addr: redge.ln.Addr().String(), Token: testToken, Transport: testConfig()}, node)
	cfg := testNodeConfig()
	raw, req := redge.accept(ctx, &ioppb.RegisterResponse{Accepted: true, Config: configToProto(cfg), HeartbeatIntervalMs: 100, HeartbeatTimeoutMs: 5000, InitialWindow: 1 << 18})
	if req.GetToken() != testToken || req.GetInitialWindow() != DefaultConfig().StreamWindow {
		t.Errorf("register request %v", req)
	}
	recv(t, ctx, node.applied, "ApplyConfig")
	eventually(t, ctx, "client connection", func() bool { return cli.currentConn() != nil })
	conn := cli.currentConn()

	before := conn.Stats().Dropped
	open := func(id uint64, run string) {
		raw.write(&ioppb.Frame{StreamId: id, Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{RunId: run, Adapter: "sh"}}})
	}
	open(2, "even")  // node parity: dropped
	open(5, "five")  // valid
	open(5, "again") // reused: dropped
	open(3, "lower") // below the last id: dropped
	open(0, "zero")  // stream 0 is the connection: dropped
	raw.write(&ioppb.Frame{StreamId: 41, Body: &ioppb.Frame_WindowUpdate{WindowUpdate: &ioppb.WindowUpdate{Increment: 10}}})
	raw.write(&ioppb.Frame{Body: &ioppb.Frame_RegisterResponse{RegisterResponse: &ioppb.RegisterResponse{Accepted: true}}})
	open(7, "seven") // valid

	started := []string{recv(t, ctx, node.runStarted, "first run").RunID, recv(t, ctx, node.runStarted, "second run").RunID}
	sort.Strings(started)
	if started[0] != "five" || started[1] != "seven" {
		t.Errorf("runs started: %v", started)
	}
	// The runs complete on the raw edge.
	for done := 0; done < 2; {
		f := raw.readUntil(ctx, "run events", func(f *ioppb.Frame) bool { return f.GetRunEvent() != nil })
		if f.GetRunEvent().GetType() == ioppb.EventType_EVENT_TYPE_COMPLETE {
			done++
		}
	}
	if got := conn.Stats().Dropped - before; got != 6 {
		t.Errorf("node dropped %d frames, want 6", got)
	}
	select {
	case r := <-node.runStarted:
		t.Errorf("unexpected run %q", r.RunID)
	default:
	}
	if conn.Err() != nil {
		t.Errorf("connection ended: %v", conn.Err())
	}
}

// Stream ids are never reused on a connection, and each side keeps its parity.
func TestOpenIDsParityAndMonotonic(t *testing.T) {
	for _, side := range []Side{SideEdge, SideNode} {
		a, _ := pipeConns(t)
		c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), testConfig(), side, 0, nopHandler{})
		var last uint64
		for i := 0; i < 10; i++ {
			s, err := c.Open(testCtx(t), &ioppb.Frame{Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{}}})
			mustf(t, err, "Open")
			<-c.ctrl
			if s.ID() <= last || c.peerParity(s.ID()) || (side == SideEdge) != (s.ID()%2 == 1) {
				t.Fatalf("side %v: id %d after %d", side, s.ID(), last)
			}
			last = s.ID()
			s.Finish()
		}
		if c.Stats().Streams != 0 {
			t.Errorf("finished streams still registered")
		}
		c.shutdown(nil)
		if _, err := c.Open(testCtx(t), &ioppb.Frame{}); err == nil {
			t.Error("Open on a closed connection succeeded")
		}
	}
}

func TestOpenRespectsMaxStreams(t *testing.T) {
	a, _ := pipeConns(t)
	cfg := testConfig()
	cfg.MaxStreams = 3
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideEdge, 0, nopHandler{})
	defer c.shutdown(nil)
	var streams []*Stream
	for i := 0; i < 3; i++ {
		s, err := c.Open(testCtx(t), &ioppb.Frame{})
		mustf(t, err, "Open %d", i)
		streams = append(streams, s)
	}
	if _, err := c.Open(testCtx(t), &ioppb.Frame{}); err != ErrTooManyStreams {
		t.Fatalf("fourth Open: %v", err)
	}
	streams[0].Close()
	if _, err := c.Open(testCtx(t), &ioppb.Frame{}); err != nil {
		t.Fatalf("Open after a Close: %v", err)
	}
	// The peer's opens beyond the limit are refused with a reset.
	c.openFromPeer(&ioppb.Frame{StreamId: 2, Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{}}})
	var reset *ioppb.Frame
	for len(c.ctrl) > 0 {
		if f := <-c.ctrl; f.GetStreamReset().GetCode() == "too_many_streams" {
			reset = f
		}
	}
	if reset == nil || reset.StreamId != 2 {
		t.Errorf("no too_many_streams reset: %v", reset)
	}
}

// Reset and Close are idempotent and tell the peer once.
func TestResetIdempotent(t *testing.T) {
	a, _ := pipeConns(t)
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), testConfig(), SideEdge, 0, nopHandler{})
	defer c.shutdown(nil)
	s, err := c.Open(testCtx(t), &ioppb.Frame{})
	mustf(t, err, "Open")
	<-c.ctrl
	s.Close()
	s.Close()
	s.Reset("x", "y")
	if n := len(c.ctrl); n != 1 {
		t.Errorf("%d control frames queued, want one reset", n)
	}
	if err := s.Send(testCtx(t), &ioppb.Frame{}); err == nil {
		t.Error("Send on a closed stream succeeded")
	}
	if _, err := s.Recv(testCtx(t)); err == nil {
		t.Error("Recv on a closed stream succeeded")
	}
	select {
	case <-s.Context().Done():
	default:
		t.Error("stream context not cancelled")
	}
}

func pipeConns(t *testing.T) (net.Conn, net.Conn) {
	a, b := net.Pipe()
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return a, b
}

// A writer that keeps making progress on a slow socket must not trip its
// write deadline: the deadline catches a stuck peer, not a long busy spell.
func TestBusyWriterOnSlowPeerKeepsLink(t *testing.T) {
	ctx := testCtx(t)
	a, b := pipeConns(t)
	cfg := testConfig()
	cfg.HeartbeatTimeout = 10 * time.Second
	// Each write takes a few ms here; the whole transfer takes far longer
	// than the write timeout.
	cfg.WriteTimeout = 250 * time.Millisecond
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideNode, 1<<30, nopHandler{})
	c.start()
	defer c.Close(nil)

	// The peer reads steadily but slowly.
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 16<<10)
		for {
			if _, err := b.Read(buf); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() { _ = b.Close(); <-readerDone }()

	// Four streams keep the writer busy, so it always has a frame ready.
	const senders, frames = 4, 128 // 8 MiB at ≤ 16 KiB per ms
	payload := make([]byte, 16<<10)
	errs := make(chan error, senders)
	for i := 0; i < senders; i++ {
		s := addStream(c, uint64(2+2*i))
		go func() {
			for j := 0; j < frames; j++ {
				f := &ioppb.Frame{Body: &ioppb.Frame_TunnelRequestBody{TunnelRequestBody: &ioppb.TunnelRequestBody{Data: payload}}}
				if err := s.Send(ctx, f); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for i := 0; i < senders; i++ {
		if err := recv(t, ctx, errs, "sender"); err != nil {
			t.Fatalf("send on a slow but live peer: %v (conn: %v)", err, c.Err())
		}
	}
	if err := c.Err(); err != nil {
		t.Fatalf("connection ended: %v", err)
	}
}

// openRecorder hands every stream the peer opens to a channel.
type openRecorder chan *Stream

func (r openRecorder) HandleOpen(s *Stream, _ *ioppb.Frame) { r <- s }
func (openRecorder) HandleControl(*ioppb.Frame)             {}

// An open frame the read loop decoded just as another goroutine ended the
// connection (a write error, Close) must not leave a stream that never
// ends: its handler would wait on it forever (a tunnel reading its request
// body, a run waiting for Done).
func TestOpenFromPeerAfterShutdownEndsStream(t *testing.T) {
	a, _ := pipeConns(t)
	opened := make(openRecorder, 1)
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), testConfig(), SideNode, 0, opened)
	c.shutdown(errors.New("write: broken pipe"))
	// What the read loop does with the frame it had already decoded.
	c.dispatch(&ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_ProviderTunnelRequest{ProviderTunnelRequest: &ioppb.ProviderTunnelRequest{Provider: "p", BodyFollows: true}}}, 0)
	select {
	case s := <-opened:
		if s.Context().Err() == nil {
			t.Fatal("stream opened on a closed connection is still live")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := s.Recv(ctx); !errors.Is(err, ErrConnClosed) {
			t.Errorf("Recv on it: %v, want ErrConnClosed", err)
		}
	default: // dropped: also fine
	}
	if n := c.Stats().Streams; n != 0 {
		t.Errorf("%d streams registered on a closed connection", n)
	}
}

func TestOpenRefusesFrameLargerThanMax(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := newConn(a, nil, Config{MaxFrameSize: 64 << 10}, SideEdge, 0, nil)
	big := &ioppb.Frame{Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{RunId: "r", Adapter: "a", Input: make([]byte, 64<<10)}}}
	if _, err := c.Open(context.Background(), big); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("Open = %v, want ErrFrameTooLarge", err)
	}
	if len(c.streams) != 0 || len(c.ctrl) != 0 {
		t.Fatal("a refused open must leave no stream and queue nothing")
	}
}

// Why a read loop ended is what node.disconnected reports: a clean name for
// each way, not a raw socket error.
func TestClassifyReadErr(t *testing.T) {
	for _, tc := range []struct {
		in   error
		want error
		text string
	}{
		{os.ErrDeadlineExceeded, ErrHeartbeatTimeout, "silent"},
		{io.EOF, io.EOF, "peer closed"},
		{&net.OpError{Op: "read", Err: net.ErrClosed}, ErrConnClosed, "this side is shutting down"},
	} {
		got := classifyReadErr(tc.in, time.Second)
		if !errors.Is(got, tc.want) || !strings.Contains(got.Error(), tc.text) {
			t.Errorf("classifyReadErr(%v) = %v; want %v containing %q", tc.in, got, tc.want, tc.text)
		}
	}
}

// addStream registers a stream with id on c as if it had been opened, for
// tests that send on a link without its handshake.
func addStream(c *Conn, id uint64) *Stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := newStream(c, id)
	c.streams[s.id] = s
	return s
}
