package provider_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/adapters/provider"
	"iop/domain"
)

// rawProvider is an HTTP/1.1 provider on a raw TCP listener whose policy
// decides, per connection and per request on it, to answer or to close the
// connection right after reading the request (as a provider closing an idle
// connection does when the close crosses the request).
type rawProvider struct {
	ln          net.Listener
	conns       atomic.Int32
	closedConns atomic.Int32
	mu          sync.Mutex
	bodies      []string // every request body read, in order
}

func newRawProvider(t *testing.T, answer func(conn, req int) bool) *rawProvider {
	t.Helper()
	return newRawProviderClosing(t, answer, func(int, int) bool { return false })
}

// newRawProviderClosing is newRawProvider whose closeAfter decides to close
// a connection right after an answer, without a Connection: close header.
func newRawProviderClosing(t *testing.T, answer, closeAfter func(conn, req int) bool) *rawProvider {
	t.Helper()
	p := &rawProvider{}
	p.ln = serveRaw(t, &p.conns, &p.closedConns, func(conn, req int, r *http.Request, nc net.Conn) bool {
		b, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.bodies = append(p.bodies, string(b))
		p.mu.Unlock()
		if !answer(conn, req) {
			return false
		}
		if _, err := io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return false
		}
		return !closeAfter(conn, req)
	})
	return p
}

// serveRaw accepts HTTP/1.1 connections on a loopback listener and hands
// every request read from them to serve, which answers on nc itself and
// says whether the connection goes on; conn and req number the connections
// and the requests on each from 0. accepted and closed count connections.
// Everything stops at the test's end.
func serveRaw(t *testing.T, accepted, closed *atomic.Int32, serve func(conn, req int, r *http.Request, nc net.Conn) bool) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var open sync.Map
	t.Cleanup(func() {
		_ = ln.Close()
		open.Range(func(k, _ any) bool { _ = k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			i := int(accepted.Add(1)) - 1
			open.Store(nc, nil)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer closed.Add(1)
				defer nc.Close()
				br := bufio.NewReader(nc)
				for j := 0; ; j++ {
					req, err := http.ReadRequest(br)
					if err != nil || !serve(i, j, req, nc) {
						return
					}
				}
			}()
		}
	}()
	return ln
}

func (p *rawProvider) config() domain.ProviderConfig {
	return domain.ProviderConfig{Name: "p", BaseURL: "http://" + p.ln.Addr().String()}
}

func (p *rawProvider) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.bodies...)
}

