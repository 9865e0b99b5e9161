package httpapi_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/adapters/eventbus"
	httpapi "iop/adapters/http"
	"iop/application/edge"
	"iop/domain"
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

// writeIdleServer is capServer with a short WriteIdleTimeout.
func writeIdleServer(t *testing.T, idle time.Duration) *httpapi.Server {
	t.Helper()
	return startAPI(t, minimalDeps(edge.NewRegistry()), func(api *httpapi.Server) {
		api.MaxConns, api.MaxConnsPerAddr = 64, 16
		api.KeepAlive = 20 * time.Millisecond
		api.WriteIdleTimeout = idle
	})
}

// The review's report: a client that pipelines requests and never reads
// the answers blocked the server's write forever, on a connection that
// counts as busy, so the caps never reclaimed it; from enough addresses
// that locked every legitimate caller out. Each write of an answer is now
// bounded by WriteIdleTimeout, and such a connection is closed. A stream
// whose client keeps reading goes on well past that bound.
func TestUnreadAnswersCutLongStreamGoesOn(t *testing.T) {
	api := writeIdleServer(t, 300*time.Millisecond)

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
	}}
	nc, err := d.Dial("tcp", api.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	payload := []byte(strings.Repeat("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 40000))
	go func() { _, _ = nc.Write(payload) }() // never read
	waitFor(t, "the pipelining connection busy", func() bool {
		_, n, _ := api.ConnCounts("127.0.0.2")
		return n == 1
	})

	// Meanwhile an event stream whose client reads keeps flowing for many
	// times the bound.
	c := dialHTTP(t, "127.0.0.3", api, nil)
	fmt.Fprintf(c.nc, "GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("event stream: %v %v", resp, err)
	}
	events := bufio.NewReader(resp.Body)
	alive := 0
	for alive < 100 { // keep-alives every 20 ms: ≥ 2 s, ≥ 6 times the bound
		line, err := events.ReadString('\n')
		if err != nil {
			t.Fatalf("the event stream was cut after %d keep-alives: %v", alive, err)
		}
		if strings.HasPrefix(line, ": keep-alive") {
			alive++
		}
	}

	waitFor(t, "the connection that never reads closed", func() bool {
		_, n, _ := api.ConnCounts("127.0.0.2")
		return n == 0
	})
}

// The review's report: one unauthenticated connection pipelining GET
// /v1/nodes made one INFO access line per refusal (50,000 in 1.4 s), each
// with route=(unrouted). Refusals before the route are now logged once per
// address per 10 s, naming the route they would have reached; answered
// requests keep a line each.
func TestRefusedRequestsLogAggregated(t *testing.T) {
	buf := &lockedBuf{}
	deps := minimalDeps(edge.NewRegistry())
	deps.APIKeys = []httpapi.APIKey{apiKey("read-key-0123456789abcdef", "reader", nil, domain.ScopeRead)}
	_, srv := serveDeps(t, deps, slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})), func(api *httpapi.Server) {
		api.AccessLog = true
	})
	nc, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const n = 200
	go func() {
		_, _ = nc.Write([]byte(strings.Repeat("GET /v1/nodes HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", n)))
	}()
	br := bufio.NewReader(nc)
	for i := range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 && resp.StatusCode != 429 {
			t.Fatalf("answer %d: %d, want a refusal", i, resp.StatusCode)
		}
	}
	// Each line is written before its answer: all are in.
	lines := buf.lines()
	if len(lines) != 1 {
		t.Fatalf("%d access lines for %d refused requests from one address, want 1", len(lines), n)
	}
	if l := lines[0]; l["route"] != "/v1/nodes" || l["status"] != float64(401) || l["refused_unlogged"] != float64(0) {
		t.Fatalf("refusal line %+v", l)
	}
	// An answered request still gets its own line.
	req, _ := http.NewRequest("GET", srv.URL+"/v1/nodes", nil)
	req.Header.Set("Authorization", "Bearer read-key-0123456789abcdef")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("with the key: %d", resp.StatusCode)
	}
	if lines := buf.lines(); len(lines) != 2 || lines[1]["route"] != "/v1/nodes" || lines[1]["key"] != "reader" {
		t.Fatalf("access lines %+v", lines)
	}
}

