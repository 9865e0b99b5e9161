package httpapi_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"iop/adapters/eventbus"
	httpapi "iop/adapters/http"
	"iop/application/edge"
	"iop/internal/lockedbuf"
)

// linesWith is the lines of what buf holds that contain substr.
func linesWith(buf *lockedbuf.Buffer, substr string) []string {
	var out []string
	for _, line := range strings.Split(buf.String(), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// Failed TLS handshakes on an HTTPS API (a scanner, a plaintext client, a
// load balancer's TCP check) are logged as a count, at most one line per
// period, not one line each: http.Server's own logging of every one let
// anyone who reaches the port fill the edge's log.
func TestHTTPSFailedHandshakesAreLoggedAsACount(t *testing.T) {
	cert := selfSigned(t)
	deps := minimalDeps(edge.NewRegistry())
	deps.TLSCert = &cert
	var logs lockedbuf.Buffer
	api := httpapi.New(deps, "127.0.0.1:0", slog.New(slog.NewTextHandler(&logs, nil)))
	if err := api.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = api.Stop(ctx)
		deps.Submit.Stop()
		deps.Events.(*eventbus.Bus).Close()
	})
	const n = 40
	for range n {
		c, err := net.Dial("tcp", api.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("\x01\x02\x03 not tls at all\r\n\r\n"))
		_, _ = c.Read(make([]byte, 64)) // until the server closes it
		c.Close()
	}
	// The server logs a failed handshake before it releases the connection.
	waitFor(t, "every connection released", func() bool { total, _, _ := api.ConnCounts("127.0.0.1"); return total == 0 })
	got := linesWith(&logs, "TLS handshake")
	if len(got) == 0 {
		t.Fatal("no failed TLS handshake was logged")
	}
	if len(got) > 1 {
		t.Fatalf("%d failed handshakes logged as %d lines, want one (the rest counted):\n%s", n, len(got), strings.Join(got, "\n"))
	}
	if !strings.Contains(got[0], "127.0.0.1") {
		t.Fatalf("line %q does not name the address", got[0])
	}
}
