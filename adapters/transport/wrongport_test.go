package transport

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/silentpeer"
)

// A node pointed at something that is not the edge's node link as it dials
// it — the edge's HTTP port (7701 next to 7700), a plaintext port with
// --ca-pin — is told so in its retry message, not only the protocol's
// complaint (a malformed frame, a TLS record that is not TLS).
func TestWrongPortSaysWhatToCheck(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not found", http.StatusNotFound)
	}))
	defer web.Close()
	addr := strings.TrimPrefix(web.URL, "http://")
	for name, tlsCfg := range map[string]*tls.Config{
		"plaintext node": nil,
		"TLS node":       {ServerName: "edge.example", MinVersion: tls.VersionTLS13},
	} {
		tc := testConfig()
		tc.TLS = tlsCfg
		c := &Client{cfg: ClientConfig{Addr: addr, Token: "t", Transport: tc.withDefaults()}}
		_, err := c.register(context.Background(), nil)
		if err == nil || !strings.Contains(err.Error(), "transport.listen, not its http.listen") {
			t.Errorf("%s: %v, want the hint", name, err)
		}
	}
}

// An edge that takes the connection but does not answer the registration
// (stopped, SIGSTOPped) is reported against the handshake timeout, not the
// link's heartbeat.
func TestSilentEdgeIsAHandshakeTimeout(t *testing.T) {
	addr := silentpeer.Listen(t)
	tc := testConfig()
	tc.HandshakeTimeout = 200 * time.Millisecond
	c := &Client{cfg: ClientConfig{Addr: addr, Token: "t", Transport: tc.withDefaults()}}
	_, err := c.register(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "within the handshake timeout (200ms)") || strings.Contains(err.Error(), "heartbeat") {
		t.Fatalf("register = %v", err)
	}
}
