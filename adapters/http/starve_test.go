package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// headerRequest sends GET path with extra header lines on a fresh
// connection to addr and reads the answer.
func headerRequest(t *testing.T, addr, path, extra string) *http.Response {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	go fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n", path, extra)
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatalf("GET %s with %d header bytes: %v", path, len(extra), err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// tinyHeaders is n bytes of distinct empty headers, the reviewer's shape:
// each costs a map entry and a string far larger than its 5 bytes on the
// wire.
func tinyHeaders(n int) string {
	var b strings.Builder
	for j := 0; b.Len() < n; j++ {
		fmt.Fprintf(&b, "%x:\r\n", j)
	}
	return b.String()
}

// The review's report: with Go's 1 MiB default, ~130,000 tiny headers held
// ~15 MiB of edge memory per connection, no key needed, on the API and the
// metrics listener alike. Headers past 64 KiB are now answered 431; a large
// legitimate header (a 32 KiB cookie or key) still gets through.
func TestOversizedHeadersRefused(t *testing.T) {
	api, _ := capServer(t, 64, 16, nil)
	ms := metricsListener(t, 8, 8)
	for _, c := range []struct{ name, addr, path string }{
		{"api", api.Addr().String(), "/healthz"},
		{"metrics", ms.Addr().String(), "/metrics"},
	} {
		if resp := headerRequest(t, c.addr, c.path, tinyHeaders(1<<20-200)); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("%s: 1 MiB of headers answered %d, want 431", c.name, resp.StatusCode)
		}
		if resp := headerRequest(t, c.addr, c.path, tinyHeaders(100<<10)); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("%s: 100 KiB of headers answered %d, want 431", c.name, resp.StatusCode)
		}
		big := "Cookie: " + strings.Repeat("k", 32<<10) + "\r\nX-Stainless-Lang: go\r\n"
		if resp := headerRequest(t, c.addr, c.path, big); resp.StatusCode != http.StatusOK {
			t.Errorf("%s: a 32 KiB header answered %d, want 200", c.name, resp.StatusCode)
		}
	}
}
