package provider_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/adapters/provider"
	"iop/domain"
)

// A provider whose response header is huge (one 16 MiB line; an endless
// one is the same until it ends) costs the node a bounded amount of memory
// and the caller an error, as with net/http.Transport's limit, instead of
// growing as long as the provider sends.
func TestResponseHeadersAreBounded(t *testing.T) { bothPaths(t, testResponseHeadersAreBounded) }

func testResponseHeadersAreBounded(t *testing.T, path clientPath) {
	var accepted, closed atomic.Int32
	ln := serveRaw(t, &accepted, &closed, func(_, _ int, _ *http.Request, nc net.Conn) bool {
		_, _ = io.WriteString(nc, "HTTP/1.1 200 OK\r\nX-Big: ")
		line := bytes.Repeat([]byte("a"), 1<<20)
		for range 16 { // 16 MiB, past the 10 MiB bound
			if _, err := nc.Write(line); err != nil {
				return false
			}
		}
		_, _ = io.WriteString(nc, "\r\nContent-Length: 2\r\n\r\nok")
		return false
	})
	c := path.new(t, provider.Options{})
	p := domain.ProviderConfig{Name: "p", BaseURL: "http://" + ln.Addr().String()}
	resp, err := c.Do(context.Background(), p, domain.TunnelRequest{Method: http.MethodGet, Path: "/v1/models"}, nil)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %d with a %d-byte header, want an error", resp.Status, len(strings.Join(resp.Header["X-Big"], "")))
	}
}

// A provider that answers before it has read the request's body (a 413, a
// blob it already has) and closes: the caller gets that answer, and the
// request — a POST without an idempotency key, on a reused connection — is
// not sent a second time because writing its body failed.
func TestEarlyAnswerIsTheAnswer(t *testing.T) { bothPaths(t, testEarlyAnswerIsTheAnswer) }

