package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"iop/domain"
	ioppb "iop/proto/iop"
)

func TestHandshakeRegistersNode(t *testing.T) {
	registered := make(chan string, 4)
	info := domain.NodeInfo{Version: "1.0.0", Hostname: "box", OS: "linux", Arch: "arm64", AdapterTypes: []string{"exec", "ollama"}}
	p := newPair(t, pairOptions{client: ClientConfig{Info: info, OnRegistered: func(id string) { registered <- id }}}, nil)

	if p.reg.Token != testToken || !reflect.DeepEqual(p.reg.Info, info) {
		t.Errorf("Register got token %q info %+v", p.reg.Token, p.reg.Info)
	}
	if !strings.HasPrefix(p.reg.Remote, "127.0.0.1:") || p.link.Remote() != p.reg.Remote {
		t.Errorf("remote %q / %q", p.reg.Remote, p.link.Remote())
	}
	if id := recv(t, p.ctx, registered, "OnRegistered"); id != "node-a" {
		t.Errorf("OnRegistered(%q)", id)
	}
	cfg := recv(t, p.ctx, p.node.applied, "ApplyConfig")
	if !reflect.DeepEqual(cfg, testNodeConfig()) {
		t.Errorf("ApplyConfig got %+v", cfg)
	}
	st := p.cli.TransportStatus()
	if !st.Connected || st.ConnectedSince == 0 || st.Edge != p.srv.Addr().String() {
		t.Errorf("status after register: %+v", st)
	}
}

func TestHandshakeUnknownTokenIsFatal(t *testing.T) {
	for name, rej := range map[string]error{
		"bare code":    &domain.Error{Code: domain.CodeUnknownToken},
		"with message": domain.Errorf(domain.CodeUnknownToken, "no node has this token"),
		"wrapped":      fmt.Errorf("authenticate: %w", domain.ErrUnknownToken),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			edge := newFakeEdge()
			edge.reject = func(string, int) error { return rej }
			srv := startServer(t, "", testConfig(), edge)
			fatal := make(chan error, 2)
			cli := startClient(t, ClientConfig{Addr: srv.Addr().String(), Token: "nope", OnFatal: func(err error) { fatal <- err }}, newFakeNode())
			select {
			case <-cli.done:
			case <-ctx.Done():
				t.Fatal("Run kept retrying an unknown token")
			}
			// OnFatal heard it first (a node says so at once, before its
			// runs in flight end), once, with the error Run returns.
			if n := len(fatal); n != 1 {
				t.Fatalf("OnFatal called %d times; want once", n)
			}
			if err := <-fatal; err != cli.err {
				t.Fatalf("OnFatal(%v); want Run's error %v", err, cli.err)
			}
			var rejected *RejectedError
			if !errors.As(cli.err, &rejected) || !rejected.Fatal() {
				t.Fatalf("Run returned %v; want a fatal *RejectedError", cli.err)
			}
			if !strings.Contains(rejected.Reason, domain.CodeUnknownToken) {
				t.Errorf("reason %q", rejected.Reason)
			}
			if n := edge.registerCount(); n != 1 {
				t.Errorf("%d Register calls", n)
			}
		})
	}
}

func TestHandshakeNonFatalRejectionRetries(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	edge.reject = func(string, int) error { return domain.Errorf(domain.CodeDuplicateConn, "node-a is already connected") }
	srv := startServer(t, "", testConfig(), edge)
	cli := startClient(t, ClientConfig{Addr: srv.Addr().String(), Token: testToken}, newFakeNode())
	for i := 0; i < 3; i++ {
		if c := recv(t, ctx, edge.attempted, "register attempt"); c.Accepted {
			t.Fatal("rejected attempt reported as accepted")
		}
	}
	select {
	case <-cli.done:
		t.Fatalf("Run gave up on a non-fatal rejection: %v", cli.err)
	default:
	}
	if err := cli.stop(t); err != nil {
		t.Errorf("Run after cancel: %v", err)
	}
	if (&RejectedError{Reason: "duplicate_connection: x"}).Fatal() {
		t.Error("duplicate_connection reported fatal")
	}
	if st := cli.TransportStatus(); st.Reconnects < 2 {
		t.Errorf("reconnects %d", st.Reconnects)
	}
}

// A rejection followed by acceptance: the client keeps going and registers.
func TestHandshakeRejectedThenAccepted(t *testing.T) {
	p := newPair(t, pairOptions{}, func(e *fakeEdge, _ *fakeNode) {
		e.reject = func(_ string, attempt int) error {
			if attempt < 3 {
				return domain.ErrDuplicateConn
			}
			return nil
		}
	})
	if n := p.edge.registerCount(); n != 3 {
		t.Errorf("registered on attempt %d, want 3", n)
	}
}

