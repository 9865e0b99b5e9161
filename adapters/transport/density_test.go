package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// registerRaw starts an edge and registers a raw node on it.
func registerRaw(t *testing.T) (context.Context, *fakeEdge, *rawPeer, *edgeLink) {
	t.Helper()
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", testConfig(), edge)
	raw := dialRaw(t, srv.Addr().String())
	if resp := raw.register(ctx, testToken, 1<<20); !resp.GetAccepted() {
		t.Fatalf("register: %+v", resp)
	}
	return ctx, edge, raw, recv(t, ctx, edge.registered, "node").Link.(*edgeLink)
}

// alive checks that the edge has read everything the raw node sent so far
// (a heartbeat's reply comes after) and kept the link.
func alive(t *testing.T, ctx context.Context, raw *rawPeer, link *edgeLink, stamp int64) {
	t.Helper()
	raw.write(&ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{SentUnixNano: stamp}}})
	raw.readUntil(ctx, "the heartbeat's reply", func(f *ioppb.Frame) bool { return f.GetHeartbeat().GetEchoUnixNano() == stamp })
	if err := link.conn.Err(); err != nil {
		t.Fatalf("the node was disconnected: %v", err)
	}
}

// A frame of the largest size full of empty messages (2 million, ≈ 200 MiB
// decoded) is refused before it is decoded: the edge allocates little more
// than the frame's bytes.
func TestDenseNodeFrameIsRefusedUndecoded(t *testing.T) {
	// Made before the node registers: it takes a while (seconds under
	// -race), and a node silent that long is dropped.
	wire := emptyMessagesFrame(t, (DefaultMaxFrameSize-16)/2)
	if len(wire) > DefaultMaxFrameSize {
		t.Fatalf("test frame of %d bytes is over the frame limit", len(wire))
	}
	ctx, edge, raw, link := registerRaw(t)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	mustf(t, raw.writeBytes(wire), "write")
	d := recv(t, ctx, edge.disconnected, "disconnect")
	runtime.ReadMemStats(&after)
	if d.Link != link || !strings.Contains(d.Reason, "protocol violation") || !strings.Contains(d.Reason, "more than 16384") {
		t.Fatalf("disconnect %+v", d)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 3*DefaultMaxFrameSize {
		t.Fatalf("refusing the frame allocated %d MiB", alloc>>20)
	}
}

// What a node sends legitimately passes: node_stats of an older node that
// does not cut them (thousands of adapters), and a tunnel whose header
// frame is as dense as the node sends (16,000 elements) followed by a
// window's worth of one-byte protobuf body frames, the densest stream a
// node produces, queued while the caller does not read.
func TestDenseLegitimateNodeFramesPass(t *testing.T) {
	ctx, _, raw, link := registerRaw(t)
	stats := &ioppb.NodeStats{}
	for i := range 3000 {
		stats.Adapters = append(stats.Adapters, &ioppb.AdapterSlots{Name: fmt.Sprint("a", i), MaxConcurrency: 1})
		stats.Providers = append(stats.Providers, &ioppb.ProviderLatency{Name: fmt.Sprint("p", i), Count: 1})
	}
	raw.write(&ioppb.Frame{Body: &ioppb.Frame_NodeStats{NodeStats: stats}})
	alive(t, ctx, raw, link, 1)
	if s, ok := link.NodeStats(); !ok || len(s.Adapters) != maxStatsEntries || len(s.Providers) != maxStatsEntries {
		t.Fatalf("stats %v: %d adapters, %d providers", ok, len(s.Adapters), len(s.Providers))
	}

	ts, err := link.OpenTunnel(ctx, domain.TunnelRequest{Provider: "oa", Method: "GET", Path: "/"}, nil)
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	id := raw.readUntil(ctx, "tunnel request", func(f *ioppb.Frame) bool { return f.GetProviderTunnelRequest() != nil }).StreamId
	tunnel := func(pf *ioppb.ProviderTunnelFrame) []byte {
		return mustFrame(t, &ioppb.Frame{StreamId: id, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: pf}})
	}
	var hs []*ioppb.Header
	for i := range (headerElements - 3) / 3 {
		hs = append(hs, &ioppb.Header{Name: fmt.Sprint("x", i), Values: [][]byte{nil}})
	}
	header := &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Header{Header: &ioppb.HeaderBlock{Headers: hs}}}
	if n := headerFrameElements(header); n > headerElements || n < headerElements-3 {
		t.Fatalf("header frame of %d elements", n)
	}
	window := int(testConfig().withDefaults().StreamWindow)
	credit := window
	for _, b := range [][]byte{tunnel(&ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Status{Status: 200}}), tunnel(header)} {
		mustf(t, raw.writeBytes(b), "write")
		credit -= len(b) - 1 + frameOverhead
	}
	body := tunnel(&ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Body{Body: []byte("x")}})
	cost := len(body) - 1 + frameOverhead
	bodies := (credit - 64) / cost
	var all []byte
	for range bodies {
		all = append(all, body...)
	}
	mustf(t, raw.writeBytes(all), "bodies")
	alive(t, ctx, raw, link, 2)
	link.conn.mu.Lock()
	s := link.conn.streams[id]
	link.conn.mu.Unlock()
	s.mu.Lock()
	queued := s.elems
	s.mu.Unlock()
	t.Logf("%d elements queued on the stream, of %d", queued, streamElements(window))
	// The caller reads them all.
	for i := range 2 + bodies {
		f, err := ts.Recv(ctx)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if i == 1 && len(f.Header) != len(hs) {
			t.Fatalf("%d headers arrived, want %d", len(f.Header), len(hs))
		}
	}
	alive(t, ctx, raw, link, 3)
}

