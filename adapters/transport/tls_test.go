package transport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"iop/adapters/tlsca"
	"iop/domain"
)

// edgeCA is an auto-mode edge CA in a temp dir, as iop-edge makes it.
func edgeCA(t testing.TB, hosts ...string) *tlsca.Manager {
	t.Helper()
	if hosts == nil {
		hosts = []string{"127.0.0.1", "localhost"}
	}
	m, err := tlsca.Open(tlsca.Options{Dir: t.TempDir(), Hosts: hosts, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func tlsServerConfig(m *tlsca.Manager, clientCAs *x509.CertPool) Config {
	c := testConfig()
	c.TLS = NewServerTLS(m.GetCertificate, clientCAs)
	return c
}

func clientTLS(t testing.TB, o ClientTLS, addr string) *tls.Config {
	t.Helper()
	c, err := NewClientTLS(o, addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tlsPair is newPair over TLS; the client's TLS config is made once the
// server's address is known.
func tlsPair(t *testing.T, srv Config, o ClientTLS) *pair {
	t.Helper()
	ctx := testCtx(t)
	p := &pair{ctx: ctx, edge: newFakeEdge(), node: newFakeNode()}
	p.edge.addNode(testToken, testNodeConfig())
	p.srv = startServer(t, "", srv, p.edge)
	cc := ClientConfig{Addr: p.srv.Addr().String(), Token: testToken, Transport: testConfig()}
	cc.Transport.TLS = clientTLS(t, o, cc.Addr)
	p.cli = startClient(t, cc, p.node)
	p.reg = recv(t, ctx, p.edge.registered, "registration")
	p.link = p.reg.Link.(*edgeLink)
	return p
}

func TestTLSPinnedLinkRegistersAndRuns(t *testing.T) {
	m := edgeCA(t)
	p := tlsPair(t, tlsServerConfig(m, nil), ClientTLS{CAPin: m.Pin()})
	if !p.reg.Info.Peer.Encrypted || p.reg.Info.Peer.CertNames != nil {
		t.Fatalf("peer identity = %+v, want encrypted without a client certificate", p.reg.Info.Peer)
	}
	if p.reg.Token != testToken {
		t.Fatalf("token through TLS = %q", p.reg.Token)
	}
	rs, err := p.link.StartRun(p.ctx, runReq("r-tls"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	for {
		ev, err := rs.Recv(p.ctx)
		if err == io.EOF {
			break
		}
		mustf(t, err, "Recv")
		if ev.Type.Terminal() && ev.Type != domain.EventComplete {
			t.Fatalf("run over TLS ended %s", ev.Type)
		}
	}
}

// The pin may name any certificate of the chain: the CA (auto mode) or the leaf.
func TestTLSPinOfTheLeafIsAccepted(t *testing.T) {
	m := edgeCA(t)
	p := tlsPair(t, tlsServerConfig(m, nil), ClientTLS{CAPin: tlsca.Pin(m.Certificate().Leaf)})
	if !p.reg.Info.Peer.Encrypted {
		t.Fatal("not encrypted")
	}
}

func TestTLSWrongPinIsFatalAndNamesBothPins(t *testing.T) {
	m, other := edgeCA(t), edgeCA(t)
	e := newFakeEdge()
	e.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", tlsServerConfig(m, nil), e)
	cc := ClientConfig{Addr: srv.Addr().String(), Token: testToken, Transport: testConfig()}
	cc.Transport.TLS = clientTLS(t, ClientTLS{CAPin: other.Pin()}, cc.Addr)
	c := startClient(t, cc, newFakeNode())
	ctx := testCtx(t)
	select {
	case <-c.done:
	case <-ctx.Done():
		t.Fatal("client kept retrying with a wrong pin")
	}
	var te *TrustError
	var pm *PinMismatchError
	if !errors.As(c.err, &te) || !errors.As(c.err, &pm) {
		t.Fatalf("Run = %v, want a TrustError with a PinMismatchError", c.err)
	}
	if pm.Want != other.Pin() || pm.Seen != m.Pin() || !strings.Contains(c.err.Error(), other.Pin()) || !strings.Contains(c.err.Error(), m.Pin()) {
		t.Fatalf("error %q should name the expected pin %s and the seen %s", c.err, other.Pin(), m.Pin())
	}
	if e.registerCount() != 0 {
		t.Fatal("the token was sent to an edge that failed the pin")
	}
}

// An edge certificate that is not valid yet by the node's clock (the
// edge's clock was ahead when it issued it, or the node's is behind: a
// machine without a battery-backed clock before it syncs) is no man in the
// middle: the node says to check the clocks and retries, and gets in once
// the certificate is valid, instead of stopping for good.
func TestTLSCertificateOutsideItsValidityIsRetried(t *testing.T) {
	for _, trust := range []string{"ca_pin", "ca_file", "ca_pin_ca_ahead"} {
		t.Run(trust, func(t *testing.T) {
			// The CA is made with the right time; its server certificate
			// is then issued (for a new host) while the edge's clock is
			// ahead by more than the certificates' backdating. Or (ca_ahead)
			// the CA too is made then: the running edge must re-sign it.
			dir := t.TempDir()
			if trust != "ca_pin_ca_ahead" {
				if _, err := tlsca.Open(tlsca.Options{Dir: dir, Hosts: []string{"127.0.0.1"}, Logger: quietLogger()}); err != nil {
					t.Fatal(err)
				}
			}
			var skew atomic.Int64
			skew.Store(int64(tlsca.Backdate + 3*time.Hour))
			m, err := tlsca.Open(tlsca.Options{Dir: dir, Hosts: []string{"127.0.0.1", "localhost"}, Logger: quietLogger(),
				Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }})
			if err != nil {
				t.Fatal(err)
			}
			e := newFakeEdge()
			e.addNode(testToken, testNodeConfig())
			srv := startServer(t, "", tlsServerConfig(m, nil), e)
			var mu sync.Mutex
			var logs strings.Builder
			cc := ClientConfig{Addr: srv.Addr().String(), Token: testToken, Transport: testConfig()}
			cc.Transport.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return logs.Write(p)
			}), nil))
			o := ClientTLS{CAPin: m.Pin()}
			if trust == "ca_file" {
				o = ClientTLS{CAFile: filepath.Join(dir, tlsca.CACertFile)}
			}
			cc.Transport.TLS = clientTLS(t, o, cc.Addr)
			c := startClient(t, cc, newFakeNode())
			eventually(t, testCtx(t), "a retry naming the clocks", func() bool {
				mu.Lock()
				defer mu.Unlock()
				l := logs.String()
				return strings.Contains(l, "cannot connect to the edge; retrying") && strings.Contains(l, "not yet valid") && strings.Contains(l, "clock")
			})
			mu.Lock()
			if l := logs.String(); !strings.Contains(l, "is not valid until") || !strings.Contains(l, "the edge's clock was ahead when it made it") || strings.Contains(l, "has expired and must be replaced") {
				t.Errorf("the node's hint for a certificate not valid yet: %s", l)
			}
			mu.Unlock()
			select {
			case <-c.done:
				t.Fatalf("the node stopped for good: %v", c.err)
			default:
			}
			if e.registerCount() != 0 {
				t.Fatal("the token was sent over a connection that failed verification")
			}

			// The edge's clock is set right: its next check re-issues the
			// certificate (and re-signs the CA, for the same key).
			skew.Store(0)
			if renewed, err := m.Renew(); err != nil || !renewed {
				t.Fatalf("Renew = %v, %v; want a new certificate", renewed, err)
			}
			recv(t, testCtx(t), e.registered, "registration once the certificate is valid")
		})
	}
}

// Only a chain that holds but for the time is retried: an expired
// certificate that the pinned key did not sign, presented with the edge's
// (public) CA certificate, is still fatal.
func TestTLSExpiredForgeryIsFatal(t *testing.T) {
	m := edgeCA(t)
	other := newClientCA(t) // any key but the edge CA's
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "iop edge"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, other.cert, &key.PublicKey, other.key)
	if err != nil {
		t.Fatal(err)
	}
	forged := &tls.Certificate{Certificate: [][]byte{der, m.CA().Raw}, PrivateKey: key}
	srvCfg := testConfig()
	srvCfg.TLS = NewServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return forged, nil }, nil)
	e := newFakeEdge()
	e.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", srvCfg, e)
	cc := ClientConfig{Addr: srv.Addr().String(), Token: testToken, Transport: testConfig()}
	cc.Transport.TLS = clientTLS(t, ClientTLS{CAPin: m.Pin()}, cc.Addr)
	c := startClient(t, cc, newFakeNode())
	select {
	case <-c.done:
	case <-testCtx(t).Done():
		t.Fatal("the node kept retrying a forged certificate")
	}
	var te *TrustError
	if !errors.As(c.err, &te) || !te.Fatal() || errors.As(c.err, new(*ValidityError)) {
		t.Fatalf("Run = %v, want a fatal TrustError that is no ValidityError", c.err)
	}
	if e.registerCount() != 0 {
		t.Fatal("the token was sent to a forged certificate")
	}
}