// The review's report: event feeds had no cap, each with a 1024-event
// buffer and its own encoding of every event; 2,048 feeds of one read key
// made each run cost the edge 72 times its CPU. Feeds are now capped per
// key and in total, refused 429 too_many_subscriptions past either; a
// feed that ends gives its place back.
func TestEventFeedsCapped(t *testing.T) {
	deps := minimalDeps(edge.NewRegistry())
	deps.APIKeys = []httpapi.APIKey{
		apiKey("read-key-a-0123456789abcdef", "a", nil, domain.ScopeRead),
		apiKey("read-key-b-0123456789abcdef", "b", nil, domain.ScopeRead),
	}
	_, srv := serveDeps(t, deps, slog.New(slog.DiscardHandler), func(api *httpapi.Server) {
		api.MaxSubscriptions, api.MaxSubscriptionsPerKey = 3, 2
	})
	open := func(key string) (*http.Response, context.CancelFunc) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/events", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); resp.Body.Close() })
		return resp, cancel
	}
	refused := func(key, why string) {
		t.Helper()
		resp, _ := open(key)
		if resp.StatusCode != 429 {
			t.Fatalf("feed over the cap: %d, want 429", resp.StatusCode)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 429 || !strings.Contains(string(body), `"too_many_subscriptions"`) || !strings.Contains(string(body), why) {
			t.Fatalf("feed over the cap: %d %s", resp.StatusCode, body)
		}
	}
	const a, b = "read-key-a-0123456789abcdef", "read-key-b-0123456789abcdef"
	first, endFirst := open(a)
	if first.StatusCode != 200 {
		t.Fatalf("first feed: %d", first.StatusCode)
	}
	if resp, _ := open(a); resp.StatusCode != 200 {
		t.Fatalf("second feed: %d", resp.StatusCode)
	}
	refused(a, "limit per key")
	if resp, _ := open(b); resp.StatusCode != 200 {
		t.Fatalf("another key's feed: %d", resp.StatusCode)
	}
	refused(b, "its limit")
	// A feed that ends gives its place back.
	endFirst()
	waitFor(t, "the ended feed's place back", func() bool {
		resp, cancel := open(a)
		defer cancel()
		return resp.StatusCode == 200
	})
}

// HEAD /v1/events was served as a stream: net/http discards a HEAD
// handler's writes, so the feed never ended and never hit its write
// deadline. It held a feed place and a bus subscription as long as the
// connection stayed open, and the client's next request on that
// keep-alive connection (the HEAD answer looked complete to it) got no
// answer; net/http stops watching a connection for its client leaving once
// the next request's first byte is in, so the feed then outlived the
// client too, until the edge stopped. HEAD now gets the stream's headers
// and ends.
func TestEventFeedHeadEnds(t *testing.T) {
	deps := minimalDeps(edge.NewRegistry())
	deps.APIKeys = []httpapi.APIKey{apiKey("read-key-a-0123456789abcdef", "a", nil, domain.ScopeRead)}
	api, srv := serveDeps(t, deps, slog.New(slog.DiscardHandler), func(api *httpapi.Server) { api.MaxSubscriptionsPerKey = 1 })
	// Before srv.Close: a HEAD feed left running noticed neither its
	// client leaving nor srv.Close, only the server stopping.
	t.Cleanup(func() { _ = api.Stop(context.Background()) })
	// One keep-alive connection for everything: the HEAD's and the next
	// request's.
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}}
	t.Cleanup(client.CloseIdleConnections)
	do := func(method, path string) *http.Response {
		t.Helper()
		// The bound only turns a hang into a failure; nothing is timed.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer read-key-a-0123456789abcdef")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s after HEAD /v1/events on the same connection: %v", method, path, err)
		}
		return resp
	}
	head := do("HEAD", "/v1/events")
	head.Body.Close()
	if head.StatusCode != 200 || head.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("HEAD /v1/events: %d %q", head.StatusCode, head.Header.Get("Content-Type"))
	}
	next := do("GET", "/healthz")
	next.Body.Close()
	if next.StatusCode != 200 {
		t.Fatalf("GET /healthz after HEAD /v1/events: %d", next.StatusCode)
	}
	// The HEAD holds no feed: the key's only place is free for a real one.
	feed := do("GET", "/v1/events")
	defer feed.Body.Close()
	if feed.StatusCode != 200 {
		body, _ := io.ReadAll(feed.Body)
		t.Fatalf("a feed after HEAD /v1/events: %d %s", feed.StatusCode, body)
	}
}

// On a keyless edge feeds are counted per client address, and the refusal
// said "the limit per key" all the same, a key the caller never had.
func TestKeylessEventFeedCapNamesTheAddress(t *testing.T) {
	deps := minimalDeps(edge.NewRegistry())
	_, srv := serveDeps(t, deps, slog.New(slog.DiscardHandler), func(api *httpapi.Server) { api.MaxSubscriptionsPerKey = 1 })
	open := func() *http.Response {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/events", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); resp.Body.Close() })
		return resp
	}
	if resp := open(); resp.StatusCode != 200 {
		t.Fatalf("first feed: %d", resp.StatusCode)
	}
	resp := open()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 429 || !strings.Contains(string(body), "address 127.0.0.1 already holds 1 event feeds, the limit per client address") {
		t.Fatalf("feed over the cap: %d %s", resp.StatusCode, body)
	}
}

// serveDeps serves deps through an API that setup configures, on a test
// server stopped, with the deps' submitter and bus, when the test ends.
func serveDeps(t *testing.T, deps httpapi.Deps, log *slog.Logger, setup func(*httpapi.Server)) (*httpapi.Server, *httptest.Server) {
	t.Helper()
	api := httpapi.New(deps, "127.0.0.1:0", log)
	setup(api)
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(func() {
		srv.Close()
		deps.Submit.Stop()
		deps.Events.(*eventbus.Bus).Close()
	})
	return api, srv
}
