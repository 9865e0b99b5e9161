package transport

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"iop/domain"
	ioppb "iop/proto/iop"
)

const badToken = "tok-bad-node"

// misbehaviour is one thing a registered node must not do, played by a raw
// peer; reason is what the edge's disconnect reason must say.
var misbehaviours = []struct {
	name   string
	reason string
	play   func(t *testing.T, ctx context.Context, raw *rawPeer, link *edgeLink)
}{
	{"register twice", "register frame after the handshake", func(t *testing.T, _ context.Context, raw *rawPeer, _ *edgeLink) {
		raw.write(&ioppb.Frame{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: &ioppb.RegisterRequest{Token: badToken}}})
	}},
	{"frame for a stream never opened", "never opened", func(t *testing.T, _ context.Context, raw *rawPeer, _ *edgeLink) {
		raw.write(&ioppb.Frame{StreamId: 99, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "x", Type: ioppb.EventType_EVENT_TYPE_DELTA}}})
	}},
	{"data frame for a stream never opened", "never opened", func(t *testing.T, _ context.Context, raw *rawPeer, _ *edgeLink) {
		b, _ := encodeData(dataTunnelBody, 98, []byte("data: {}\n\n"))
		mustf(t, raw.writeBytes(b), "data frame")
	}},
	{"data frames past a tunnel's credit", "overran its credit", func(t *testing.T, ctx context.Context, raw *rawPeer, link *edgeLink) {
		ts, err := link.OpenTunnel(ctx, domain.TunnelRequest{Provider: "oa", Method: "GET", Path: "/v1/models"}, nil)
		mustf(t, err, "OpenTunnel")
		t.Cleanup(ts.Close)
		id := raw.readUntil(ctx, "tunnel request", func(f *ioppb.Frame) bool { return f.GetProviderTunnelRequest() != nil }).StreamId
		chunk, _ := encodeData(dataTunnelBody, id, make([]byte, maxDataChunk))
		for range 64 {
			if raw.writeBytes(chunk) != nil {
				return
			}
		}
	}},
	{"node_stats of empty messages", "more than 16384 in a frame", func(t *testing.T, _ context.Context, raw *rawPeer, _ *edgeLink) {
		// 40 KiB on the wire, ≈ 2 MiB decoded; at 4 MiB (the frame limit)
		// it was 216 MiB for one frame.
		mustf(t, raw.writeBytes(emptyMessagesFrame(t, 20000)), "node_stats")
	}},
	{"header frames of empty headers within credit", "messages, strings and bytes values in its queued frames", func(t *testing.T, ctx context.Context, raw *rawPeer, link *edgeLink) {
		ts, err := link.OpenTunnel(ctx, domain.TunnelRequest{Provider: "oa", Method: "GET", Path: "/v1/models"}, nil)
		mustf(t, err, "OpenTunnel")
		t.Cleanup(ts.Close)
		id := raw.readUntil(ctx, "tunnel request", func(f *ioppb.Frame) bool { return f.GetProviderTunnelRequest() != nil }).StreamId
		// Each frame is under the bound on one frame's elements and all are
		// well within the stream's credit (4 × 32 KiB of 256 KiB), but they
		// would decode to ≈ 5.5 MiB queued on one stream the caller does
		// not read: 20 times the window.
		hs := make([]*ioppb.Header, 16000)
		for i := range hs {
			hs[i] = &ioppb.Header{}
		}
		f := mustFrame(t, &ioppb.Frame{StreamId: id, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{
			Kind: &ioppb.ProviderTunnelFrame_Header{Header: &ioppb.HeaderBlock{Headers: hs}}}}})
		for range 4 {
			if raw.writeBytes(f) != nil {
				return
			}
		}
	}},
	{"window update for a stream never opened", "never opened", func(t *testing.T, _ context.Context, raw *rawPeer, _ *edgeLink) {
		raw.write(&ioppb.Frame{StreamId: 77, Body: &ioppb.Frame_WindowUpdate{WindowUpdate: &ioppb.WindowUpdate{Increment: 1 << 30}}})
	}},
	{"open on the edge's stream ids", "opening stream 1", func(t *testing.T, _ context.Context, raw *rawPeer, _ *edgeLink) {
		raw.write(&ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{RunId: "p"}}})
	}},
	{"flood of events for a finished run", "flood of frames for ended streams", func(t *testing.T, ctx context.Context, raw *rawPeer, link *edgeLink) {
		rs, err := link.StartRun(ctx, runReq("fin"))
		mustf(t, err, "StartRun")
		id := raw.readUntil(ctx, "run request", func(f *ioppb.Frame) bool { return f.GetRunRequest() != nil }).StreamId
		raw.write(&ioppb.Frame{StreamId: id, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "fin", Seq: 1, Type: ioppb.EventType_EVENT_TYPE_COMPLETE}}})
		if ev, err := rs.Recv(ctx); err != nil || ev.Type != domain.EventComplete {
			t.Fatalf("finishing the run: %+v %v", ev, err)
		}
		late := mustFrame(t, &ioppb.Frame{StreamId: id, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "fin", Type: ioppb.EventType_EVENT_TYPE_DELTA, Text: strings.Repeat("z", 1<<10)}}})
		// A window's worth of late frames is what a node may have had in
		// flight; far more than that is a flood.
		for range 4 * 256 {
			if raw.writeBytes(late) != nil {
				return
			}
		}
	}},
}