// caFileNodeStops starts a TLS edge serving edge's certificate and a node
// whose --ca-file (written to caFile) holds trusted's CA, and returns the
// node once its Run has returned; it fails with hung if the node keeps
// retrying instead.
func caFileNodeStops(t *testing.T, edge, trusted *tlsca.Manager, caFile, hung string) (*runningClient, *fakeEdge) {
	t.Helper()
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: trusted.CA().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newFakeEdge()
	e.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", tlsServerConfig(edge, nil), e)
	cc := ClientConfig{Addr: srv.Addr().String(), Token: testToken, Transport: testConfig()}
	cc.Transport.TLS = clientTLS(t, ClientTLS{CAFile: caFile}, cc.Addr)
	c := startClient(t, cc, newFakeNode())
	select {
	case <-c.done:
	case <-testCtx(t).Done():
		t.Fatal(hung)
	}
	return c, e
}

func TestTLSCAFileVerifiesHostName(t *testing.T) {
	m := edgeCA(t, "edge.example.test") // 127.0.0.1 is not in the certificate
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	c, _ := caFileNodeStops(t, m, m, caFile, "client kept retrying against a certificate for another host")
	var te *TrustError
	if !errors.As(c.err, &te) || !strings.Contains(c.err.Error(), "transport.tls.hosts") || !strings.Contains(c.err.Error(), "mode files, the certificate in cert_file must name it") {
		t.Fatalf("Run = %v, want a TrustError with the transport.tls.hosts hint (auto mode) and the cert_file one (files mode, where hosts is refused)", c.err)
	}

	// With the right name in the certificate the same CA file works.
	m2 := edgeCA(t, "127.0.0.1")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: m2.CA().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsPair(t, tlsServerConfig(m2, nil), ClientTLS{CAFile: caFile})
}

