package httpapi

import (
	"log"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The failed handshakes of a period are counted into the next line; other
// lines of the server's log pass through, one each.
func TestServerErrorLogCountsFailedHandshakes(t *testing.T) {
	var out strings.Builder
	now := time.Unix(1_700_000_000, 0)
	l := log.New(&serverErrorLog{log: slog.New(slog.NewTextHandler(&out, nil)), now: func() time.Time { return now }}, "", 0)
	l.Printf("http: TLS handshake error from 10.0.0.1:1000: EOF")
	for i := range 5 {
		l.Printf("http: TLS handshake error from 10.0.0.%d:2000: tls: first record does not look like a TLS handshake", i+2)
	}
	l.Printf("http: panic serving 10.0.0.9:3000: boom")
	now = now.Add(refusalLogEvery)
	l.Printf("http: TLS handshake error from 10.0.0.8:4000: client sent an HTTP request to an HTTPS server")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), out.String())
	}
	for i, want := range []string{
		`count=1 last_remote=10.0.0.1:1000 last_err=EOF`,
		`msg="http: panic serving 10.0.0.9:3000: boom"`,
		`count=6 last_remote=10.0.0.8:4000 last_err="client sent an HTTP request to an HTTPS server"`,
	} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d = %q, want it to contain %q", i, lines[i], want)
		}
	}
}
