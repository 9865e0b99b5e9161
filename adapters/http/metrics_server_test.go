package httpapi_test

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	httpapi "iop/adapters/http"
)

// metricsListener starts a metrics server on loopback with the given caps.
func metricsListener(t *testing.T, total, perAddr int) *httpapi.MetricsServer {
	t.Helper()
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("iop_up 1\n"))
	})
	ms := httpapi.NewMetricsServer("127.0.0.1:0", metrics, slog.New(slog.DiscardHandler))
	ms.MaxConns, ms.MaxConnsPerAddr = total, perAddr
	if err := ms.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ms.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return ms
}

func dialMetrics(t *testing.T, local string, ms *httpapi.MetricsServer) *rawClient {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	nc, err := d.Dial("tcp", ms.Addr().String())
	if err != nil {
		t.Fatalf("dial from %s: %v", local, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return &rawClient{t: t, nc: nc, br: bufio.NewReader(nc)}
}

// metrics.listen needs no key, so it had no bound at all: one address could
// hold any number of connections open on it (a goroutine and buffers each)
// until the edge ran out of file descriptors, its node link and API
// included. It now has the API listener's kind of caps.
func TestMetricsListenerIsConnectionCapped(t *testing.T) {
	ms := metricsListener(t, 3, 2)

	a := dialMetrics(t, "127.0.0.1", ms)
	resp, body, err := a.get("/metrics")
	if err != nil || resp.StatusCode != 200 || string(body) != "iop_up 1\n" {
		t.Fatalf("GET /metrics: %v %v %q", resp, err, body)
	}
	resp, body, err = a.get("/other")
	if err != nil || resp.StatusCode != 404 || !strings.Contains(string(body), `"not_found"`) {
		t.Fatalf("GET /other: %v %v %s, want a JSON 404", resp, err, body)
	}
	// A second connection from the address, kept busy: at the address's
	// cap, a third one is told why and closed.
	b := dialMetrics(t, "127.0.0.1", ms)
	b.nc.Write([]byte("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")) // headers not finished: in a request
	c := dialMetrics(t, "127.0.0.1", ms)
	resp, body, err = c.get("/metrics")
	if err != nil {
		t.Fatalf("over the address's cap: %v, want a 503 answer", err)
	}
	c.wantRefused(resp, body)

	// Another address still gets in, up to the total.
	d := dialMetrics(t, "127.0.0.2", ms)
	if resp, _, err := d.get("/metrics"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics from another address: %v %v", resp, err)
	}
	// The first connection still works.
	if resp, _, err := a.get("/metrics"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics again: %v %v", resp, err)
	}
}
