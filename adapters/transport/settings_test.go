package transport

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"iop/domain"
	"iop/internal/lockedbuf"
	ioppb "iop/proto/iop"
)

// A node that announces a receive window too small for a data chunk (the
// edge could send it nothing over a quarter of it) is refused with a
// reason that says so; 0 (the edge's own window) and the minimum are not.
func TestEdgeRefusesTooSmallInitialWindow(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", testConfig(), edge)

	raw := dialRaw(t, srv.Addr().String())
	resp := raw.register(ctx, testToken, 4096)
	if resp.GetAccepted() || !strings.Contains(resp.GetReason(), "invalid_request: initial_window 4096 is below the minimum") {
		t.Fatalf("register with a 4 KiB window: %+v", resp)
	}
	if f := recv(t, ctx, edge.failed, "handshake failure"); !strings.Contains(f.Reason, "initial_window 4096") {
		t.Fatalf("handshake failure %q", f.Reason)
	}
	if !closedByEdge(ctx, raw) {
		t.Fatal("the connection stayed open")
	}
	if n := edge.registerCount(); n != 0 {
		t.Fatalf("Register called %d times", n)
	}
	raw = dialRaw(t, srv.Addr().String())
	if resp := raw.register(ctx, testToken, MinStreamWindow); !resp.GetAccepted() {
		t.Fatalf("register with the minimum window: %+v", resp)
	}
}

// A piece of a tunnel's request body that cannot be sent (here: the node's
// window is too small for it, as an edge that took any window allowed)
// resets the stream, so the node does not wait for the rest of a body it
// was told follows, and the caller gets an error instead of no answer.
func TestTunnelBodySendFailureResetsTheStream(t *testing.T) {
	seen := make(chan tunnelSeen, 1)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) { n.onTunnel = echoTunnel(seen, nil) })
	p.link.conn.peerWindow = 4096 // what an unchecked initial_window would have given
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Body: make([]byte, 100<<10)}, nil)
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	got := recv(t, p.ctx, seen, "node tunnel")
	var re *ResetError
	if !errors.As(got.err, &re) || re.Code != "internal" {
		t.Fatalf("node's body read: %v (%d bytes), want a reset with code internal", got.err, len(got.body))
	}
	_, err = ts.Recv(p.ctx)
	if err == nil || p.ctx.Err() != nil || !strings.Contains(err.Error(), "request body could not be sent") {
		t.Fatalf("Recv: %v, want the failed upload", err)
	}
	if p.link.conn.Err() != nil {
		t.Fatalf("link ended: %v", p.link.conn.Err())
	}
}

// A node refuses an edge whose register response has settings that cannot
// work (a broken or hostile edge) and retries; a sound one is adopted.
func TestNodeRefusesEdgeSettingsThatCannotWork(t *testing.T) {
	good := func() *ioppb.RegisterResponse {
		return &ioppb.RegisterResponse{Accepted: true, Config: configToProto(testNodeConfig()),
			HeartbeatIntervalMs: 100, HeartbeatTimeoutMs: 5000, InitialWindow: 1 << 18}
	}
	for _, c := range []struct {
		name string
		edit func(*ioppb.RegisterResponse)
		want string
	}{
		{"window below a data chunk", func(r *ioppb.RegisterResponse) { r.InitialWindow = 4096 }, "initial_window 4096 is below the minimum"},
		{"heartbeat every millisecond", func(r *ioppb.RegisterResponse) { r.HeartbeatIntervalMs = 1 }, "heartbeat interval 1ms is outside [10ms, 24h0m0s]"},
		{"timeout of 40 days", func(r *ioppb.RegisterResponse) { r.HeartbeatTimeoutMs = 40 * 24 * 3600 * 1000 }, "heartbeat timeout 960h0m0s is outside"},
		{"timeout below the interval", func(r *ioppb.RegisterResponse) { r.HeartbeatIntervalMs, r.HeartbeatTimeoutMs = 5000, 1000 }, "does not exceed the interval"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			redge := listenRawEdge(t)
			var logs lockedbuf.Buffer
			registered := make(chan string, 4)
			cc := ClientConfig{Addr: redge.ln.Addr().String(), Token: testToken, Transport: testConfig(),
				OnRegistered: func(id string) { registered <- id }}
			cc.Transport.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			startClient(t, cc, newFakeNode())
			bad := good()
			c.edit(bad)
			first, _ := redge.accept(ctx, bad)
			for {
				if _, err := first.read(ctx); err != nil {
					if !errors.Is(err, io.EOF) {
						t.Fatalf("the node kept the connection: %v", err)
					}
					break
				}
			}
			eventually(t, ctx, "the node logs why", func() bool { return strings.Contains(logs.String(), c.want) })
			select {
			case <-registered:
				t.Fatal("the node registered")
			default:
			}
			redge.accept(ctx, good())
			recv(t, ctx, registered, "registration with sound settings")
		})
	}
}
