package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"iop/adapters/internal/connquota"
	"iop/domain"
	"iop/ports"
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
		_, n := srv.adm.counts("127.0.0.2")
		return n == 2
	})
	again := dialFrom(t, "127.0.0.2", addr)
	if resp := again.register(ctx, testToken, 0); !resp.GetAccepted() {
		t.Fatalf("register after a slot was freed: %+v", resp)
	}
}

// admitted waits until the server counts n unregistered connections.
func admitted(tb testing.TB, ctx context.Context, srv *Server, n int) {
	tb.Helper()
	eventually(tb, ctx, fmt.Sprintf("%d connections admitted", n), func() bool {
		total, _ := srv.adm.counts("")
		return total == n
	})
}

// At the total cap a newcomer from the address holding the most
// unregistered connections is refused; one from another address takes the
// place of that address's oldest connection.
func TestUnregisteredConnsCappedInTotal(t *testing.T) {
	ctx := testCtx(t)
	cfg := testConfig()
	cfg.MaxPending = 4
	edge := newFakeEdge()
	srv := startServer(t, "", cfg, edge)
	addr := srv.Addr().String()
	var idle []*rawPeer
	for range 3 {
		idle = append(idle, dialFrom(t, "127.0.0.2", addr))
	}
	other := dialFrom(t, "127.0.0.3", addr)
	admitted(t, ctx, srv, 4)
	if !closedByEdge(ctx, dialFrom(t, "127.0.0.2", addr)) {
		t.Fatal("a connection past the total cap from the largest holder was not closed at once")
	}
	if f := recv(t, ctx, edge.failed, "refusal"); f.Reason != "refused: too many unregistered connections" {
		t.Errorf("refusal reason %q", f.Reason)
	}
	newcomer := dialFrom(t, "127.0.0.4", addr)
	if !closedByEdge(ctx, idle[0]) {
		t.Fatal("the largest holder's oldest connection was not closed to make room")
	}
	f := recv(t, ctx, edge.failed, "eviction")
	if !strings.HasPrefix(f.Reason, "closed to make room") || f.Remote != idle[0].nc.LocalAddr().String() {
		t.Errorf("eviction reported as %+v", f)
	}
	for i, p := range append(idle[1:], other, newcomer) {
		if !stillOpen(p) {
			t.Errorf("connection %d was closed", i)
		}
	}
	// The edge closed it: its address is not charged a failed registration.
	srv.adm.mu.Lock()
	charged := srv.adm.fails["127.0.0.2"] != nil
	srv.adm.mu.Unlock()
	if charged {
		t.Error("the evicted connection's address was charged a failed registration")
	}
	select {
	case f := <-edge.failed:
		t.Errorf("a second report: %+v", f)
	default:
	}
}