func TestTLSEdgeRefusesPlaintextClientWithTLSReason(t *testing.T) {
	m := edgeCA(t)
	e := newFakeEdge()
	e.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", tlsServerConfig(m, nil), e)
	cc := ClientConfig{Addr: srv.Addr().String(), Token: testToken, Transport: testConfig()}
	var lost []string
	var mu sync.Mutex
	cc.Transport.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		lost = append(lost, string(p))
		return len(p), nil
	}), nil))
	startClient(t, cc, newFakeNode()) // plaintext
	f := recv(t, testCtx(t), e.failed, "handshake failure")
	if !strings.HasPrefix(f.Reason, "tls: not a TLS client") {
		t.Fatalf("reason %q, want it to start with \"tls: not a TLS client\"", f.Reason)
	}
	if e.registerCount() != 0 {
		t.Fatal("a plaintext client reached Register on a TLS edge")
	}
	// The plaintext node is told what to change.
	eventually(t, testCtx(t), "the --ca-pin hint in the node's log", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(strings.Join(lost, ""), "instead of --insecure")
	})
}

// The other way round: a node given --ca-pin dials an edge whose link is
// plaintext (mode off). The edge reports a TLS client, naming --insecure,
// and answers in plaintext, so the node's TLS client says that what
// answered does not speak TLS, with the hint to match the edge's mode,
// instead of a bare "connection reset by peer".
func TestTLSNodeOnPlaintextEdgeIsToldToMatchItsMode(t *testing.T) {
	e := newFakeEdge()
	e.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", testConfig(), e)
	var mu sync.Mutex
	var logs strings.Builder
	cc := ClientConfig{Addr: srv.Addr().String(), Token: testToken, Transport: testConfig()}
	cc.Transport.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	cc.Transport.TLS = clientTLS(t, ClientTLS{CAPin: edgeCA(t).Pin()}, cc.Addr)
	startClient(t, cc, newFakeNode())
	f := recv(t, testCtx(t), e.failed, "handshake failure")
	if !strings.Contains(f.Reason, "a TLS client on a plaintext node link") || !strings.Contains(f.Reason, "--insecure") {
		t.Fatalf("edge's reason %q, want it to name a TLS client and --insecure", f.Reason)
	}
	eventually(t, testCtx(t), "the node's hint to match the edge's mode", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "does its transport.tls.mode match --insecure or --ca-pin/--ca-file?")
	})
	if e.registerCount() != 0 {
		t.Fatal("a TLS ClientHello reached Register")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// clientCA makes a CA for node certificates and issues certificates from it.
type clientCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newClientCA(t testing.TB) *clientCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nodes CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return &clientCA{cert: c, key: key, pool: pool}
}

