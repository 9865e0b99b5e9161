package transport

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// stalledConn is a Conn over a pipe whose peer never reads, with a write
// deadline far beyond the test's own, so only the close grace can end a
// stuck write in time. Started, its writer is stuck in a write; not
// started (queueFull), its one-frame control queue is full and nothing
// takes from it, as when the writer is stuck with the queue full behind it.
func stalledConn(t *testing.T, queueFull bool) *Conn {
	t.Helper()
	a, _ := pipeConns(t)
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = time.Hour, 2*time.Hour
	cfg.WriteTimeout = 2 * time.Hour
	cfg.ControlQueue = 1
	cfg.closeGrace = 50 * time.Millisecond
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideNode, 1<<20, nopHandler{})
	t.Cleanup(func() { c.Close(nil) })
	if queueFull {
		c.offer()
		c.ctrl <- heartbeatFrame(time.Now())
		return c
	}
	c.start()
	// net.Pipe has no buffer: the writer blocks in this frame's write.
	if err := c.sendControl(testCtx(t), heartbeatFrame(time.Now())); err != nil {
		t.Fatal(err)
	}
	return c
}

// A link closed with CloseAfterFlush while its peer has stopped reading
// closes after the close grace, not after the write deadline (the heartbeat
// timeout, 45 s by default): a stopping node waited for it past fx's stop
// timeout and exited 1. Both ways it could hang are covered: the writer
// stuck with the close queued behind it, and the control queue full so the
// close cannot even be queued.
func TestCloseAfterFlushIsBoundedWhenPeerStopsReading(t *testing.T) {
	for _, tc := range []struct {
		name      string
		queueFull bool
	}{
		{"writer stuck", false},
		{"control queue full", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := stalledConn(t, tc.queueFull)
			cause := errors.New("node shutting down")
			returned := make(chan struct{})
			go func() {
				c.CloseAfterFlush(cause)
				close(returned)
			}()
			recv(t, ctx, returned, "CloseAfterFlush to return")
			recv(t, ctx, c.Done(), "the link to close")
			if err := c.Err(); !errors.Is(err, cause) || !strings.Contains(err.Error(), "not written within") {
				t.Fatalf("link error %v, want %v saying what was queued was not written", err, cause)
			}
			closed := make(chan struct{})
			go func() { c.Close(nil); close(closed) }()
			recv(t, ctx, closed, "the writer to end")
		})
	}
}

// A peer that reads gets everything queued before CloseAfterFlush, then
// the end of the connection; the link's error is the cause as given.
func TestCloseAfterFlushWritesWhatIsQueued(t *testing.T) {
	ctx := testCtx(t)
	a, b := pipeConns(t)
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = time.Hour, 2*time.Hour
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideNode, 1<<20, nopHandler{})
	c.start()
	defer c.Close(nil)
	// The peer reads from the start: net.Pipe has no buffer, so each send
	// waits for its read.
	read := make(chan []uint64, 1)
	go func() {
		dec := NewDecoder(b, DefaultMaxFrameSize)
		var seqs []uint64
		for {
			f := new(ioppb.Frame)
			if _, err := dec.Decode(f); err != nil {
				read <- seqs
				return
			}
			if ev := f.GetRunEvent(); ev != nil {
				seqs = append(seqs, ev.GetSeq())
			}
		}
	}()
	s := addStream(c, 2)
	const frames = 20
	for i := range frames {
		f := &ioppb.Frame{Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "r", Seq: uint64(i + 1)}}}
		if err := s.Send(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	cause := errors.New("node shutting down")
	returned := make(chan struct{})
	go func() {
		c.CloseAfterFlush(cause)
		close(returned)
	}()
	seqs := recv(t, ctx, read, "the peer to read to the end")
	recv(t, ctx, returned, "CloseAfterFlush to return")
	if len(seqs) != frames || seqs[frames-1] != frames {
		t.Fatalf("peer read events %v, want 1…%d", seqs, frames)
	}
	if err := c.Err(); err != cause {
		t.Fatalf("link error %v, want %v", err, cause)
	}
}

// A node stopping while its edge has stopped reading (its writer stuck in a
// write, the socket buffers full) ends its link within the close grace:
// Run returned only once the write deadline — the heartbeat timeout, here
// ten minutes — gave up on the write, so iop-node overran fx's stop timeout
// and exited 1.
func TestClientStopIsBoundedWhenEdgeStopsReading(t *testing.T) {
	ctx := testCtx(t)
	redge := listenRawEdge(t)
	node := newFakeNode()
	stuck := make(chan struct{})
	node.onRun = func(req domain.RunRequest, out ports.RunOutput) {
		big := domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventDelta, Text: strings.Repeat("x", 1<<20)}
		// Taken by the writer: it cannot write a mebibyte into the few
		// KiB the socket buffers hold while the edge does not read.
		if err := out.Emit(context.Background(), big); err != nil {
			t.Errorf("emit: %v", err)
		}
		close(stuck)
		for err := error(nil); err == nil; {
			err = out.Emit(context.Background(), big) // until the link ends
		}
	}
	registered := make(chan string, 1)
	cc := ClientConfig{Addr: redge.ln.Addr().String(), Token: testToken, Transport: testConfig(),
		OnRegistered: func(id string) { registered <- id }}
	cli := startClient(t, cc, node)
	resp := &ioppb.RegisterResponse{Accepted: true, Config: configToProto(testNodeConfig()),
		HeartbeatIntervalMs: 300_000, HeartbeatTimeoutMs: 600_000, InitialWindow: 64 << 20}
	edge, _ := redge.accept(ctx, resp)
	recv(t, ctx, registered, "registration")
	// Small buffers on both ends, so what they hold is far below the frame.
	mustf(t, edge.nc.(*net.TCPConn).SetReadBuffer(4096), "edge read buffer")
	mustf(t, cli.currentConn().nc.(*net.TCPConn).SetWriteBuffer(4096), "node write buffer")
	edge.write(&ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_RunRequest{RunRequest: runRequestToProto(runReq("r1"))}})
	recv(t, ctx, stuck, "the node's writer to hold a frame it cannot write")

	// stop fails the test unless Run returns within 10 s: generous, and
	// still far below the ten-minute write deadline.
	if err := cli.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A heartbeat skipped because the control queue is full leaves the probe
// whose reply may be on its way: it replaced it, so that reply no longer
// matched and the RTT stopped updating exactly while the link was busy.
func TestSkippedHeartbeatKeepsTheProbeInFlight(t *testing.T) {
	c := stalledConn(t, true)
	c.wmu.Lock()
	c.hb = time.AfterFunc(time.Hour, func() {}) // what launch arms; heartbeat re-arms it
	c.wmu.Unlock()
	t.Cleanup(func() { c.hb.Stop() })
	inFlight := &heartbeatProbe{stamp: 42, at: time.Now()}
	c.probe.Store(inFlight)
	c.heartbeat()
	if got := c.probe.Load(); got != inFlight {
		t.Fatalf("after a skipped heartbeat the probe is %+v, want the one in flight %+v", got, inFlight)
	}
	c.onHeartbeat(&ioppb.Heartbeat{Reply: true, EchoUnixNano: 42})
	if c.rtt.Load() == 0 {
		t.Fatal("the reply to the probe in flight gave no RTT sample")
	}
}