func TestHandshakeFailuresDoNotStopServer(t *testing.T) {
	cfg := testConfig()
	cfg.HandshakeTimeout = 300 * time.Millisecond
	cases := []struct {
		name   string
		send   []byte
		close  bool
		reason string
	}{
		{"garbage protobuf", []byte{6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, false, "malformed"},
		{"http request then close", []byte("GET / HTTP/1.1\r\nHost: edge\r\n\r\n"), true, "unexpected EOF"},
		{"oversized length prefix", binary.AppendUvarint(nil, 1<<31), false, "exceeds maximum"},
		{"varint overflow", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, false, "malformed"},
		{"wrong first frame", encode(t, &ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{}}}), false, "expected register_request"},
		{"empty frame", []byte{0}, false, "no body"},
		{"silence", nil, false, "silent"},
		{"close at once", nil, true, "EOF"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			edge := newFakeEdge()
			edge.addNode(testToken, testNodeConfig())
			srv := startServer(t, "", cfg, edge)

			start := time.Now() // the server's handshake clock starts after this
			raw := dialRaw(t, srv.Addr().String())
			if len(tc.send) > 0 {
				mustf(t, raw.writeBytes(tc.send), "write")
			}
			if tc.close {
				_ = raw.nc.Close()
			}
			f := recv(t, ctx, edge.failed, "HandshakeFailed")
			if !strings.Contains(f.Reason, tc.reason) {
				t.Errorf("reason %q does not mention %q", f.Reason, tc.reason)
			}
			if tc.name == "silence" && time.Since(start) < cfg.HandshakeTimeout {
				t.Errorf("silent peer dropped before the handshake timeout")
			}
			if f.Remote != raw.nc.LocalAddr().String() {
				t.Errorf("remote %q, want %q", f.Remote, raw.nc.LocalAddr())
			}
			// The server closed the bad connection...
			if _, err := raw.read(ctx); err == nil {
				t.Error("bad connection still open")
			}
			// ...and still serves a real node.
			cli := startClient(t, ClientConfig{Addr: srv.Addr().String(), Token: testToken}, newFakeNode())
			recv(t, ctx, edge.registered, "registration after a failed handshake")
			_ = cli.stop(t)
			if n := edge.registerCount(); n != 1 {
				t.Errorf("%d Register calls; the bad peer must not reach Register", n)
			}
		})
	}
}

// A register frame must stay small: a peer that has not authenticated yet
// must not make the edge allocate a full-size frame buffer.
func TestHandshakeFrameLimit(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	srv := startServer(t, "", testConfig(), edge)
	raw := dialRaw(t, srv.Addr().String())
	mustf(t, raw.writeBytes(binary.AppendUvarint(nil, DefaultMaxFrameSize)), "write prefix")
	f := recv(t, ctx, edge.failed, "HandshakeFailed")
	if !strings.Contains(f.Reason, "exceeds maximum") {
		t.Errorf("reason %q", f.Reason)
	}
}

func TestRawNodeHandshakeGetsEdgeSettings(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	cfg := tinyHeartbeat()
	cfg.HeartbeatTimeout = 5 * time.Second
	cfg.StreamWindow = 512 << 10
	srv := startServer(t, "", cfg, edge)
	raw := dialRaw(t, srv.Addr().String())
	resp := raw.register(ctx, testToken, 1<<20)
	if !resp.GetAccepted() || resp.GetHeartbeatIntervalMs() != 50 || resp.GetHeartbeatTimeoutMs() != 5000 || resp.GetInitialWindow() != 512<<10 {
		t.Errorf("response %v", resp)
	}
	if got := configToDomain(resp.GetConfig()); !reflect.DeepEqual(got, testNodeConfig()) {
		t.Errorf("config %+v", got)
	}
	reg := recv(t, ctx, edge.registered, "registration")
	if reg.Info.Hostname != "raw-host" || reg.Info.Version != "raw" {
		t.Errorf("info %+v", reg.Info)
	}
	if got := reg.Link.(*edgeLink).conn.peerWindow; got != 1<<20 {
		t.Errorf("edge uses peer window %d, node granted %d", got, 1<<20)
	}
	_ = raw.nc.Close()
	d := recv(t, ctx, edge.disconnected, "Disconnected")
	if d.NodeID != "node-a" || d.Link != reg.Link {
		t.Errorf("Disconnected %+v", d)
	}
}

