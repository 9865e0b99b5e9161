package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	ioppb "iop/proto/iop"
)

// browserRequest is what a browser sends when a web page of any origin
// fetches the transport port (a no-cors POST, a CORS preflight, a WebSocket,
// ...): a request line and a browser's headers.
func browserRequest(method string) string {
	return method + " / HTTP/1.1\r\nHost: 127.0.0.1:7700\r\nConnection: keep-alive\r\n" +
		"User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36\r\n" +
		"Accept: */*\r\nOrigin: https://any-page.example\r\nSec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: no-cors\r\n" +
		"Referer: https://any-page.example/\r\nAccept-Encoding: gzip, deflate, br, zstd\r\nAccept-Language: en-US,en;q=0.9\r\n" +
		"Content-Type: text/plain;charset=UTF-8\r\nContent-Length: 1\r\n\r\nx"
}

// stunAllocate is what a WebRTC client sends first to a TURN server over
// TCP (turn:host:port?transport=tcp), which a web page can name: a STUN
// Allocate request with REQUESTED-TRANSPORT (UDP).
var stunAllocate = "\x00\x03\x00\x08\x21\x12\xa4\x42" + "0123456789ab" + "\x00\x19\x00\x04\x11\x00\x00\x00"

var browserMethods = []string{"POST", "GET", "OPTIONS", "HEAD", "PUT", "DELETE", "PATCH", "POST"}

// sendAndWaitClosed writes b on nc and waits until the edge closes it.
func sendAndWaitClosed(t *testing.T, ctx context.Context, p *rawPeer, b string) {
	t.Helper()
	if _, err := p.nc.Write([]byte(b)); err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write: %v", err)
	}
	if !closedByEdge(ctx, p) {
		t.Fatal("an HTTP request to the transport port was not closed")
	}
}

// A web page can make the operator's browser send HTTP requests to the
// transport port, from the address a node on the same machine (or behind
// the same NAT) registers from. They must not use up that address's budget
// of failed registrations; garbage that is not HTTP still does.
func TestHTTPRequestsDoNotChargeTheAddressBudget(t *testing.T) {
	ctx := testCtx(t)
	cfg := testConfig()
	cfg.RegisterFailBurst = 3
	cfg.RegisterFailRate = 0.001 // no refill within the test
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", cfg, edge)
	addr := srv.Addr().String()

	var reasons []string
	for _, m := range browserMethods {
		sendAndWaitClosed(t, ctx, dialFrom(t, "127.0.0.7", addr), browserRequest(m))
		reasons = append(reasons, recv(t, ctx, edge.failed, "handshake failure").Reason)
	}
	for range 4 {
		sendAndWaitClosed(t, ctx, dialFrom(t, "127.0.0.7", addr), stunAllocate)
		reasons = append(reasons, recv(t, ctx, edge.failed, "handshake failure").Reason)
	}
	p := dialFrom(t, "127.0.0.7", addr)
	p.write(&ioppb.Frame{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: &ioppb.RegisterRequest{Token: testToken}}})
	if f, err := p.read(ctx); err != nil || !f.GetRegisterResponse().GetAccepted() {
		t.Fatalf("node after %d HTTP and STUN requests from its address: frame %v, err %v (reasons %q)", len(reasons), f, err, reasons)
	}
	for i, r := range reasons {
		if want := map[bool]string{true: "an HTTP request", false: "a STUN request"}[i < len(browserMethods)]; !strings.Contains(r, want) || !strings.Contains(r, "not charged") {
			t.Fatalf("reason %q, want %q", r, want)
		}
	}

	// Garbage that is not HTTP (here an SSH client's banner) is charged:
	// the burst, then the address is closed at accept.
	reasons = nil
	for range 4 {
		sendAndWaitClosed(t, ctx, dialFrom(t, "127.0.0.7", addr), "SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n"+strings.Repeat("\x00\x01garbage", 20))
		reasons = append(reasons, recv(t, ctx, edge.failed, "handshake failure").Reason)
	}
	if !strings.HasPrefix(reasons[3], "throttled") || strings.HasPrefix(reasons[2], "throttled") {
		t.Fatalf("reasons %q; want 3 charged failures, then the address throttled", reasons)
	}
}

