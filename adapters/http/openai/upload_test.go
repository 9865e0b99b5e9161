package openaiapi_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
	"iop/internal/lockedbuf"
	"iop/ports"
)

// uploadLink is a node link that streams a request body the way the
// transport does: OpenTunnel returns at once and an uploader goroutine
// reads the body while the handler waits for the answer. A body read that
// fails ends the tunnel with the transport's bare "stream closed" (its
// uploader resets the stream, and Recv then has nothing else to say); a
// body read to its end gets a 200.
type uploadLink struct{ *fakeLink }

func (l uploadLink) OpenTunnel(_ context.Context, _ domain.TunnelRequest, rest io.Reader) (ports.TunnelStream, error) {
	st := newFakeStream()
	if rest == nil {
		st.push(response(200, "application/json", `{}`)...)
		return st, nil
	}
	go func() {
		if _, err := io.Copy(io.Discard, rest); err != nil {
			st.push(step{err: errors.New("stream closed")})
			return
		}
		st.push(response(200, "application/json", `{}`)...)
	}()
	return st, nil
}

// uploadEnv is an edge whose only node takes blobs through an uploadLink,
// served by srv (ReadTimeout, when set, cuts a body read off the way the
// edge's body clock does: with a read deadline on the connection).
func uploadEnv(t *testing.T, readTimeout time.Duration) string {
	t.Helper()
	e := newEnv(t)
	l := uploadLink{&fakeLink{}}
	if err := e.reg.Admit(&edge.LiveNode{ID: "ol", Link: l, ConnectedAt: time.Unix(1700000000, 0),
		Config: domain.NodeConfig{NodeID: "ol", Providers: []domain.ProviderConfig{provider("ol", domain.ProviderOllama, "tiny")}}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = &lateFailure{r.Body}
		e.h.ServeHTTP(w, r)
	}))
	srv.Config.ReadTimeout = readTimeout
	srv.Start()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// lateFailure hands a body read's error back a moment late, as layers
// between the connection and the handler can (the edge's body clock
// wraps it). net/http has cancelled the request's context by then: the
// handler must not take that for a caller who left.
type lateFailure struct{ io.ReadCloser }

func (b *lateFailure) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		time.Sleep(50 * time.Millisecond)
	}
	return n, err
}

// rawBlob sends head (a request head and the start of a body) on a raw
// connection, then after (if set), and returns the answer.
func rawBlob(t *testing.T, addr, head, after string) (*http.Response, string) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fmt.Fprint(nc, head)
	if after != "" {
		time.Sleep(20 * time.Millisecond) // the body is streaming to the node by then
		fmt.Fprint(nc, after)
	}
	_ = nc.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	return resp, readAll(t, resp)
}

// A blob upload whose body breaks while it streams (malformed chunks) is
// answered 400 invalid_request saying why, as docs/passthrough.md
// promises for every body, not 500 with the transport's "stream closed".
func TestBlobUploadWithABrokenBody(t *testing.T) {
	addr := uploadEnv(t, 0)
	resp, got := rawBlob(t, addr,
		"POST /api/blobs/sha256:abc HTTP/1.1\r\nHost: edge\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n", "zz\r\n")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, "request body") || strings.Contains(got, "stream closed") {
		t.Fatalf("got %d %s, want 400 saying the request body failed", resp.StatusCode, got)
	}
}

// A blob upload whose body stops arriving is cut off by the connection's
// read deadline (the edge's body clock); net/http then cancels the
// request's context as well. That is not a caller who left: the answer is
// a 400 saying why, never a 200 with nothing in it.
func TestStalledBlobUploadIsA400(t *testing.T) {
	addr := uploadEnv(t, 300*time.Millisecond)
	for i := range 5 {
		resp, got := rawBlob(t, addr,
			"POST /api/blobs/sha256:abc HTTP/1.1\r\nHost: edge\r\nContent-Length: 1000\r\n\r\n0123456789", "")
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, "request body") {
			t.Fatalf("attempt %d: got %d %q, want 400 saying the request body failed", i, resp.StatusCode, got)
		}
	}
}

