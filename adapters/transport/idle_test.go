package transport

import (
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"iop/domain"
	ioppb "iop/proto/iop"
)

// goroutineStacks returns the stack of every goroutine in the process.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// The read loop runs on the goroutine that owns the link (the edge's
// readLink, which took over from the connection's serve; the node's Run),
// and no goroutine of either side only waits for the link to end (with the
// writer running only while there is something to write, an idle link
// costs one goroutine per side).
func TestLinkReadsOnItsOwnersGoroutine(t *testing.T) {
	p := newPair(t, pairOptions{}, nil)
	owners := map[string]int{"(*Server).readLink": 0, "(*Client).Run": 0}
	eventually(t, p.ctx, "both read loops running on their owners' goroutines", func() bool {
		for name := range owners {
			owners[name] = 0
		}
		for _, g := range goroutineStacks() {
			if !strings.Contains(g, "iop/adapters/transport.") {
				continue
			}
			if strings.Contains(g, "transport.(*Server).serve(") || strings.Contains(g, "transport.(*Client).register(") {
				return false // a handshake goroutine still there
			}
			for name := range owners {
				if strings.Contains(g, "transport."+name+"(") {
					if !strings.Contains(g, "(*Conn).readLoop(") {
						return false // an owner waiting, not reading
					}
					owners[name]++
				}
			}
		}
		return owners["(*Server).readLink"] == 1 && owners["(*Client).Run"] == 1
	})
}

// A node's stats go out now and every interval from timers, not from a
// goroutine of the link's, and stop when the node does.
func TestNodeStatsReportedFromTimers(t *testing.T) {
	var calls atomic.Int64
	stats := func() domain.NodeStats { return domain.NodeStats{ChildProcesses: int(calls.Add(1))} }
	p := newPair(t, pairOptions{client: ClientConfig{Stats: stats, StatsInterval: 20 * time.Millisecond}}, nil)
	eventually(t, p.ctx, "three reports at the edge", func() bool {
		s, ok := p.link.NodeStats()
		return ok && s.ChildProcesses >= 3
	})
	for _, g := range goroutineStacks() {
		if strings.Contains(g, "transport.reportStats") && !strings.Contains(g, "(*statsReporter).send(") {
			t.Errorf("a goroutine waits for the next stats report:\n%s", g)
		}
	}
	if err := p.cli.stop(t); err != nil {
		t.Fatal(err)
	}
	n := calls.Load()
	time.Sleep(100 * time.Millisecond)
	if m := calls.Load(); m != n {
		t.Errorf("%d stats reports after the node stopped", m-n)
	}
}

// writers returns the stacks of the link writers running in the process.
func writers() []string {
	var w []string
	for _, g := range goroutineStacks() {
		if strings.Contains(g, "transport.(*Conn).writeLoop(") {
			w = append(w, g)
		}
	}
	return w
}

// An idle link has no writer on either side: a writer runs only while
// there is something to write, and heartbeats come from a timer. They still
// flow both ways, each answered, and the writers that sent them end at once,
// without lingering (here the linger after other frames is an hour).
func TestIdleLinkHasNoWriterAndStillBeats(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatInterval = 300 * time.Millisecond
	cfg.writerLinger = time.Hour
	p := newPair(t, pairOptions{server: cfg, client: ClientConfig{Transport: cfg}}, nil)
	node := p.cli.currentConn()
	eventually(t, p.ctx, "no writer on either side of the idle link", func() bool { return len(writers()) == 0 })

	edge0, node0 := p.link.conn.Stats(), node.Stats()
	// Each side sends its heartbeat and answers the other's.
	eventually(t, p.ctx, "heartbeats and replies both ways", func() bool {
		e, n := p.link.conn.Stats(), node.Stats()
		return e.FramesOut >= edge0.FramesOut+2 && e.FramesIn >= edge0.FramesIn+2 &&
			n.FramesOut >= node0.FramesOut+2 && n.FramesIn >= node0.FramesIn+2 &&
			e.RTT > 0 && n.RTT > 0
	})
	eventually(t, p.ctx, "the writers that sent them ended", func() bool { return len(writers()) == 0 })
	if err := p.link.conn.Err(); err != nil {
		t.Fatalf("edge side ended: %v", err)
	}
	if err := node.Err(); err != nil {
		t.Fatalf("node side ended: %v", err)
	}
}

// A writer that wrote anything but heartbeats stays for the linger period
// (frames that follow soon need no new goroutine), then ends.
func TestWriterEndsAfterLinger(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = time.Minute, 2*time.Minute
	cfg.writerLinger = 500 * time.Millisecond
	p := newPair(t, pairOptions{server: cfg, client: ClientConfig{Transport: cfg}}, nil)
	recv(t, p.ctx, p.node.applied, "config at register")
	eventually(t, p.ctx, "no writer once the registration's frames are out", func() bool { return len(writers()) == 0 })
	cfg2 := testNodeConfig()
	cfg2.Version = 2
	mustf(t, p.link.PushConfig(p.ctx, cfg2), "PushConfig")
	if n := len(writers()); n == 0 {
		t.Error("no writer lingering right after an exchange")
	}
	eventually(t, p.ctx, "the writers ended after lingering", func() bool { return len(writers()) == 0 })
}