// issue writes a client certificate for cn (plus dns SANs) and returns its files.
func (ca *clientCA) issue(t testing.TB, cn string, dns ...string) (certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "node.pem"), filepath.Join(dir, "node.key")
	ca.write(t, certFile, keyFile, time.Now().Add(time.Hour), cn, dns...)
	return certFile, keyFile
}

// write issues a client certificate for cn (plus dns SANs) ending at
// notAfter into certFile and keyFile, replacing each by a rename.
func (ca *clientCA) write(t testing.TB, certFile, keyFile string, notAfter time.Time, cn string, dns ...string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		NotBefore: notAfter.Add(-2 * time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalPKCS8PrivateKey(key)
	for file, data := range map[string][]byte{
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}),
		certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	} {
		if err := os.WriteFile(file+".tmp", data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTLSClientCertificates(t *testing.T) {
	m, ca := edgeCA(t), newClientCA(t)
	srvCfg := tlsServerConfig(m, ca.pool)

	t.Run("certificate from the client CA", func(t *testing.T) {
		cert, key := ca.issue(t, "node-a", "node-a.example.test")
		p := tlsPair(t, srvCfg, ClientTLS{CAPin: m.Pin(), CertFile: cert, KeyFile: key})
		if got := p.reg.Info.Peer.CertNames; len(got) != 2 || got[0] != "node-a" || got[1] != "node-a.example.test" {
			t.Fatalf("verified names = %v, want the CN then the DNS SAN", got)
		}
	})
	// The node is told it is its own certificate the edge refused, and
	// what to pass: crypto/tls's "remote error: tls: unknown certificate
	// authority" reads as though the node did not trust the edge.
	for name, tc := range map[string]struct {
		o    func() ClientTLS
		hint string
	}{
		"no certificate": {func() ClientTLS { return ClientTLS{CAPin: m.Pin()} }, "start this node with --cert and --key"},
		"certificate from another CA": {func() ClientTLS {
			cert, key := newClientCA(t).issue(t, "node-a")
			return ClientTLS{CAPin: m.Pin(), CertFile: cert, KeyFile: key}
		}, "the edge refused this node's client certificate"},
	} {
		t.Run(name, func(t *testing.T) {
			e := newFakeEdge()
			e.addNode(testToken, testNodeConfig())
			srv := startServer(t, "", srvCfg, e)
			var mu sync.Mutex
			var logs strings.Builder
			cc := ClientConfig{Addr: srv.Addr().String(), Token: testToken, Transport: testConfig()}
			cc.Transport.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return logs.Write(p)
			}), nil))
			cc.Transport.TLS = clientTLS(t, tc.o(), cc.Addr)
			startClient(t, cc, newFakeNode())
			f := recv(t, testCtx(t), e.failed, "handshake failure")
			if !strings.HasPrefix(f.Reason, "tls: ") {
				t.Fatalf("reason %q, want a tls reason", f.Reason)
			}
			eventually(t, testCtx(t), "the node's hint: "+tc.hint, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return strings.Contains(logs.String(), tc.hint)
			})
			if e.registerCount() != 0 {
				t.Fatal("a node without an acceptable certificate reached Register")
			}
		})
	}
}