// A registered node that breaks the protocol is disconnected with a logged
// reason; another node and its run are untouched.
func TestEdgeDisconnectsMisbehavingNode(t *testing.T) {
	for _, m := range misbehaviours {
		t.Run(m.name, func(t *testing.T) {
			ctx := testCtx(t)
			edge := newFakeEdge()
			edge.addNode(testToken, testNodeConfig())
			bad := testNodeConfig()
			bad.NodeID = "node-bad"
			edge.addNode(badToken, bad)
			srv := startServer(t, "", testConfig(), edge)

			good := newFakeNode()
			good.holdRuns = true
			startClient(t, ClientConfig{Addr: srv.Addr().String(), Token: testToken}, good)
			goodLink := recv(t, ctx, edge.registered, "good node").Link.(*edgeLink)
			rs, err := goodLink.StartRun(ctx, runReq("good-run"))
			mustf(t, err, "good StartRun")
			defer rs.Close()
			recv(t, ctx, good.runStarted, "good run started")

			raw := dialRaw(t, srv.Addr().String())
			if resp := raw.register(ctx, badToken, 1<<20); !resp.GetAccepted() {
				t.Fatalf("bad node register: %+v", resp)
			}
			badLink := recv(t, ctx, edge.registered, "bad node").Link.(*edgeLink)
			m.play(t, ctx, raw, badLink)

			d := recv(t, ctx, edge.disconnected, "disconnect")
			if d.Link != badLink || !strings.Contains(d.Reason, "protocol violation") || !strings.Contains(d.Reason, m.reason) {
				t.Fatalf("disconnect %+v; want the bad node with a reason naming %q", d, m.reason)
			}
			// The good node's run is still streaming, and new runs work.
			if edge.disconnectsOf(goodLink) != 0 || goodLink.conn.Err() != nil {
				t.Fatal("the good node was disconnected")
			}
			rs2, err := goodLink.StartRun(ctx, runReq("good-run-2"))
			mustf(t, err, "second good StartRun")
			defer rs2.Close()
			recv(t, ctx, good.runStarted, "second good run started")
		})
	}
}

