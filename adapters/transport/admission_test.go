package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ioppb "iop/proto/iop"
)

// dialFrom connects to addr from the loopback address local (127.0.0.x),
// so tests can play several remote addresses.
func dialFrom(tb testing.TB, local, addr string) *rawPeer {
	tb.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		tb.Fatalf("dial from %s: %v", local, err)
	}
	return newRawPeer(tb, nc)
}

// closedByEdge reports whether the edge closed p without sending anything.
func closedByEdge(ctx context.Context, p *rawPeer) bool {
	_, err := p.read(ctx)
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// stillOpen reports whether p is open and silent for a short while.
func stillOpen(p *rawPeer) bool {
	_ = p.nc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var b [1]byte
	_, err := p.nc.Read(b[:])
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestUnregisteredConnsCappedPerAddress(t *testing.T) {
	ctx := testCtx(t)
	cfg := testConfig()
	cfg.MaxPendingPerAddr = 3
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", cfg, edge)
	addr := srv.Addr().String()

	var idle []*rawPeer
	for range 3 {
		idle = append(idle, dialFrom(t, "127.0.0.2", addr))
	}
	over := dialFrom(t, "127.0.0.2", addr)
	if !closedByEdge(ctx, over) {
		t.Fatal("a 4th unregistered connection from one address was not closed at once")
	}
	f := recv(t, ctx, edge.failed, "handshake failure")
	if !strings.Contains(f.Reason, "from this address") {
		t.Errorf("reason %q", f.Reason)
	}
	// Another address is not affected: a real node registers.
	registered := make(chan string, 1)
	startClient(t, ClientConfig{Addr: addr, Token: testToken, OnRegistered: func(id string) { registered <- id }}, newFakeNode())
	recv(t, ctx, registered, "registration from another address")
	for i, p := range idle {
		if !stillOpen(p) {
			t.Errorf("idle connection %d under the cap was closed", i)
		}
	}
	// Freeing a slot admits the address again.
	_ = idle[0].nc.Close()
	eventually(t, ctx, "slot released", func() bool {
		srv.adm.mu.Lock()
		defer srv.adm.mu.Unlock()
		return srv.adm.perAddr["127.0.0.2"] == 2
	})
	again := dialFrom(t, "127.0.0.2", addr)
	if resp := again.register(ctx, testToken, 0); !resp.GetAccepted() {
		t.Fatalf("register after a slot was freed: %+v", resp)
	}
}

func TestUnregisteredConnsCappedInTotal(t *testing.T) {
	ctx := testCtx(t)
	cfg := testConfig()
	cfg.MaxPending = 4
	srv := startServer(t, "", cfg, newFakeEdge())
	addr := srv.Addr().String()
	var idle []*rawPeer
	for i := range 4 {
		idle = append(idle, dialFrom(t, "127.0.0."+strconv.Itoa(2+i), addr))
	}
	if !closedByEdge(ctx, dialFrom(t, "127.0.0.9", addr)) {
		t.Fatal("a connection past the total cap was not closed at once")
	}
	for i, p := range idle {
		if !stillOpen(p) {
			t.Errorf("idle connection %d under the cap was closed", i)
		}
	}
}

// Idle sockets used to hold the handshake slots while waiting for their
// register frame, so more of them than there are slots kept a real node
// out until they timed out. Now a slot is taken only with a frame in hand.
func TestIdleSocketsDoNotHoldHandshakeSlots(t *testing.T) {
	ctx := testCtx(t)
	cfg := testConfig()
	cfg.HandshakeTimeout = 20 * time.Second
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", cfg, edge)
	addr := srv.Addr().String()
	n := cap(srv.sem) + 10
	var idle []*rawPeer
	for i := range n {
		idle = append(idle, dialFrom(t, "127.0.1."+strconv.Itoa(1+i/100), addr))
	}
	eventually(t, ctx, "idle sockets admitted", func() bool {
		srv.adm.mu.Lock()
		defer srv.adm.mu.Unlock()
		return srv.adm.pending == n
	})
	p := dialRaw(t, addr)
	if resp := p.register(ctx, testToken, 0); !resp.GetAccepted() {
		t.Fatalf("register: %+v", resp)
	}
	// The node got in while every idle socket was still waiting.
	open := 0
	for _, q := range idle {
		if stillOpen(q) {
			open++
		}
	}
	if open != n {
		t.Fatalf("only %d of %d idle sockets still open: the node got in after they timed out", open, n)
	}
}

func TestFailedRegistrationsThrottledPerAddress(t *testing.T) {
	ctx := testCtx(t)
	cfg := testConfig()
	cfg.RegisterFailBurst = 5
	cfg.RegisterFailRate = 0.001 // no refill within the test
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", cfg, edge)
	addr := srv.Addr().String()

	answered, silent := 0, 0
	for range 12 {
		p := dialFrom(t, "127.0.0.3", addr)
		p.write(&ioppb.Frame{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: &ioppb.RegisterRequest{Token: "guess"}}})
		f, err := p.read(ctx)
		switch {
		case err == nil && f.GetRegisterResponse() != nil && !f.GetRegisterResponse().GetAccepted():
			if silent > 0 {
				t.Fatal("an answer after the address was throttled")
			}
			answered++
		case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
			silent++
		default:
			t.Fatalf("attempt: frame %v err %v", f, err)
		}
	}
	if answered != 5 || silent != 7 {
		t.Fatalf("answered %d, closed silently %d; want 5 and 7", answered, silent)
	}
	// Throttled connections never reach authentication.
	if got := edge.registerCount(); got != 5 {
		t.Errorf("%d Register calls; want 5 (an empty bucket is refused at accept)", got)
	}
	// A good node from another address is not slowed.
	p := dialFrom(t, "127.0.0.4", addr)
	if resp := p.register(ctx, testToken, 0); !resp.GetAccepted() {
		t.Fatalf("good node from another address: %+v", resp)
	}
}

func TestAdmissionBucketRefills(t *testing.T) {
	now := time.Unix(0, 0)
	a := newAdmission(Config{MaxPending: 10, MaxPendingPerAddr: 10, RegisterFailBurst: 2, RegisterFailRate: 0.5})
	a.now = func() time.Time { return now }
	// failed spends a token; it says false once the bucket is empty.
	first, second, third := a.failed("x"), a.failed("x"), a.failed("x")
	if !first || !second || third {
		t.Fatal("burst of 2 not enforced")
	}
	if a.enter("x") == "" {
		t.Fatal("an address with an empty bucket was admitted")
	}
	if a.enter("y") != "" {
		t.Fatal("another address was refused")
	}
	now = now.Add(2 * time.Second) // one token back
	if a.enter("x") != "" || !a.failed("x") || a.failed("x") {
		t.Fatal("refill at 0.5/s not applied")
	}
}

// flakyListener fails Accept with EMFILE until closed.
type flakyListener struct {
	net.Listener
	calls atomic.Int64
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.calls.Add(1)
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
}

func TestAcceptErrorsBackOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln}
	srv := NewServer("", testConfig(), newFakeEdge())
	srv.ln = fl
	srv.wg.Add(1)
	go srv.acceptLoop()
	time.Sleep(300 * time.Millisecond)
	stopServer(t, srv)
	// Backing off from 5 ms doubling makes about 7 attempts in 300 ms; a
	// spinning loop makes hundreds of thousands.
	if n := fl.calls.Load(); n > 50 {
		t.Fatalf("%d accept attempts in 300 ms: the loop spins on EMFILE", n)
	}
}
