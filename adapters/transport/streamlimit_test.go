package transport

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"iop/domain"
	"iop/ports"
)

// ---- the stream limit where the two ends free streams at different times --

// The edge counts a run's stream free once the terminal event arrives; the
// node, once the run's handler returns, which may be later. At MaxStreams
// the edge then opens a stream into a slot the node still holds: the node
// must take it (the old one has sent its last frame), not reset it
// too_many_streams (which the edge took for a lost node).
func TestStreamLimitCountsFinishedStreamsFree(t *testing.T) {
	release := make(chan struct{})
	one := Config{MaxStreams: 1}
	p := newPair(t, pairOptions{server: one, client: ClientConfig{Transport: one}}, func(_ *fakeEdge, n *fakeNode) {
		n.onRun = func(req domain.RunRequest, out ports.RunOutput) {
			for _, ev := range defaultScript(req) {
				if out.Emit(context.Background(), ev) != nil {
					return
				}
			}
			if req.RunID == "r1" {
				<-release // the handler goes on after its terminal event
			}
			out.Close()
		}
	})
	defer close(release)
	drain := func(id string) {
		t.Helper()
		rs, err := p.link.StartRun(p.ctx, runReq(id))
		mustf(t, err, "StartRun %s", id)
		defer rs.Close()
		for {
			ev, err := rs.Recv(p.ctx)
			mustf(t, err, "Recv %s", id)
			if ev.Type.Terminal() {
				if ev.Type != domain.EventComplete {
					t.Fatalf("%s ended %v", id, ev.Type)
				}
				return
			}
		}
	}
	drain("r1")
	// r1's handler still holds its stream on the node.
	if n := p.cli.currentConn().Stats().Streams; n != 1 {
		t.Fatalf("node holds %d streams, want r1's", n)
	}
	drain("r2")
	if err := p.link.conn.Err(); err != nil {
		t.Errorf("link ended: %v", err)
	}
}

// Past the margin for finished streams, and for a stream the node holds
// open, the node still refuses: the edge's caller gets at_capacity (429,
// try again), not node_disconnected, and the link goes on.
func TestStreamLimitRefusalIsAtCapacity(t *testing.T) {
	release := make(chan struct{})
	edgeCfg := Config{MaxStreams: 64}
	nodeCfg := Config{MaxStreams: 1}
	p := newPair(t, pairOptions{server: edgeCfg, client: ClientConfig{Transport: nodeCfg}}, func(_ *fakeEdge, n *fakeNode) {
		n.onRun = func(req domain.RunRequest, out ports.RunOutput) {
			for _, ev := range defaultScript(req)[:2] { // start, delta: still running
				if out.Emit(context.Background(), ev) != nil {
					return
				}
			}
			<-release
			_ = out.Emit(context.Background(), defaultScript(req)[2])
			out.Close()
		}
	})
	defer close(release)
	held, err := p.link.StartRun(p.ctx, runReq("held"))
	mustf(t, err, "StartRun held")
	defer held.Close()
	ev, err := held.Recv(p.ctx)
	mustf(t, err, "Recv held")
	if ev.Type != domain.EventStart {
		t.Fatalf("held: %v", ev.Type)
	}
	rs, err := p.link.StartRun(p.ctx, runReq("refused"))
	mustf(t, err, "StartRun refused")
	defer rs.Close()
	_, err = rs.Recv(p.ctx)
	if domain.CodeOf(err) != domain.CodeAtCapacity || errors.Is(err, domain.ErrNodeDisconnected) {
		t.Fatalf("refused run: %v (code %s), want at_capacity", err, domain.CodeOf(err))
	}
	if err := p.link.conn.Err(); err != nil {
		t.Errorf("link ended: %v", err)
	}
}

// Streams that linger after their last frame are admitted past MaxStreams
// only within the margin: handlers that never return cannot pile up.
func TestStreamLimitMarginIsBounded(t *testing.T) {
	release := make(chan struct{})
	edgeCfg := Config{MaxStreams: 64}
	nodeCfg := Config{MaxStreams: 1}
	p := newPair(t, pairOptions{server: edgeCfg, client: ClientConfig{Transport: nodeCfg}}, func(_ *fakeEdge, n *fakeNode) {
		n.onRun = func(req domain.RunRequest, out ports.RunOutput) {
			for _, ev := range defaultScript(req) {
				if out.Emit(context.Background(), ev) != nil {
					return
				}
			}
			<-release
			out.Close()
		}
	})
	defer close(release)
	margin := finishingMargin(1)
	for i := range 1 + margin {
		id := fmt.Sprintf("r%d", i)
		rs, err := p.link.StartRun(p.ctx, runReq(id))
		mustf(t, err, "StartRun %s", id)
		for {
			ev, err := rs.Recv(p.ctx)
			mustf(t, err, "Recv %s (run %d of %d the margin allows)", id, i+1, 1+margin)
			if ev.Type.Terminal() {
				break
			}
		}
		rs.Close()
	}
	rs, err := p.link.StartRun(p.ctx, runReq("over"))
	mustf(t, err, "StartRun over")
	defer rs.Close()
	if _, err := rs.Recv(p.ctx); domain.CodeOf(err) != domain.CodeAtCapacity {
		t.Fatalf("run past the margin: %v (code %s), want at_capacity", err, domain.CodeOf(err))
	}
}