// The reviewer's lock-out: 512 idle sockets from each of 8 addresses filled
// the 4,096 unregistered connections the edge allows in total, and every
// new connection, a real node's included, was closed at accept for as
// long as the sockets were kept open. Now the node takes one of their
// places and registers at once, over TLS (the edge's default) or not.
func TestIdleSocketsFromFewAddressesDoNotLockNodesOut(t *testing.T) {
	for _, secure := range []bool{true, false} {
		t.Run(fmt.Sprint("tls=", secure), func(t *testing.T) {
			ctx := testCtx(t)
			cfg, cc := testConfig(), ClientConfig{Token: testToken}
			if secure {
				m := edgeCA(t)
				cfg = tlsServerConfig(m, nil)
				cc.Transport = testConfig()
				cc.Transport.TLS = clientTLS(t, ClientTLS{CAPin: m.Pin()}, "127.0.0.1:1")
			}
			cfg.HandshakeTimeout = time.Minute // the idle sockets outlive the test
			d := DefaultConfig()
			if cfg.MaxPending != 0 || cfg.MaxPendingPerAddr != 0 || d.MaxPending != 8*d.MaxPendingPerAddr {
				t.Fatalf("the scenario needs the defaults: 8 × %d fill %d", d.MaxPendingPerAddr, d.MaxPending)
			}
			edge := newFakeEdge()
			edge.addNode(testToken, testNodeConfig())
			srv := startServer(t, "", cfg, uncountedFailures{edge})
			cc.Addr = srv.Addr().String()
			for i := range d.MaxPending {
				local := "127.0.0." + strconv.Itoa(2+i/d.MaxPendingPerAddr)
				dl := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
				nc, err := dl.Dial("tcp", cc.Addr)
				if err != nil {
					t.Fatalf("idle socket %d from %s: %v", i, local, err)
				}
				t.Cleanup(func() { _ = nc.Close() })
			}
			admitted(t, ctx, srv, d.MaxPending)

			registered := make(chan string, 1)
			cc.OnRegistered = func(id string) { registered <- id }
			start := time.Now()
			startClient(t, cc, newFakeNode())
			recv(t, ctx, registered, "registration of a real node while 8 addresses fill the unregistered cap")
			t.Logf("registered %v after the client started", time.Since(start).Round(time.Millisecond))
			// One idle socket made room, the others are still waiting.
			admitted(t, ctx, srv, d.MaxPending-1)
		})
	}
}

// uncountedFailures drops handshake failure reports: thousands of sockets
// closed at the end of a test would fill fakeEdge's channel and block.
type uncountedFailures struct{ *fakeEdge }

func (uncountedFailures) HandshakeFailed(string, string) {}
func (uncountedFailures) HandshakeFailedUnreported()     {}

// A connection whose register frame has arrived is being authenticated:
// it is not closed to make room, even when its address holds the most.
func TestAuthenticatingConnNotEvicted(t *testing.T) {
	ctx := testCtx(t)
	cfg := testConfig()
	cfg.MaxPending = 3
	edge := &gatedEdge{fakeEdge: newFakeEdge(), entered: make(chan struct{}, 1), gate: make(chan struct{})}
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", cfg, edge)
	open := sync.OnceFunc(func() { close(edge.gate) })
	t.Cleanup(open) // before the server stops, should the test fail first
	addr := srv.Addr().String()

	// The oldest connection of 127.0.0.2 is in Register, held there.
	node := dialFrom(t, "127.0.0.2", addr)
	node.write(&ioppb.Frame{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: &ioppb.RegisterRequest{Token: testToken}}})
	recv(t, ctx, edge.entered, "Register call")
	idle1, idle2 := dialFrom(t, "127.0.0.2", addr), dialFrom(t, "127.0.0.2", addr)
	admitted(t, ctx, srv, 3)

	newcomer := dialFrom(t, "127.0.0.3", addr)
	if !closedByEdge(ctx, idle1) {
		t.Fatal("the oldest idle connection was not closed to make room")
	}
	if !stillOpen(idle2) || !stillOpen(newcomer) {
		t.Fatal("a connection other than the oldest idle one was closed")
	}
	open()
	f := node.readUntil(ctx, "register response", func(f *ioppb.Frame) bool { return f.GetRegisterResponse() != nil })
	if !f.GetRegisterResponse().GetAccepted() {
		t.Fatalf("the authenticating node was not registered: %+v", f.GetRegisterResponse())
	}
}

// gatedEdge holds every Register call until gate is closed.
type gatedEdge struct {
	*fakeEdge
	entered chan struct{}
	gate    chan struct{}
}

func (e *gatedEdge) Register(ctx context.Context, token string, info domain.NodeInfo, remote string, link ports.NodeLink) (domain.NodeConfig, error) {
	select {
	case e.entered <- struct{}{}:
	default:
	}
	<-e.gate
	return e.fakeEdge.Register(ctx, token, info, remote, link)
}