func testEarlyAnswerIsTheAnswer(t *testing.T, path clientPath) {
	var accepted, closed, posts atomic.Int32
	ln := serveRaw(t, &accepted, &closed, func(_, _ int, r *http.Request, nc net.Conn) bool {
		if r.Method == http.MethodGet {
			_, err := io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return err == nil
		}
		posts.Add(1)
		// The body is not read: the answer goes out, then the connection
		// is shut for writing and, a moment later, closed with the body
		// unread (a reset).
		_, _ = io.WriteString(nc, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 7\r\nConnection: close\r\n\r\ntoo big")
		_ = nc.(*net.TCPConn).CloseWrite()
		time.Sleep(100 * time.Millisecond)
		return false
	})
	c := path.new(t, provider.Options{})
	p := domain.ProviderConfig{Name: "p", BaseURL: "http://" + ln.Addr().String()}
	ctx := context.Background()
	if got, err := doRead(ctx, c, p, domain.TunnelRequest{Method: http.MethodGet, Path: "/v1/models"}, nil); err != nil || got != "ok" {
		t.Fatalf("GET: %q %v", got, err)
	}
	big := domain.TunnelRequest{Method: http.MethodPost, Path: "/api/blobs/sha256:x", Body: bytes.Repeat([]byte("b"), 8<<20)}
	resp, err := c.Do(ctx, p, big, nil)
	if err != nil {
		t.Fatalf("POST: %v, want the provider's 413", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Status != http.StatusRequestEntityTooLarge || string(b) != "too big" {
		t.Fatalf("POST: %d %q, want 413 %q", resp.Status, b, "too big")
	}
	if n := posts.Load(); n != 1 {
		t.Fatalf("the provider got the POST %d times, want once", n)
	}
}

// Credentials in a provider's base URL are sent as Basic authorization, as
// net/http.Client sends them.
func TestBaseURLCredentialsAreSent(t *testing.T) { bothPaths(t, testBaseURLCredentialsAreSent) }

func testBaseURLCredentialsAreSent(t *testing.T, path clientPath) {
	var accepted, closed atomic.Int32
	auth := make(chan string, 1)
	ln := serveRaw(t, &accepted, &closed, func(_, _ int, r *http.Request, nc net.Conn) bool {
		auth <- r.Header.Get("Authorization")
		_, err := io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return err == nil
	})
	c := path.new(t, provider.Options{})
	p := domain.ProviderConfig{Name: "p", BaseURL: "http://user:pass@" + ln.Addr().String()}
	if got, err := doRead(context.Background(), c, p, domain.TunnelRequest{Method: http.MethodGet, Path: "/v1/models"}, nil); err != nil || got != "ok" {
		t.Fatalf("GET: %q %v", got, err)
	}
	if got := <-auth; got != "Basic dXNlcjpwYXNz" {
		t.Fatalf("Authorization %q, want Basic user:pass", got)
	}
}

// Informational answers before the real one are skipped however many come
// (their bytes count against the header bound).
func TestManyInformationalAnswers(t *testing.T) { bothPaths(t, testManyInformationalAnswers) }

func testManyInformationalAnswers(t *testing.T, path clientPath) {
	var accepted, closed atomic.Int32
	ln := serveRaw(t, &accepted, &closed, func(_, _ int, _ *http.Request, nc net.Conn) bool {
		early := strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n", 8)
		_, err := io.WriteString(nc, early+"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab")
		return err == nil
	})
	c := path.new(t, provider.Options{})
	p := domain.ProviderConfig{Name: "p", BaseURL: "http://" + ln.Addr().String()}
	if got, err := doRead(context.Background(), c, p, domain.TunnelRequest{Method: http.MethodGet, Path: "/x"}, nil); err != nil || got != "ab" {
		t.Fatalf("got %q %v, want %q", got, err, "ab")
	}
}

// A provider that sends more than its Content-Length, the extra bytes a
// moment after the response (a buggy server, a proxy's leftover): the next
// request on that connection, however soon and whatever its method, gets
// its own answer, not the stray bytes read as one (net/http.Transport drops
// a connection that speaks out of turn).
func TestStrayBytesAfterAResponseAreNotTheNextAnswer(t *testing.T) {
	bothPaths(t, testStrayBytesAfterAResponseAreNotTheNextAnswer)
}

func testStrayBytesAfterAResponseAreNotTheNextAnswer(t *testing.T, path clientPath) {
	var accepted, closed atomic.Int32
	strayOut := make(chan struct{})
	ln := serveRaw(t, &accepted, &closed, func(conn, req int, _ *http.Request, nc net.Conn) bool {
		if conn == 0 && req == 0 {
			if _, err := io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return false
			}
			time.Sleep(5 * time.Millisecond)
			_, err := io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
			close(strayOut)
			return err == nil
		}
		_, err := fmt.Fprintf(nc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
		return err == nil
	})
	c := path.new(t, provider.Options{})
	p := domain.ProviderConfig{Name: "p", BaseURL: "http://" + ln.Addr().String()}
	ctx := context.Background()
	get := domain.TunnelRequest{Method: http.MethodGet, Path: "/v1/models"}
	if got, err := doRead(ctx, c, p, get, nil); err != nil || got != "ok" {
		t.Fatalf("first GET: %q %v", got, err)
	}
	// The stray bytes are in while the connection is idle: well within any
	// reuse window. (Bytes that came after the next request went out could
	// not be told from its answer.) http.Transport notices them on its own
	// and closes the connection; the lean client looks when it reuses it.
	waitFor(t, "the stray bytes sent", func() bool {
		select {
		case <-strayOut:
			return true
		default:
			return false
		}
	})
	if path.transportOnly {
		waitFor(t, "the connection with stray bytes closed", func() bool { return closed.Load() == 1 })
	}
	if got, err := doRead(ctx, c, p, get, nil); err != nil || got != "fresh" {
		t.Fatalf("second GET: %q %v, want the provider's own answer %q", got, err, "fresh")
	}
}