// The same over TLS: plain HTTP to the TLS port (http://edge:7700), an
// https:// request whose browser refuses the edge's certificate (it does not
// trust the edge's CA), and HTTP inside TLS from a browser that does.
func TestBrowserRequestsDoNotChargeATLSAddressBudget(t *testing.T) {
	ctx := testCtx(t)
	m := edgeCA(t)
	cfg := tlsServerConfig(m, nil)
	cfg.RegisterFailBurst = 3
	cfg.RegisterFailRate = 0.001
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", cfg, edge)
	addr := srv.Addr().String()

	for _, first := range []string{browserRequest("POST"), browserRequest("GET"), browserRequest("OPTIONS"), browserRequest("DELETE"), stunAllocate} {
		sendAndWaitClosed(t, ctx, dialFrom(t, "127.0.0.8", addr), first)
		if r := recv(t, ctx, edge.failed, "handshake failure").Reason; !strings.HasPrefix(r, "tls: ") || !strings.Contains(r, "not charged") {
			t.Fatalf("%.8q to the TLS port: reason %q", first, r)
		}
	}
	dialTLS := func(c *tls.Config) (*tls.Conn, error) {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.8")}}
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nc.Close() })
		tc := tls.Client(nc, c)
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		return tc, tc.Handshake()
	}
	for range 4 {
		// A browser's https:// fetch: the edge's CA is not among its roots,
		// so it refuses the certificate and sends an alert.
		_, err := dialTLS(&tls.Config{ServerName: "127.0.0.1", RootCAs: x509.NewCertPool(), NextProtos: []string{"h2", "http/1.1"}})
		var cv *tls.CertificateVerificationError
		if !errors.As(err, &cv) {
			t.Fatalf("untrusting client: %v", err)
		}
		if r := recv(t, ctx, edge.failed, "handshake failure").Reason; !strings.Contains(r, "remote error") {
			t.Fatalf("refused certificate: reason %q", r)
		}
	}
	for range 2 {
		// A browser that trusts the edge's CA sends its request inside TLS.
		tc, err := dialTLS(clientTLS(t, ClientTLS{CAPin: m.Pin()}, addr))
		if err != nil {
			t.Fatal(err)
		}
		sendAndWaitClosed(t, ctx, newRawPeer(t, tc), browserRequest("POST"))
		if r := recv(t, ctx, edge.failed, "handshake failure").Reason; !strings.Contains(r, "an HTTP request") {
			t.Fatalf("HTTP inside TLS: reason %q", r)
		}
	}
	tc, err := dialTLS(clientTLS(t, ClientTLS{CAPin: m.Pin()}, addr))
	if err != nil {
		t.Fatalf("pinned node after browser requests from its address: %v", err)
	}
	if resp := newRawPeer(t, tc).register(ctx, testToken, 0); !resp.GetAccepted() {
		t.Fatalf("node after browser requests from its address: %+v", resp)
	}
}

// On a plaintext edge (mode off) an https:// fetch of the transport port,
// or a turns: TURN server a web page names, makes the browser send a TLS
// ClientHello. It guesses no token and costs a plaintext edge no crypto: it
// must not use up the address's budget either. It is still answered, so a
// node given --ca-pin is told to match the edge's mode.
func TestBrowserTLSRequestsDoNotChargeAPlaintextAddressBudget(t *testing.T) {
	ctx := testCtx(t)
	cfg := testConfig()
	cfg.RegisterFailBurst = 3
	cfg.RegisterFailRate = 0.001
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", cfg, edge)
	addr := srv.Addr().String()

	var reasons []string
	for range 4 {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}}
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(nc, &tls.Config{ServerName: "127.0.0.1", RootCAs: x509.NewCertPool(), NextProtos: []string{"h2", "http/1.1"}})
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		err = tc.Handshake()
		_ = nc.Close()
		// The plaintext answer is no TLS record: the client says so.
		if err == nil || !strings.Contains(err.Error(), "does not look like a TLS handshake") {
			t.Fatalf("TLS client on a plaintext edge: %v", err)
		}
		reasons = append(reasons, recv(t, ctx, edge.failed, "handshake failure").Reason)
	}
	p := dialFrom(t, "127.0.0.9", addr)
	p.write(&ioppb.Frame{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: &ioppb.RegisterRequest{Token: testToken}}})
	if f, err := p.read(ctx); err != nil || !f.GetRegisterResponse().GetAccepted() {
		t.Fatalf("node after %d TLS ClientHellos from its address: frame %v, err %v (reasons %q)", len(reasons), f, err, reasons)
	}
	for _, r := range reasons {
		if !strings.Contains(r, "a TLS client on a plaintext node link") || !strings.Contains(r, "not charged") {
			t.Fatalf("reason %q", r)
		}
	}
}

func TestBrowserStart(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
	}{
		{"GET / HTTP/1.1\r\n", true},
		{"POST /v1 HTTP/1.1", true},
		{"OPTIONS * HTTP/1.1", true},
		{"PRI * HTTP/2.0\r\n", true},
		{"OPTIO", true}, // a TLS record header holds 5 bytes
		{"DELET", true},
		{"PUT /", true},
		{"SSH-2.0-OpenSSH", false},
		{"\x16\x03\x01\x02\x00", false}, // a ClientHello
		{"GE", false},
		{"get / HTTP/1.1", false},
		{"", false},
		{stunAllocate, true},
		{stunAllocate[:5], true},                   // a TLS record header
		{"\x00\x01\x00\x00\x21\x12\xa4\x42", true}, // a Binding request
		{"\x00\x03\x00\x08\x21\x12\xa4\x43", false},
		{"\x00\x03\x00\x07\x21", false},
		{"\x80\x03\x00\x08\x21\x12\xa4\x42", false},
		{"\x00\x03\x00\x08", false},
	} {
		if got := browserStart([]byte(c.in)) != ""; got != c.want {
			t.Errorf("browserStart(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}