func doRead(ctx context.Context, c *provider.Client, p domain.ProviderConfig, req domain.TunnelRequest, body io.Reader) (string, error) {
	resp, err := c.Do(ctx, p, req, body)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

var postReq = domain.TunnelRequest{Method: http.MethodPost, Path: "/v1/chat/completions", Body: []byte(`{"n":1}`)}

// Replayable requests: a GET, and a POST that carries an idempotency key
// (the provider drops a duplicate).
var replayableReqs = map[string]domain.TunnelRequest{
	"GET": {Method: http.MethodGet, Path: "/v1/models"},
	"POST with Idempotency-Key": {Method: http.MethodPost, Path: "/v1/chat/completions", Body: []byte(`{"n":1}`),
		Header: domain.Header{"Idempotency-Key": {"k1"}}},
}

// A provider that closed a kept-alive connection just as a replayable
// request went out on it (no response byte): the request is sent once
// more, on a new connection, and succeeds.
func TestLeanRetriesStaleConnectionOnce(t *testing.T) {
	for name, req := range replayableReqs {
		t.Run(name, func(t *testing.T) {
			rp := newRawProvider(t, func(conn, req int) bool { return conn > 0 || req == 0 })
			c := provider.New(provider.Options{})
			defer c.Close()
			for i := 0; i < 2; i++ {
				if got, err := doRead(context.Background(), c, rp.config(), req, nil); err != nil || got != "ok" {
					t.Fatalf("request %d = %q, %v", i, got, err)
				}
			}
			if n := rp.conns.Load(); n != 2 {
				t.Fatalf("provider saw %d connections, want 2 (the stale one, then a fresh one)", n)
			}
			if b := rp.seen(); len(b) != 3 || b[2] != string(req.Body) {
				t.Fatalf("provider read bodies %q, want the retried request's body in full", b)
			}
		})
	}
}

// A POST without an idempotency key that the provider read whole before it
// dropped the connection is not sent again: the provider may have started
// (and billed) the completion. The caller gets the error, and the provider
// saw the request once.
func TestLeanDoesNotResendAPostTheProviderRead(t *testing.T) {
	rp := newRawProvider(t, func(conn, req int) bool { return conn > 0 || req == 0 })
	c := provider.New(provider.Options{})
	defer c.Close()
	if _, err := doRead(context.Background(), c, rp.config(), postReq, nil); err != nil {
		t.Fatal(err)
	}
	_, err := doRead(context.Background(), c, rp.config(), postReq, nil)
	if domain.CodeOf(err) != domain.CodeProviderUnreachable {
		t.Fatalf("err = %v, want provider_unreachable", err)
	}
	if n := rp.conns.Load(); n != 1 {
		t.Fatalf("provider saw %d connections, want 1 (no resend)", n)
	}
	if n := len(rp.seen()); n != 2 {
		t.Fatalf("provider read %d requests, want 2 (the first, and the dropped one once)", n)
	}
}

// A POST on a connection the provider closed a moment ago (well within the
// idle time under which a replayable request skips the stale-check) gets
// a fresh connection: a request that is never sent twice is always checked.
func TestLeanPostChecksABrieflyIdleConnection(t *testing.T) {
	rp := newRawProviderClosing(t, func(int, int) bool { return true }, func(conn, req int) bool { return conn == 0 })
	c := provider.New(provider.Options{})
	defer c.Close()
	if _, err := doRead(context.Background(), c, rp.config(), postReq, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the provider to close the connection", func() bool { return rp.closedConns.Load() == 1 })
	if got, err := doRead(context.Background(), c, rp.config(), postReq, nil); err != nil || got != "ok" {
		t.Fatalf("second POST = %q, %v", got, err)
	}
	if n := rp.conns.Load(); n != 2 {
		t.Fatalf("provider saw %d connections, want 2", n)
	}
	if n := len(rp.seen()); n != 2 {
		t.Fatalf("provider read %d requests, want 2 (no stale try)", n)
	}
}

// The retry happens once: a fresh connection that fails too is an error.
func TestLeanRetriesOnlyOnce(t *testing.T) {
	req := replayableReqs["GET"]
	rp := newRawProvider(t, func(conn, req int) bool { return conn == 0 && req == 0 })
	c := provider.New(provider.Options{})
	defer c.Close()
	if _, err := doRead(context.Background(), c, rp.config(), req, nil); err != nil {
		t.Fatal(err)
	}
	_, err := doRead(context.Background(), c, rp.config(), req, nil)
	if domain.CodeOf(err) != domain.CodeProviderUnreachable {
		t.Fatalf("err = %v, want provider_unreachable", err)
	}
	if n := len(rp.seen()); n != 3 {
		t.Fatalf("provider read %d requests, want 3 (one, then the stale try and one retry)", n)
	}
}

// A streamed body already read from cannot be sent again: no retry, and
// the provider never sees a partial duplicate.
func TestLeanDoesNotRetryConsumedStreamedBody(t *testing.T) {
	rp := newRawProvider(t, func(conn, req int) bool { return conn > 0 || req == 0 })
	c := provider.New(provider.Options{})
	defer c.Close()
	if _, err := doRead(context.Background(), c, rp.config(), postReq, nil); err != nil {
		t.Fatal(err)
	}
	req := postReq
	req.Header = domain.Header{"Content-Length": {"12"}}
	_, err := doRead(context.Background(), c, rp.config(), req, strings.NewReader("-rest"))
	if domain.CodeOf(err) != domain.CodeProviderUnreachable {
		t.Fatalf("err = %v, want provider_unreachable", err)
	}
	if n := rp.conns.Load(); n != 1 {
		t.Fatalf("provider saw %d connections, want 1 (no retry)", n)
	}
}

// A provider that closes idle connections after a pause (uvicorn: 5 s):
// the next request after the pause succeeds. (http.Transport does not
// always: when its read loop has not yet seen the close, a POST fails with
// "connection closed by the provider" — it retries only idempotent
// requests. This test failed that way on the Transport path.)
func TestLeanAfterProviderClosedIdleConnection(t *testing.T) {
	path := clientPath{}
	var conns atomic.Int32
	closed := make(chan struct{}, 8)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	srv.Config.IdleTimeout = 20 * time.Millisecond
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			conns.Add(1)
		case http.StateClosed:
			closed <- struct{}{}
		}
	}
	srv.Start()
	defer srv.Close()
	c := path.new(t, provider.Options{})
	p := domain.ProviderConfig{Name: "p", BaseURL: srv.URL}
	for i := 0; i < 2; i++ {
		if got, err := doRead(context.Background(), c, p, postReq, nil); err != nil || got != "ok" {
			t.Fatalf("request %d = %q, %v", i, got, err)
		}
		if i == 0 {
			select {
			case <-closed:
			case <-time.After(5 * time.Second):
				t.Fatal("provider did not close the idle connection")
			}
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("provider saw %d connections, want 2", n)
	}
}

// countingServer counts the connections a provider accepted and those
// closed.
type countingServer struct {
	*httptest.Server
	opened, closed atomic.Int32
}

func newCountingServer(t *testing.T, h http.HandlerFunc) *countingServer {
	s := &countingServer{Server: httptest.NewUnstartedServer(h)}
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closed.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func (s *countingServer) hostport() string { return strings.TrimPrefix(s.URL, "http://") }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A body read to its end frees the connection for the next request; one
// closed unread, or a response saying Connection: close, does not.
func TestLeanConnectionReuse(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/close":
			w.Header().Set("Connection", "close")
		case "/long":
			// One event, then a stream that stays open: read to the
			// event's end, nothing of it stays buffered on the client.
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	c := provider.New(provider.Options{})
	defer c.Close()
	p := domain.ProviderConfig{Name: "p", BaseURL: srv.URL}
	get := func(path string) domain.TunnelRequest {
		return domain.TunnelRequest{Method: http.MethodGet, Path: path}
	}

	for i := 0; i < 3; i++ {
		if _, err := doRead(context.Background(), c, p, get("/ok"), nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := srv.opened.Load(); n != 1 {
		t.Fatalf("3 sequential requests opened %d connections, want 1", n)
	}
	if n := provider.IdleConns(c, srv.hostport()); n != 1 {
		t.Fatalf("idle connections = %d, want 1", n)
	}

	// Unread body: closed, not pooled.
	resp, err := c.Do(context.Background(), p, get("/long"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := resp.Body.Read(make([]byte, 4096)); err != nil || n != len("data: first\n\n") {
		t.Fatalf("first read = %d, %v", n, err)
	}
	_ = resp.Body.Close()
	if n := provider.IdleConns(c, srv.hostport()); n != 0 {
		t.Fatalf("after an unread body, idle connections = %d, want 0", n)
	}
	waitFor(t, "the provider to see the unread connection closed", func() bool { return srv.closed.Load() == 1 })

	// Connection: close from the provider: not pooled.
	if _, err := doRead(context.Background(), c, p, get("/close"), nil); err != nil {
		t.Fatal(err)
	}
	if n := provider.IdleConns(c, srv.hostport()); n != 0 {
		t.Fatalf("after Connection: close, idle connections = %d, want 0", n)
	}
	if _, err := doRead(context.Background(), c, p, get("/ok"), nil); err != nil {
		t.Fatal(err)
	}
	if n := srv.opened.Load(); n != 3 {
		t.Fatalf("connections opened = %d, want 3 (one reused, then one after each non-reusable answer)", n)
	}

	// Close closes the idle ones.
	c.Close()
	waitFor(t, "the provider to see every connection closed", func() bool { return srv.closed.Load() == 3 })
}

// The idle pool keeps at most MaxIdleConnsPerHost connections per host;
// the rest are closed when their request ends.
func TestLeanIdlePoolBound(t *testing.T) {
	const concurrent, maxIdle = 5, 2
	arrived := make(chan struct{}, concurrent)
	release := make(chan struct{})
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "ok")
	})
	c := provider.New(provider.Options{MaxIdleConnsPerHost: maxIdle})
	defer c.Close()
	p := domain.ProviderConfig{Name: "p", BaseURL: srv.URL}
	errs := make(chan error, concurrent)
	for i := 0; i < concurrent; i++ {
		go func() { _, err := doRead(context.Background(), c, p, postReq, nil); errs <- err }()
	}
	for i := 0; i < concurrent; i++ {
		<-arrived
	}
	close(release)
	for i := 0; i < concurrent; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := provider.IdleConns(c, srv.hostport()); n != maxIdle {
		t.Fatalf("idle connections = %d, want %d", n, maxIdle)
	}
	waitFor(t, "the connections over the bound to be closed", func() bool { return srv.closed.Load() == concurrent-maxIdle })
}

// Idle connections are closed after IdleConnTimeout.
func TestLeanIdleTimeout(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	c := provider.New(provider.Options{IdleConnTimeout: 30 * time.Millisecond})
	defer c.Close()
	if _, err := doRead(context.Background(), c, domain.ProviderConfig{Name: "p", BaseURL: srv.URL}, postReq, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the idle connection to be closed", func() bool { return srv.closed.Load() == 1 })
	if n := provider.IdleConns(c, srv.hostport()); n != 0 {
		t.Fatalf("idle connections = %d, want 0", n)
	}
}

// Cancelling mid-body frees a blocked reader and closes the connection,
// which is not pooled; a header timeout leaves no connection pooled either.
func TestLeanCancelAndTimeoutDoNotPool(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-r.Context().Done()
			return
		}
		_, _ = io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	// The cancel is tried with the default header timeout: a 50 ms one
	// could cut this answer's headers on a loaded machine.
	c := provider.New(provider.Options{})
	defer c.Close()
	p := domain.ProviderConfig{Name: "p", BaseURL: srv.URL}
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := c.Do(ctx, p, postReq, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	readErr := make(chan error, 1)
	go func() { _, err := io.ReadAll(resp.Body); readErr <- err }()
	cancel()
	select {
	case err := <-readErr:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("read after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reader not freed by cancel")
	}
	_ = resp.Body.Close()
	waitFor(t, "the provider to see the connection closed", func() bool { return srv.closed.Load() == 1 })

	if n := provider.IdleConns(c, srv.hostport()); n != 0 {
		t.Fatalf("idle connections = %d after the cancel, want 0", n)
	}
	ct := provider.New(provider.Options{HeaderTimeout: 50 * time.Millisecond})
	defer ct.Close()
	_, err = ct.Do(context.Background(), p, domain.TunnelRequest{Path: "/slow"}, nil)
	if !errors.Is(err, domain.ErrTimeout) {
		t.Fatalf("err = %v, want timeout", err)
	}
	if n := provider.IdleConns(ct, srv.hostport()); n != 0 {
		t.Fatalf("idle connections = %d after the timeout, want 0", n)
	}
	waitFor(t, "the timed-out connection to be closed", func() bool { return srv.closed.Load() == 2 })
}

// https providers do not take the lean path: the request is TLS (here the
// test server's certificate is not trusted, which only a TLS handshake
// can tell).
func TestHTTPSGoesThroughTransport(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	c := provider.New(provider.Options{})
	defer c.Close()
	_, err := c.Do(context.Background(), domain.ProviderConfig{Name: "p", BaseURL: srv.URL}, domain.TunnelRequest{Path: "/v1/models"}, nil)
	if err == nil || !strings.Contains(err.Error(), "certificate not trusted") {
		t.Fatalf("err = %v, want an untrusted-certificate error", err)
	}
}

// failingReader yields its data, then fails as a streamed body does when
// the edge's link drops mid-upload.
type failingReader struct{ data string }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.data == "" {
		return 0, errors.New("stream reset by the edge")
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

// A streamed body that fails part way ends the request with an error at
// once: the provider, still waiting for the rest, would never answer.
func TestDoStreamedBodyFailure(t *testing.T) { bothPaths(t, testDoStreamedBodyFailure) }

func testDoStreamedBodyFailure(t *testing.T, path clientPath) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Answers nothing, as a provider waiting for the rest of the body.
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	c := path.new(t, provider.Options{HeaderTimeout: time.Minute})
	// The guard: a client that waited for headers would end here, cancelled.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := domain.TunnelRequest{Method: http.MethodPost, Path: "/v1/embeddings", Body: []byte("head-"),
		Header: domain.Header{"Content-Length": {"1000"}}}
	_, err := c.Do(ctx, domain.ProviderConfig{Name: "p", BaseURL: srv.URL}, req, &failingReader{data: "part"})
	if err == nil || domain.CodeOf(err) != domain.CodeProviderUnreachable {
		t.Fatalf("err = %v, want provider_unreachable at once", err)
	}
}

// Many callers at once, some leaving mid-stream: every body read to its
// end is whole, and the pool never hands one connection to two requests
// (a shared connection would interleave two responses; -race watches the
// rest).
func TestLeanConcurrentReuseAndCancel(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		id := r.URL.Query().Get("id")
		for i := 0; i < 20; i++ {
			if _, err := io.WriteString(w, "data: "+id+"\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	c := provider.New(provider.Options{MaxIdleConnsPerHost: 4})
	defer c.Close()
	p := domain.ProviderConfig{Name: "p", BaseURL: srv.URL}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 30; i++ {
				id := fmt.Sprintf("%d-%d", g, i)
				ctx, cancel := context.WithCancel(context.Background())
				resp, err := c.Do(ctx, p, domain.TunnelRequest{Method: http.MethodPost, Path: "/v1/chat/completions", Query: "id=" + id, Body: []byte("{}")}, nil)
				if err != nil {
					cancel()
					errs <- err
					return
				}
				if i%3 == 0 {
					// Leave after the first bytes: the body closed unread
					// while the request's context is still live.
					_, _ = resp.Body.Read(make([]byte, 8))
					_ = resp.Body.Close()
					cancel()
					continue
				}
				b, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				cancel()
				if want := strings.Repeat("data: "+id+"\n\n", 20); err != nil || string(b) != want {
					errs <- fmt.Errorf("request %s: body %q, %v", id, b, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := provider.IdleConns(c, srv.hostport()); n > 4 {
		t.Fatalf("idle connections = %d, over the bound of 4", n)
	}
}

// A request with a streamed body cannot be sent again once it started, so
// the connection it would reuse is checked first, however briefly idle: a
// provider that closed it right after answering costs a new connection, not
// a failed request.
func TestLeanStreamedBodyAvoidsClosedConnection(t *testing.T) {
	// The provider closes each connection right after its first answer
	// (without saying so in a Connection header).
	rp2 := newRawProviderClosing(t, func(int, int) bool { return true }, func(int, int) bool { return true })
	c := provider.New(provider.Options{})
	defer c.Close()
	if got, err := doRead(context.Background(), c, rp2.config(), postReq, nil); err != nil || got != "ok" {
		t.Fatalf("first request = %q, %v", got, err)
	}
	waitFor(t, "the provider to close the connection", func() bool { return rp2.closedConns.Load() == 1 })
	// All of the body streamed: its first bytes are read before the
	// first write that could fail.
	req := domain.TunnelRequest{Method: http.MethodPost, Path: "/v1/chat/completions", Header: domain.Header{"Content-Length": {"12"}}}
	if got, err := doRead(context.Background(), c, rp2.config(), req, strings.NewReader(`{"n":1}-rest`)); err != nil || got != "ok" {
		t.Fatalf("streamed request = %q, %v", got, err)
	}
	if b := rp2.seen(); len(b) != 2 || b[1] != `{"n":1}-rest` {
		t.Fatalf("provider read bodies %q", b)
	}
}
