package transport

import (
	"bytes"
	"context"
	"testing"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// Client.Drain tells the edge, once per link, that the node is stopping
// (node_draining on stream 0), ahead of anything the node sends after it;
// a run in flight goes on and its events still arrive.
func TestDrainReachesTheEdgeOnce(t *testing.T) {
	proceed := make(chan struct{})
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onRun = func(req domain.RunRequest, out ports.RunOutput) {
			_ = out.Emit(context.Background(), domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventStart})
			<-proceed
			_ = out.Emit(context.Background(), domain.RunEvent{RunID: req.RunID, Seq: 2, Type: domain.EventCancelled,
				Error: &domain.ErrorInfo{Code: domain.CodeCancelled, Message: "node shutting down"}})
			out.Close()
		}
	})
	rs, err := p.link.StartRun(p.ctx, runReq("r1"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	if ev, err := rs.Recv(p.ctx); err != nil || ev.Type != domain.EventStart {
		t.Fatalf("first event %+v, %v; want start", ev, err)
	}

	p.cli.Drain()
	p.cli.Drain()
	d := recv(t, p.ctx, p.edge.draining, "the edge to hear the node drains")
	if d.NodeID != "node-a" || d.Link != p.link {
		t.Fatalf("draining reported for %q on %v, want node-a on its link", d.NodeID, d.Link)
	}
	close(proceed)
	if ev, err := rs.Recv(p.ctx); err != nil || ev.Type != domain.EventCancelled {
		t.Fatalf("last event %+v, %v; want the run's cancelled", ev, err)
	}
	// Both node_draining frames went out before the run's last event, and
	// the edge reads in order: the second was read, and not reported.
	if n := len(p.edge.draining); n != 0 {
		t.Fatalf("draining reported %d more times", n)
	}
	if err := p.link.conn.Err(); err != nil {
		t.Fatalf("link ended: %v", err)
	}
}

// A node whose link is replaced while it drains tells the new link too:
// the edge that admits it again must not send it runs.
func TestDrainIsSaidOnEveryLaterLink(t *testing.T) {
	p := newPair(t, pairOptions{}, nil)
	p.cli.Drain()
	recv(t, p.ctx, p.edge.draining, "draining on the first link")
	p.link.Close("replaced by the test")
	again := recv(t, p.ctx, p.edge.registered, "the node to register again")
	d := recv(t, p.ctx, p.edge.draining, "draining on the new link")
	if d.Link != again.Link || d.Link == ports.NodeLink(p.link) {
		t.Fatalf("draining reported on %v, want the new link %v", d.Link, again.Link)
	}
}

// node_draining is field 61 of Frame, an empty message: three bytes after
// the length prefix. An edge that predates it decodes a frame with no body
// (an unknown field), which its read loop drops and counts (see
// TestDecodeErrors, "unknown body field").
func TestNodeDrainingEncoding(t *testing.T) {
	b, err := AppendFrame(nil, &ioppb.Frame{Body: &ioppb.Frame_NodeDraining{NodeDraining: &ioppb.NodeDraining{}}}, DefaultMaxFrameSize)
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{0x03, 0xea, 0x03, 0x00}; !bytes.Equal(b, want) {
		t.Fatalf("node_draining encodes as % x, want % x", b, want)
	}
}