// The admission policy on its own, with the keys IPv6 peers get: every
// address of one /64 shares a per-prefix cap and a failure bucket.
func TestAdmissionPolicy(t *testing.T) {
	a := newAdmission(Config{MaxPending: 5, MaxPendingPerAddr: 3, RegisterFailBurst: 1, RegisterFailRate: 0.001})
	enter := func(remote string) (*ticket, net.Conn, string) {
		return a.enter(connquota.Key(remote), &namedConn{name: remote})
	}
	mustEnter := func(remote, wantVictim string) *ticket {
		t.Helper()
		tk, victim, why := enter(remote)
		if why != "" {
			t.Fatalf("%s refused: %s", remote, why)
		}
		if got := fmt.Sprint(victim); victim != nil && got != wantVictim || victim == nil && wantVictim != "" {
			t.Fatalf("%s evicted %v; want %q", remote, victim, wantVictim)
		}
		return tk
	}
	const overAddr, overTotal = "refused: too many unregistered connections from this address", "refused: too many unregistered connections"
	// Three hosts of one /64 are one prefix: a fourth is over its cap.
	a1 := mustEnter("[2001:db8:0:1::1]:1000", "")
	a2 := mustEnter("[2001:db8:0:1:ffff::2]:1000", "")
	a3 := mustEnter("[2001:db8:0:1::3]:1000", "")
	if _, _, why := enter("[2001:db8:0:1::4]:1000"); why != overAddr {
		t.Fatalf("a fourth connection from one /64: %q", why)
	}
	// Another /64 fills the total; holding fewer, it takes A's oldest.
	mustEnter("[2001:db8:0:2::1]:1000", "")
	mustEnter("[2001:db8:0:2::1]:1001", "")
	mustEnter("[2001:db8:0:2::9]:1000", "[2001:db8:0:1::1]:1000")
	if !a.evicted(a1) || a.authenticating(a1) {
		t.Fatal("the victim's handshake was not told it was evicted")
	}
	a.leave(a1) // its goroutine ends: nothing changes
	if total, n := a.counts("2001:db8:0:1::/64"); total != 5 || n != 2 {
		t.Fatalf("after the eviction: total %d, first /64 %d; want 5 and 2", total, n)
	}
	// B now holds the most (3 to A's 2, and its cap): an IPv4 newcomer
	// takes B's oldest.
	if _, _, why := enter("[2001:db8:0:2::7]:1"); why != overAddr {
		t.Fatalf("a newcomer from a prefix at its cap: %q", why)
	}
	mustEnter("192.0.2.1:1000", "[2001:db8:0:2::1]:1000")
	// A and B are tied at 2: neither may take the other's place.
	if _, _, why := enter("[2001:db8:0:1::5]:1"); why != overTotal {
		t.Fatalf("a newcomer from a prefix tied for the most: %q", why)
	}
	// A's two are authenticating: B's oldest goes, though A holds as many.
	if !a.authenticating(a2) || !a.authenticating(a3) {
		t.Fatal("authenticating a live connection failed")
	}
	mustEnter("192.0.2.2:1000", "[2001:db8:0:2::1]:1001")
	// One failure from one host of a /64 throttles its neighbour too.
	a.failed(connquota.Key("[2001:db8:0:3::1]:1"))
	if _, _, why := enter("[2001:db8:0:3::abcd]:1"); !strings.HasPrefix(why, "throttled") {
		t.Fatalf("a neighbour of a throttled host: %q", why)
	}
}

// namedConn is a net.Conn that only has a name (admission never uses it
// but to hand it back as a victim).
type namedConn struct {
	net.Conn
	name string
}

func (c *namedConn) String() string { return c.name }

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
		total, _ := srv.adm.counts("")
		return total == n
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
	if _, _, why := a.enter("x", nil); why == "" {
		t.Fatal("an address with an empty bucket was admitted")
	}
	if _, _, why := a.enter("y", nil); why != "" {
		t.Fatal("another address was refused")
	}
	now = now.Add(2 * time.Second) // one token back
	if _, _, why := a.enter("x", nil); why != "" || !a.failed("x") || a.failed("x") {
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