// midBreakLink answers a streamed upload at once (status, headers, a first
// body chunk) while its uploader waits for the rest of the caller's body,
// then breaks; its stream's Close closes the body, as the transport's does
// (which cuts the uploader's read off, and net/http cancels the request's
// context over that).
type midBreakLink struct{ *fakeLink }

type closingStream struct {
	*fakeStream
	body io.Reader
}

func (s closingStream) Close() {
	s.fakeStream.Close()
	if c, ok := s.body.(io.Closer); ok {
		_ = c.Close()
	}
}

func (l midBreakLink) OpenTunnel(_ context.Context, _ domain.TunnelRequest, rest io.Reader) (ports.TunnelStream, error) {
	st := newFakeStream(status(200), header("Content-Type", "application/octet-stream"), body("hello"))
	reading := make(chan struct{})
	go func() {
		buf := make([]byte, 64)
		_, _ = rest.Read(buf) // what the caller sent before it stalled
		close(reading)
		_, _ = io.Copy(io.Discard, rest) // waits for the rest, which never comes
	}()
	go func() {
		<-reading
		time.Sleep(20 * time.Millisecond) // the uploader waits in its next read by then
		st.push(step{err: errors.New("upstream body failed")})
	}()
	return closingStream{st, rest}, nil
}

// A provider answer that breaks after it started, while the caller's body
// is still streaming, reaches the caller as a broken stream — not as a
// complete 200 — although ending the tunnel cut the body's read off and
// net/http cancelled the request's context over that.
func TestAnswerBrokenWhileTheBodyStreamsIsNoEnd(t *testing.T) {
	e := newEnv(t)
	if err := e.reg.Admit(&edge.LiveNode{ID: "ol", Link: midBreakLink{&fakeLink{}}, ConnectedAt: time.Unix(1700000000, 0),
		Config: domain.NodeConfig{NodeID: "ol", Providers: []domain.ProviderConfig{provider("ol", domain.ProviderOllama, "tiny")}}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.h)
	t.Cleanup(srv.Close)
	nc, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fmt.Fprint(nc, "POST /api/blobs/sha256:abc HTTP/1.1\r\nHost: edge\r\nContent-Length: 100000\r\n\r\n0123456789")
	_ = nc.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	got, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(got) != "hello" || err == nil {
		t.Fatalf("got %d %q, read error %v; want 200 \"hello\" cut off with a read error", resp.StatusCode, got, err)
	}
}

// A streamed upload refused before its tunnel opens (no node to take it)
// gets its answer, and the connection serves the next request: with full
// duplex on and the body left unread, net/http panicked reading the next
// request ("invalid concurrent Body.Read call", golang/go#68560), logged a
// stack per request and dropped the connection.
func TestRefusedUploadLeavesTheConnectionWhole(t *testing.T) {
	e := newEnv(t)
	var logs lockedbuf.Buffer
	srv := httptest.NewUnstartedServer(e.h)
	srv.Config.ErrorLog = log.New(&logs, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	var conns atomic.Int32
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conns.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}}
	for i := range 3 {
		resp, err := c.Post(srv.URL+"/api/blobs/sha256:abc", "application/octet-stream", strings.NewReader(strings.Repeat("x", 100000)))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("request %d: %d, want a refusal (no node)", i, resp.StatusCode)
		}
	}
	srv.Close()
	if strings.Contains(logs.String(), "panic") {
		t.Fatalf("the server panicked:\n%s", logs.String())
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("3 requests took %d connections, want 1 (kept alive)", n)
	}
}

// A caller still streaming its body gets a refusal before the tunnel
// opened at once, not once it has sent more (or its body's deadline ran
// out): the handler's close of the unread body waited for it before the
// answer went out.
func TestRefusedUploadIsAnsweredWhileTheBodyStreams(t *testing.T) {
	e := newEnv(t) // no node
	resp, got := rawBlob(t, strings.TrimPrefix(e.srv.URL, "http://"),
		"POST /api/blobs/sha256:abc HTTP/1.1\r\nHost: edge\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n", "")
	if resp.StatusCode < 400 {
		t.Fatalf("got %d %s, want a refusal (no node)", resp.StatusCode, got)
	}
}