// FuzzEdgeFramesAfterRegistration feeds arbitrary bytes to the edge's side
// of a registered link, with a run and a tunnel open on it: whatever the
// bytes, the edge never panics and the link ends cleanly when closed.
func FuzzEdgeFramesAfterRegistration(f *testing.F) {
	frames := func(fs ...*ioppb.Frame) []byte {
		var b []byte
		for _, fr := range fs {
			var err error
			if b, err = AppendFrame(b, fr, DefaultMaxFrameSize); err != nil {
				f.Fatal(err)
			}
		}
		return b
	}
	delta := &ioppb.RunEvent{RunId: "r", Type: ioppb.EventType_EVENT_TYPE_DELTA, Text: "x"}
	f.Add(frames(&ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_RunEvent{RunEvent: delta}}))
	f.Add(frames(&ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "r", Seq: 1, Type: ioppb.EventType_EVENT_TYPE_COMPLETE}}},
		&ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_RunEvent{RunEvent: delta}}))
	f.Add(frames(&ioppb.Frame{StreamId: 3, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{}}}))
	f.Add(frames(&ioppb.Frame{StreamId: 3, Body: &ioppb.Frame_WindowUpdate{WindowUpdate: &ioppb.WindowUpdate{Increment: 1 << 31}}}))
	f.Add(frames(&ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_StreamReset{StreamReset: &ioppb.StreamReset{Code: "x"}}}))
	f.Add(frames(&ioppb.Frame{StreamId: 2, Body: &ioppb.Frame_CancelRequest{CancelRequest: &ioppb.CancelRequest{}}}))
	f.Add(frames(&ioppb.Frame{Body: &ioppb.Frame_ConfigRefreshAck{ConfigRefreshAck: &ioppb.ConfigRefreshAck{Version: 1}}}))
	f.Add(frames(&ioppb.Frame{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: &ioppb.RegisterRequest{}}}))
	f.Add(frames(&ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{Reply: true, EchoUnixNano: -1}}}))
	f.Add(frames(&ioppb.Frame{Body: &ioppb.Frame_NodeDraining{NodeDraining: &ioppb.NodeDraining{}}}, &ioppb.Frame{StreamId: 2, Body: &ioppb.Frame_NodeDraining{NodeDraining: &ioppb.NodeDraining{}}}))
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	for _, d := range []struct {
		kind byte
		id   uint64
	}{{dataTunnelBody, 3}, {dataTunnelBody, 1}, {dataRequestBody, 3}, {9, 3}, {dataTunnelBody, 5}} {
		b, _ := encodeData(d.kind, d.id, []byte("data: {}\n\n"))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		defer b.Close()
		go func() { _, _ = io.Copy(io.Discard, b) }()
		cfg := testConfig()
		link := &edgeLink{remote: "fuzz", acks: map[uint64]chan error{}, h: &idleEdge{}}
		link.conn = newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideEdge, 0, link)
		link.conn.start()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		rs, err := link.StartRun(ctx, runReq("r"))
		if err != nil {
			t.Fatal(err)
		}
		ts, err := link.OpenTunnel(ctx, domain.TunnelRequest{Provider: "p", Method: "GET", Path: "/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = b.Write(in)
		link.conn.Close(nil)
		rs.Close()
		ts.Close()
		if link.conn.Err() == nil {
			t.Fatal("link did not end")
		}
	})
}

// TestManyAbandonedStreamsWithFramesInFlightKeepTheNode: a caller that
// leaves with many streams open (20 runs abandoned at once) while the node
// has sent each most of its credit is no flood: the node stayed within
// what it was granted, so the late frames are dropped and the link stays.
func TestManyAbandonedStreamsWithFramesInFlightKeepTheNode(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", testConfig(), edge)
	raw := dialRaw(t, srv.Addr().String())
	if resp := raw.register(ctx, testToken, 1<<20); !resp.GetAccepted() {
		t.Fatalf("register: %+v", resp)
	}
	link := recv(t, ctx, edge.registered, "node").Link.(*edgeLink)

	const runs = 20
	var ids []uint64
	for i := range runs {
		rs, err := link.StartRun(ctx, runReq(fmt.Sprintf("r%d", i)))
		mustf(t, err, "StartRun")
		ids = append(ids, raw.readUntil(ctx, "run request", func(f *ioppb.Frame) bool { return f.GetRunRequest() != nil }).StreamId)
		rs.Close() // the caller leaves before anything arrived
	}
	// What the node had sent before it learnt of the resets: 7/8 of each
	// stream's window (the edge's StreamWindow, 256 KiB by default).
	window := int(testConfig().withDefaults().StreamWindow)
	for _, id := range ids {
		b := mustFrame(t, &ioppb.Frame{StreamId: id, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{
			RunId: "r", Type: ioppb.EventType_EVENT_TYPE_DELTA, Text: strings.Repeat("z", 32<<10-64)}}})
		for range window * 7 / 8 / (32 << 10) {
			if err := raw.writeBytes(b); err != nil {
				t.Fatalf("write: %v", err)
			}
		}
	}
	// A heartbeat after them: its reply means the edge has read them all.
	raw.write(&ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{SentUnixNano: 42}}})
	raw.readUntil(ctx, "the heartbeat's reply", func(f *ioppb.Frame) bool { return f.GetHeartbeat().GetEchoUnixNano() == 42 })
	if err := link.conn.Err(); err != nil {
		t.Fatalf("the node was disconnected: %v", err)
	}
	// The link is alive: a new run reaches the node.
	rs, err := link.StartRun(ctx, runReq("after"))
	mustf(t, err, "StartRun after the late frames")
	defer rs.Close()
	raw.readUntil(ctx, "the next run request", func(f *ioppb.Frame) bool { return f.GetRunRequest().GetRunId() == "after" })
	if err := link.conn.Err(); err != nil {
		t.Fatalf("the node was disconnected: %v", err)
	}
}