func TestStopWhileHandshaking(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	srv := startServer(t, "", testConfig(), edge)
	raw := dialRaw(t, srv.Addr().String())
	eventually(t, ctx, "connection tracked", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.conns) == 1
	})
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	mustf(t, srv.Stop(stopCtx), "stop")
	mustf(t, srv.Stop(stopCtx), "second stop")
	// The pending connection was closed (whether or not its handshake had
	// begun, which decides if HandshakeFailed is reported).
	if _, err := raw.read(ctx); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("pending connection not closed by Stop: %v", err)
	}
	if n := edge.registerCount(); n != 0 {
		t.Errorf("%d Register calls", n)
	}
}

// TestRegisterWithAConfigTheNodeCannotApplyLeaves: the edge admits a node
// with its whole config; a node that cannot apply it must not stay linked,
// or the edge would route runs to adapters the node does not run. It leaves
// and retries.
func TestRegisterWithAConfigTheNodeCannotApplyLeaves(t *testing.T) {
	ctx := testCtx(t)
	e, n := newFakeEdge(), newFakeNode()
	e.addNode(testToken, testNodeConfig())
	n.applyErr = func(domain.NodeConfig) error { return errors.New(`adapter "llm": ollama is not installed`) }
	srv := startServer(t, "", testConfig(), e)
	startClient(t, ClientConfig{Addr: srv.Addr().String(), Token: testToken, Transport: testConfig()}, n)

	reg := recv(t, ctx, e.registered, "registration")
	d := recv(t, ctx, e.disconnected, "disconnect after the refused config")
	if d.Link != reg.Link {
		t.Fatalf("disconnect of %v, want the registered link", d.Link)
	}
	// The edge learns why (its log, bus event and node list carry it).
	want := fmt.Sprintf(`node refused its config v%d: adapter "llm": ollama is not installed`, testNodeConfig().Version)
	if d.Reason != want {
		t.Fatalf("disconnect reason %q, want %q", d.Reason, want)
	}
	// It comes back (and leaves again): a refused config is not final.
	recv(t, ctx, e.registered, "second registration")
}

// A node whose config does not fit in one frame is refused with a
// config_error that says so, and the edge forgets it: the connection used
// to be closed unanswered, in a loop, and the node blamed its TLS trust
// (--ca-pin) for the silence.
func TestRegisterWithAConfigLargerThanAFrameIsRefused(t *testing.T) {
	ctx := testCtx(t)
	e := newFakeEdge()
	cfg := testNodeConfig()
	cfg.Adapters[0].Targets["big"] = domain.ExecTarget{Command: []string{"echo", strings.Repeat("x", 80<<10)}}
	e.addNode(testToken, cfg)
	tc := testConfig()
	tc.MaxFrameSize = 64 << 10
	srv := startServer(t, "", tc, e)
	p := dialRaw(t, srv.Addr().String())
	resp := p.register(ctx, testToken, 1<<18)
	if resp.GetAccepted() || !strings.HasPrefix(resp.GetReason(), domain.CodeConfigError+": ") || !strings.Contains(resp.GetReason(), "max_frame_size in edge.yaml and restart the edge") {
		t.Fatalf("register response %v, want a config_error refusal saying raising max_frame_size takes a restart", resp)
	}
	d := recv(t, ctx, e.disconnected, "the admitted link let go")
	if !strings.Contains(d.Reason, "restart the edge") {
		t.Fatalf("disconnect reason %q", d.Reason)
	}
}

// The edge's link tells a config too large for the register response
// before the node is admitted, so the register use case refuses it as a
// config_error (counted and logged as such) instead of admitting the node
// and cutting it off.
func TestConfigFitsNamesTheFrameLimit(t *testing.T) {
	l := &edgeLink{conn: &Conn{cfg: Config{MaxFrameSize: 64 << 10}}}
	big := testNodeConfig()
	big.Adapters[0].Targets["big"] = domain.ExecTarget{Command: []string{"echo", strings.Repeat("x", 80<<10)}}
	if err := l.ConfigFits(big); domain.CodeOf(err) != domain.CodeConfigError || !strings.Contains(err.Error(), "max_frame_size in edge.yaml and restart the edge") {
		t.Fatalf("ConfigFits(80 KiB) = %v, want a config_error saying raising max_frame_size takes a restart", err)
	}
	if err := l.ConfigFits(testNodeConfig()); err != nil {
		t.Fatalf("ConfigFits(small) = %v", err)
	}
}