// gatedConn holds every Write until its gate opens, then fails it.
type gatedConn struct {
	net.Conn
	writing chan struct{}
	gate    chan struct{}
}

func (g *gatedConn) Write([]byte) (int, error) {
	select {
	case g.writing <- struct{}{}:
	default:
	}
	<-g.gate
	return 0, net.ErrClosed
}

// Close waits for a writer that is running: while the writer is inside a
// write, Close does not return, and once the write returns no writer is
// left.
func TestCloseWaitsForRunningWriter(t *testing.T) {
	a, _ := pipeConns(t)
	g := &gatedConn{Conn: a, writing: make(chan struct{}, 1), gate: make(chan struct{})}
	c := newConn(g, NewDecoder(a, DefaultMaxFrameSize), testConfig(), SideNode, 0, nopHandler{})
	c.start()
	if err := c.sendControl(testCtx(t), heartbeatFrame(time.Now())); err != nil {
		t.Fatal(err)
	}
	recv(t, testCtx(t), g.writing, "the writer in a write")
	closed := make(chan struct{})
	go func() {
		c.Close(nil)
		close(closed)
	}()
	select {
	case <-closed:
		close(g.gate)
		t.Fatal("Close returned while the link's writer was still writing")
	case <-time.After(100 * time.Millisecond):
	}
	close(g.gate)
	recv(t, testCtx(t), closed, "Close to return once the write did")
	eventually(t, testCtx(t), "no writer left", func() bool { return len(writers()) == 0 })
}

// Control frames go ahead of data: with data senders always ready and the
// writer blocked on the socket, a control frame queued then is the first
// frame of the writer's next batch, right after the frames it had already
// taken.
func TestControlFramesGoFirstPastBlockedData(t *testing.T) {
	ctx := testCtx(t)
	a, b := pipeConns(t)
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = time.Minute, 2*time.Minute // no heartbeat in between
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideNode, 1<<30, nopHandler{})
	c.start()
	defer c.Close(nil)

	const senders, frames = 4, 200
	payload := make([]byte, 1<<10)
	errs := make(chan error, senders)
	for i := range senders {
		s := addStream(c, uint64(2+2*i))
		go func() {
			for range frames {
				f := &ioppb.Frame{Body: &ioppb.Frame_TunnelRequestBody{TunnelRequestBody: &ioppb.TunnelRequestBody{Data: payload}}}
				if err := s.Send(ctx, f); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	// Nobody reads b yet: the writer blocks in its first write, with every
	// frame it took counted, and the senders wait for it.
	eventually(t, ctx, "the writer blocked on the socket", func() bool {
		for _, g := range writers() {
			if strings.Contains(g, "net.(*pipe).write(") {
				return true
			}
		}
		return false
	})
	taken := int(c.framesOut.Load())
	ctrl := &ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{SentUnixNano: 42}}}
	if err := c.sendControl(ctx, ctrl); err != nil {
		t.Fatal(err)
	}
	dec := NewDecoder(b, DefaultMaxFrameSize)
	before := 0 // frames ahead of the control frame
	for {
		f := new(ioppb.Frame)
		if _, err := dec.Decode(f); err != nil {
			t.Fatalf("frame %d: %v", before, err)
		}
		if f.GetHeartbeat().GetSentUnixNano() == 42 {
			break
		}
		before++
	}
	if before != taken {
		t.Fatalf("control frame went out after %d frames; the writer had taken %d when it was queued", before, taken)
	}
	// The rest arrives whole: the batch that began with the control frame
	// (a heartbeat, written from a small buffer) went on with data frames.
	for n := before; n < senders*frames; n++ {
		f := new(ioppb.Frame)
		if _, err := dec.Decode(f); err != nil {
			t.Fatalf("data frame %d: %v", n, err)
		}
		if got := len(f.GetTunnelRequestBody().GetData()); got != len(payload) {
			t.Fatalf("data frame %d: %d bytes of body, want %d", n, got, len(payload))
		}
	}
	go func() { _, _ = io.Copy(io.Discard, b) }()
	for range senders {
		if err := recv(t, ctx, errs, "sender"); err != nil {
			t.Fatal(err)
		}
	}
}

// A batch that starts with heartbeats (written from a small buffer) and
// goes on with other frames moves to a full-size buffer without losing or
// reordering anything.
func TestWriterBatchFromHeartbeatsToOtherFrames(t *testing.T) {
	ctx := testCtx(t)
	a, b := pipeConns(t)
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = time.Minute, 2*time.Minute
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideNode, 0, nopHandler{})
	beat := func(n int64) *ioppb.Frame {
		return &ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{SentUnixNano: n}}}
	}
	text := strings.Repeat("r", 3000)
	want := []*ioppb.Frame{beat(1), beat(2), beat(3), beat(4), beat(5),
		{Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{RunId: text}}}, beat(6)}
	// Queued before start, so the first writer takes them in one batch.
	for _, f := range want {
		mustf(t, c.sendControl(ctx, f), "queue")
	}
	c.start()
	defer c.Close(nil)
	dec := NewDecoder(b, DefaultMaxFrameSize)
	for i, w := range want {
		f := new(ioppb.Frame)
		if _, err := dec.Decode(f); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !proto.Equal(f, w) {
			t.Fatalf("frame %d: got %v, want %v", i, f, w)
		}
	}
}