// A node reads its client certificate at every connection attempt: one
// that has expired is reported by file and date, not sent, and retried;
// renewed in place (as short-lived certificates are), it is used at the next
// attempt without a restart. Read only at start, the expired one was offered
// for ever and the node never got back in.
func TestTLSClientCertificateRenewedInPlace(t *testing.T) {
	m, ca := edgeCA(t), newClientCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "node.pem"), filepath.Join(dir, "node.key")
	ca.write(t, certFile, keyFile, time.Now().Add(-time.Minute), "node-a")

	e := newFakeEdge()
	e.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", tlsServerConfig(m, ca.pool), e)
	var mu sync.Mutex
	var logs strings.Builder
	cc := ClientConfig{Addr: srv.Addr().String(), Token: testToken, Transport: testConfig()}
	cc.Transport.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	cc.Transport.TLS = clientTLS(t, ClientTLS{CAPin: m.Pin(), CertFile: certFile, KeyFile: keyFile}, cc.Addr)
	c := startClient(t, cc, newFakeNode())
	eventually(t, testCtx(t), "the node naming its expired certificate", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "client certificate "+certFile+" expired on")
	})

	ca.write(t, certFile, keyFile, time.Now().Add(time.Hour), "node-a")
	reg := recv(t, testCtx(t), e.registered, "registration with the renewed certificate")
	if got := reg.Info.Peer.CertNames; len(got) != 1 || got[0] != "node-a" {
		t.Fatalf("verified names = %v, want [node-a]", got)
	}
	select {
	case <-c.done:
		t.Fatalf("client stopped: %v", c.err)
	default:
	}
}

func TestTLSReportsAreRateLimited(t *testing.T) {
	var l reportLimiter
	now := time.Unix(1000, 0)
	reported := 0
	for range 100 {
		if _, ok := l.allow(now); ok {
			reported++
		}
	}
	if reported != tlsReportBurst {
		t.Fatalf("%d of 100 simultaneous failures reported, want the burst of %d", reported, tlsReportBurst)
	}
	n, ok := l.allow(now.Add(tlsReportEvery))
	if !ok || n != 100-tlsReportBurst {
		t.Fatalf("after one interval: allow = %d, %v; want a report counting the %d skipped", n, ok, 100-tlsReportBurst)
	}
	if _, ok := l.allow(now.Add(tlsReportEvery)); ok {
		t.Fatal("a second report in the same interval after the burst")
	}
}

