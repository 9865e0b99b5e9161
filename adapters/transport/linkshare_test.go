package transport

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"iop/domain"
	"iop/ports"
)

// ---- the edge's shares of a link's streams --------------------------------

// Provider tunnels, which hold their stream as long as their caller reads,
// may take at most tunnelShare of a link's streams: with that many open, a
// further tunnel is refused at_capacity saying so, while runs still get
// streams; with runs filling the rest, cancels and commands still get the
// controlReserve. The link goes on throughout.
func TestLinkSharesKeepStreamsForRunsAndCancels(t *testing.T) {
	const streams = 64
	share, reserve := tunnelShare(streams), controlReserve(streams)
	if share >= streams-reserve || reserve < 1 {
		t.Fatalf("test assumes a tunnel share (%d) below the runs' (%d) and a control reserve (%d)", share, streams-reserve, reserve)
	}
	edgeCfg := Config{MaxStreams: streams}
	p := newPair(t, pairOptions{server: edgeCfg}, func(_ *fakeEdge, n *fakeNode) {
		n.holdRuns = true
		n.onTunnel = func(ctx context.Context, _ domain.TunnelRequest, _ io.Reader, _ ports.TunnelSink) {
			<-ctx.Done() // a caller that never finishes reading
		}
		n.onCommand = func(context.Context, string, []byte, func([]byte) error) ([]byte, error) {
			return []byte(`"ok"`), nil
		}
	})
	tunnel := func() (ports.TunnelStream, error) {
		return p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "p", Method: "POST", Path: "/v1/chat/completions"}, nil)
	}
	var tunnels []ports.TunnelStream
	defer func() {
		for _, ts := range tunnels {
			ts.Close()
		}
	}()
	for i := range share {
		ts, err := tunnel()
		mustf(t, err, "tunnel %d of %d", i+1, share)
		tunnels = append(tunnels, ts)
	}
	_, err := tunnel()
	if domain.CodeOf(err) != domain.CodeAtCapacity || !strings.Contains(err.Error(), "busy with provider tunnels") {
		t.Fatalf("tunnel past the share: %v (code %s), want at_capacity saying the link is busy with tunnels", err, domain.CodeOf(err))
	}

	// Runs take the streams tunnels may not, all but the control reserve.
	var runs []ports.RunStream
	defer func() {
		for _, rs := range runs {
			rs.Close()
		}
	}()
	for i := range streams - reserve - share {
		id := fmt.Sprintf("r%d", i)
		rs, err := p.link.StartRun(p.ctx, runReq(id))
		mustf(t, err, "StartRun %s with tunnels holding their share", id)
		runs = append(runs, rs)
		ev, err := rs.Recv(p.ctx)
		mustf(t, err, "Recv %s", id)
		if ev.Type != domain.EventStart {
			t.Fatalf("%s: first event %v", id, ev.Type)
		}
	}
	if _, err := p.link.StartRun(p.ctx, runReq("over")); domain.CodeOf(err) != domain.CodeAtCapacity {
		t.Fatalf("run into the control reserve: %v, want at_capacity", err)
	}

	// Cancels and commands take the control reserve.
	mustf(t, p.link.CancelRun(p.ctx, "r0", ""), "CancelRun with the link full of runs and tunnels")
	cs, err := p.link.Command(p.ctx, "ping", nil)
	mustf(t, err, "Command with the link full of runs and tunnels")
	reply, err := cs.Recv(p.ctx)
	mustf(t, err, "command reply")
	if !reply.Final || reply.Err != nil || string(reply.Result) != `"ok"` {
		t.Fatalf("command reply %+v", reply)
	}
	cs.Close()

	// A tunnel that ends gives its place in the share back.
	tunnels[0].Close()
	tunnels = tunnels[1:]
	ts, err := tunnel()
	mustf(t, err, "tunnel after one ended")
	tunnels = append(tunnels, ts)
	if err := p.link.conn.Err(); err != nil {
		t.Errorf("link ended: %v", err)
	}
}