// headerFrameElements counts what the edge's decoder counts.
func TestHeaderFrameElementsMatchesTheWire(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var hs []*ioppb.Header
		for range r.IntN(20) {
			h := &ioppb.Header{}
			if r.IntN(3) > 0 {
				h.Name = strings.Repeat("n", r.IntN(4))
			}
			for range r.IntN(4) {
				h.Values = append(h.Values, []byte(strings.Repeat("v", r.IntN(3))))
			}
			hs = append(hs, h)
		}
		pf := &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Header{Header: &ioppb.HeaderBlock{Headers: hs}}}
		b, err := proto.Marshal(&ioppb.Frame{StreamId: 3, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: pf}})
		mustf(t, err, "marshal")
		if got, err := checkElements(b, 1<<20); err != nil || got != headerFrameElements(pf) {
			t.Fatalf("wire count %d (%v), headerFrameElements %d", got, err, headerFrameElements(pf))
		}
	}
}

// A node refuses to send a header frame denser than the edge accepts: the
// tunnel ends with the node's error, the link stays. A response with many
// headers below the bound goes through whole.
func TestTunnelHeadersTooManyForAFrame(t *testing.T) {
	refused := make(chan error, 1)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(_ context.Context, req domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200})
			h := domain.Header{}
			if req.Path == "/many" {
				for i := range 2000 {
					h[fmt.Sprint("X-", i)] = []string{"v"}
				}
				_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelHeader, Header: h})
				_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelEnd})
				return
			}
			h["Set-Cookie"] = make([]string, headerElements) // empty values: 2 bytes each
			err := out.Send(domain.TunnelFrame{Kind: domain.TunnelHeader, Header: h})
			refused <- err
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderError, Message: err.Error()}})
		}
	})
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Path: "/dense"}, nil)
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	var tooMany *ports.FrameTooLargeError
	if err := recv(t, p.ctx, refused, "header send"); !errors.As(err, &tooMany) || tooMany.MaxElements != headerElements || tooMany.Elements <= headerElements {
		t.Fatalf("header send: %v, want a FrameTooLargeError over %d elements", err, headerElements)
	}
	if f, err := ts.Recv(p.ctx); err != nil || f.Kind != domain.TunnelStatus {
		t.Fatalf("first frame %+v %v", f, err)
	}
	if f, err := ts.Recv(p.ctx); err != nil || f.Kind != domain.TunnelError || !strings.Contains(f.Error.Message, "header entries, names and values") {
		t.Fatalf("second frame %+v %v, want the node's error", f, err)
	}

	ts2, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Path: "/many"}, nil)
	mustf(t, err, "OpenTunnel")
	defer ts2.Close()
	_, err = ts2.Recv(p.ctx)
	mustf(t, err, "status")
	if f, err := ts2.Recv(p.ctx); err != nil || len(f.Header) != 2000 {
		t.Fatalf("header frame: %d headers, %v", len(f.Header), err)
	}
	if p.link.conn.Err() != nil {
		t.Fatalf("link ended: %v", p.link.conn.Err())
	}
}

// The node cuts its stats to what the edge keeps.
func TestNodeStatsCutOnTheNode(t *testing.T) {
	var s domain.NodeStats
	for i := range 1000 {
		s.Adapters = append(s.Adapters, domain.AdapterSlots{Name: fmt.Sprint(i)})
		s.Providers = append(s.Providers, domain.ProviderLatency{Name: fmt.Sprint(i)})
	}
	p := statsToProto(s)
	if len(p.Adapters) != maxStatsEntries || len(p.Providers) != maxStatsEntries {
		t.Fatalf("%d adapters, %d providers", len(p.Adapters), len(p.Providers))
	}
}