// A flood of plaintext clients reaches HandshakeFailed at most a burst's
// worth; the rest are counted through HandshakeFailedUnreported.
func TestTLSPlaintextFloodIsNotReportedOneByOne(t *testing.T) {
	m := edgeCA(t)
	e := newFakeEdge()
	srv := startServer(t, "", tlsServerConfig(m, nil), e)
	const n = 60
	for range n {
		p := dialRaw(t, srv.Addr().String())
		_, _ = p.nc.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		_, _ = io.Copy(io.Discard, p.nc) // until the edge closes it
	}
	// The edge closes a connection before it reports it: the last reports
	// may still be on their way. Each is either reported or counted
	// unreported (iop_node_registrations_total would read low exactly
	// during a flood), so the two add up to n once all are in.
	reported := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.failures)
	}
	eventually(t, testCtx(t), fmt.Sprintf("all %d failures reported or counted", n), func() bool {
		return reported()+int(e.unreported.Load()) >= n
	})
	got, quiet := reported(), e.unreported.Load()
	if got == 0 || got >= n/2 {
		t.Fatalf("%d reports for %d plaintext connections, want a rate-limited handful", got, n)
	}
	if int(quiet)+got != n {
		t.Fatalf("%d reported and %d counted unreported, want all %d failures counted", got, quiet, n)
	}
}

// A failed TLS handshake (here plaintext garbage) is charged to the remote
// address like a wrong token: past the burst the address is closed at
// accept, before any handshake work, while another address still gets in.
func TestTLSGarbageChargesTheAddressBudget(t *testing.T) {
	ctx := testCtx(t)
	m := edgeCA(t)
	cfg := tlsServerConfig(m, nil)
	cfg.RegisterFailBurst = 3
	cfg.RegisterFailRate = 0.001 // no refill within the test
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", cfg, edge)
	addr := srv.Addr().String()

	var reasons []string
	for range 8 {
		p := dialFrom(t, "127.0.0.5", addr)
		// Not HTTP: a browser's request (which any web page can send from
		// the operator's address) is not charged
		// (TestBrowserRequestsDoNotChargeATLSAddressBudget).
		if _, err := p.nc.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n")); err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("write: %v", err)
		}
		if !closedByEdge(ctx, p) {
			t.Fatal("plaintext connection to a TLS edge not closed")
		}
		reasons = append(reasons, recv(t, ctx, edge.failed, "handshake failure").Reason)
	}
	tlsTried := 0
	for _, r := range reasons {
		switch {
		case strings.HasPrefix(r, "tls: "):
			tlsTried++
		case !strings.HasPrefix(r, "throttled"):
			t.Fatalf("reason %q", r)
		}
	}
	if tlsTried != 3 || !strings.HasPrefix(reasons[3], "throttled") {
		t.Fatalf("reasons %q; want 3 TLS failures (the burst), then the address throttled at accept", reasons)
	}
	// A pinned node from another address registers.
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.6")}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(nc, clientTLS(t, ClientTLS{CAPin: m.Pin()}, addr))
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatalf("pinned handshake from another address: %v", err)
	}
	if resp := newRawPeer(t, tc).register(ctx, testToken, 0); !resp.GetAccepted() {
		t.Fatalf("good node from another address: %+v", resp)
	}
}

// A ClientHello inside an established TLS connection (a proxy that
// re-encrypts, a client that wraps twice) on a TLS edge is not the
// plaintext-edge case: the edge must not say its mode is off, nor answer
// with the hint to start the node with --insecure.
func TestTLSInsideTLSIsNotReportedAsAPlaintextEdge(t *testing.T) {
	ctx := testCtx(t)
	m := edgeCA(t)
	e := newFakeEdge()
	e.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", tlsServerConfig(m, nil), e)
	addr := srv.Addr().String()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	outer := tls.Client(nc, clientTLS(t, ClientTLS{CAPin: m.Pin()}, addr))
	_ = outer.SetDeadline(time.Now().Add(5 * time.Second))
	if err := outer.Handshake(); err != nil {
		t.Fatal(err)
	}
	inner := tls.Client(outer, clientTLS(t, ClientTLS{CAPin: m.Pin()}, addr))
	_ = inner.SetDeadline(time.Now().Add(5 * time.Second))
	if err := inner.Handshake(); err == nil {
		t.Fatal("a TLS handshake inside TLS succeeded")
	}
	r := recv(t, ctx, e.failed, "handshake failure").Reason
	if strings.Contains(r, "mode is off") || strings.Contains(r, "--insecure") {
		t.Fatalf("TLS inside TLS on a TLS edge reported as %q", r)
	}
	if e.registerCount() != 0 {
		t.Fatal("a ClientHello reached Register")
	}
}

