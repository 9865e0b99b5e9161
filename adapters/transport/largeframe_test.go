package transport

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"iop/domain"
	ioppb "iop/proto/iop"
)

// ---- large frames on a slow link --------------------------------------------

// slowReader reads at most chunk bytes per read, pausing every between
// reads: a node reading a link far slower than loopback.
type slowReader struct {
	r     io.Reader
	chunk int
	every time.Duration
}

func (s *slowReader) Read(p []byte) (int, error) {
	time.Sleep(s.every)
	if len(p) > s.chunk {
		p = p[:s.chunk]
	}
	return s.r.Read(p)
}

// A run request much larger than the link carries within the write timeout
// reaches a node that keeps reading (slowly) and heartbeating: the edge
// writes it in pieces, moving its write deadline as the node takes them,
// instead of dropping a healthy node (and every run on it) with a write
// timeout mid-frame.
func TestLargeFrameToSlowReadingNodeKeepsTheLink(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	cfg := testConfig()
	// And so the write timeout. Two seconds, not one: on a loaded CI
	// machine (-race, two cores) a one-second stall of the slow reader or
	// its heartbeats dropped the link, and the test with it.
	cfg.HeartbeatTimeout = 2 * time.Second
	cfg.MaxFrameSize = 32 << 20
	srv := startServer(t, "", cfg, edge)

	nc, err := net.DialTimeout("tcp", srv.Addr().String(), 5*time.Second)
	mustf(t, err, "dial")
	// A small receive buffer, read 16 KiB every 4 ms (about 4 MiB/s): the
	// 24 MiB frame takes about three times the write timeout to cross.
	_ = nc.(*net.TCPConn).SetReadBuffer(64 << 10)
	raw := newRawPeer(t, nc)
	raw.dec = NewDecoder(&slowReader{r: nc, chunk: 16 << 10, every: 4 * time.Millisecond}, cfg.MaxFrameSize)
	raw.register(ctx, testToken, 1<<20)
	link := recv(t, ctx, edge.registered, "registration").Link.(*edgeLink)
	stop := keepAlive(raw) // a heartbeat every 20 ms: the node is alive throughout
	defer stop()

	req := runReq("big")
	req.Input = bytes.Repeat([]byte("x"), 24<<20)
	started := time.Now()
	rs, err := link.StartRun(ctx, req)
	mustf(t, err, "StartRun")
	defer rs.Close()
	f := raw.readUntil(ctx, "the run request", func(f *ioppb.Frame) bool { return f.GetRunRequest() != nil })
	if got := len(f.GetRunRequest().GetInput()); got != len(req.Input) {
		t.Fatalf("run request input %d bytes, want %d", got, len(req.Input))
	}
	if took := time.Since(started); took <= cfg.HeartbeatTimeout {
		t.Logf("the frame crossed in %v, within the write timeout: the test proves less than it should", took)
	}
	if err := link.conn.Err(); err != nil {
		t.Fatalf("the edge dropped the node: %v", err)
	}
	// The link still works: the node answers the run.
	raw.write(&ioppb.Frame{StreamId: f.StreamId, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{
		RunId: "big", Seq: 1, Type: ioppb.EventType_EVENT_TYPE_COMPLETE}}})
	ev, err := rs.Recv(ctx)
	mustf(t, err, "Recv")
	if ev.Type != domain.EventComplete {
		t.Errorf("event %v", ev.Type)
	}
	if n := edge.disconnectsOf(link); n != 0 {
		t.Errorf("%d disconnects", n)
	}
}

// A node that stops reading is still caught by the write deadline while a
// large frame is being written to it: pieces that make no progress fail
// after the write timeout.
func TestLargeFrameToNodeThatStopsReadingFails(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	cfg := testConfig()
	cfg.HeartbeatTimeout = 4 * time.Second // the node heartbeats: only the write timeout can trip
	cfg.WriteTimeout = 500 * time.Millisecond
	cfg.MaxFrameSize = 32 << 20
	srv := startServer(t, "", cfg, edge)
	nc, err := net.DialTimeout("tcp", srv.Addr().String(), 5*time.Second)
	mustf(t, err, "dial")
	_ = nc.(*net.TCPConn).SetReadBuffer(64 << 10)
	raw := newRawPeer(t, nc)
	raw.register(ctx, testToken, 1<<20)
	link := recv(t, ctx, edge.registered, "registration").Link
	stop := keepAlive(raw)
	defer stop()

	req := runReq("big")
	req.Input = make([]byte, 24<<20) // more than the socket buffers hold
	rs, err := link.StartRun(ctx, req)
	mustf(t, err, "StartRun")
	defer rs.Close()
	d := recv(t, ctx, edge.disconnected, "the node dropped for not reading")
	if !strings.Contains(d.Reason, "timeout") {
		t.Errorf("disconnect reason %q, want a write timeout", d.Reason)
	}
}

// The receiving side likewise reads a large frame that arrives more slowly
// than the heartbeat timeout (no heartbeat can overtake it), as long as its
// bytes keep coming: the read deadline moves as they arrive.
func TestNodeReadsLargeFrameArrivingSlowly(t *testing.T) {
	ctx := testCtx(t)
	redge := listenRawEdge(t)
	node := newFakeNode()
	cc := ClientConfig{Addr: redge.ln.Addr().String(), Token: testToken, Transport: testConfig()}
	cc.Transport.MaxFrameSize = 32 << 20
	cli := startClient(t, cc, node)
	resp := &ioppb.RegisterResponse{Accepted: true, Config: configToProto(testNodeConfig()),
		HeartbeatIntervalMs: 100, HeartbeatTimeoutMs: 1000, InitialWindow: 1 << 18}
	raw, _ := redge.accept(ctx, resp)
	recv(t, ctx, node.applied, "ApplyConfig")
	eventually(t, ctx, "client connection", func() bool { return cli.currentConn() != nil })
	conn := cli.currentConn()
	stop := keepAlive(raw) // until the frame starts: the node's timeout is short
	req := runReqProto("big")
	req.Input = bytes.Repeat([]byte("y"), 8<<20)
	b, err := AppendFrame(nil, &ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_RunRequest{RunRequest: req}}, 32<<20)
	mustf(t, err, "encode")
	// 16 KiB every 4 ms: the 8 MiB frame takes about twice the node's
	// heartbeat timeout to arrive, and nothing else can arrive meanwhile.
	stop()
	started := time.Now()
	for len(b) > 0 {
		n := min(len(b), 16<<10)
		if err := raw.writeBytes(b[:n]); err != nil {
			t.Fatalf("write: %v (the node closed the link mid-frame)", err)
		}
		b = b[n:]
		time.Sleep(4 * time.Millisecond)
	}
	got := recv(t, ctx, node.runStarted, "the large run on the node")
	if len(got.Input) != len(req.Input) {
		t.Errorf("input %d bytes, want %d", len(got.Input), len(req.Input))
	}
	if took := time.Since(started); took <= time.Second {
		t.Logf("the frame crossed in %v, within the heartbeat timeout: the test proves less than it should", took)
	}
	if err := conn.Err(); err != nil {
		t.Errorf("the node dropped the link: %v", err)
	}
	if n := cli.reconnects.Load(); n != 0 {
		t.Errorf("the node reconnected %d times", n)
	}
}

// runReqProto is runReq as its wire message.
func runReqProto(id string) *ioppb.RunRequest { return runRequestToProto(runReq(id)) }