// The node's hint tells an expired certificate from one not valid yet.
func TestTimeHintTellsExpiredFromNotValidYet(t *testing.T) {
	now := time.Now()
	ca := newClientCA(t)
	for _, c := range []struct {
		name       string
		from, to   time.Time
		want, lack string
	}{
		{"expired", now.Add(-48 * time.Hour), now.Add(-24 * time.Hour), "has expired and must be replaced", "not valid until"},
		{"not yet valid", now.Add(24 * time.Hour), now.Add(48 * time.Hour), "not valid until " + now.Add(24*time.Hour).UTC().Format(time.RFC3339), "has expired and must be replaced"},
	} {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(3), NotBefore: c.from, NotAfter: c.to}, ca.cert, &key.PublicKey, ca.key)
		if err != nil {
			t.Fatal(err)
		}
		leaf, _ := x509.ParseCertificate(der)
		_, err = leaf.Verify(x509.VerifyOptions{Roots: ca.pool})
		if err == nil {
			t.Fatalf("%s: verified", c.name)
		}
		msg := (&TrustError{Err: &ValidityError{Err: err}}).Error()
		if !strings.Contains(msg, c.want) || strings.Contains(msg, c.lack) {
			t.Errorf("%s: %q, want %q and not %q", c.name, msg, c.want, c.lack)
		}
	}
}

// A --ca-file from another CA than the edge's stops the node, naming the
// file and what to do, rather than with crypto/tls's bare "certificate
// signed by unknown authority"; the token is never sent.
func TestTLSCAFileOfAnotherCAIsFatalAndNamesTheFile(t *testing.T) {
	m, other := edgeCA(t), edgeCA(t)
	caFile := filepath.Join(t.TempDir(), "other-ca.pem")
	c, e := caFileNodeStops(t, m, other, caFile, "the node kept retrying an edge its CA file does not trust")
	var te *TrustError
	if !errors.As(c.err, &te) || !te.Fatal() {
		t.Fatalf("Run = %v, want a fatal TrustError", c.err)
	}
	if msg := c.err.Error(); !strings.Contains(msg, "not signed by a CA in --ca-file "+caFile) || !strings.Contains(msg, "--print-ca-pin") {
		t.Fatalf("error %q should name the CA file and the way to the right trust", msg)
	}
	if e.registerCount() != 0 {
		t.Fatal("the token was sent to an edge the CA file does not trust")
	}
}

// A client certificate and key that do not go together stop the node at
// start naming both files: crypto/tls's "private key does not match public
// key" names neither.
func TestTLSMismatchedClientKeyNamesTheFiles(t *testing.T) {
	ca := newClientCA(t)
	cert, _ := ca.issue(t, "node-a")
	_, otherKey := ca.issue(t, "node-b")
	_, err := NewClientTLS(ClientTLS{CAPin: edgeCA(t).Pin(), CertFile: cert, KeyFile: otherKey}, "127.0.0.1:7700")
	if err == nil || !strings.Contains(err.Error(), cert) || !strings.Contains(err.Error(), otherKey) || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("NewClientTLS = %v, want an error naming %s and %s", err, cert, otherKey)
	}
	if _, err := loadClientCert(cert, otherKey, time.Now()); err == nil || !strings.Contains(err.Error(), otherKey) {
		t.Fatalf("loadClientCert = %v, want an error naming %s", err, otherKey)
	}
}
