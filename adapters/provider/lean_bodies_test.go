package provider_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"iop/adapters/provider"
	"iop/domain"
)

// scriptedProvider answers each request path with a fixed raw HTTP/1.1
// response; after one listed in closeAfter it closes the connection.
func scriptedProvider(t *testing.T, answers map[string]string, closeAfter map[string]bool) (addr string, conns *atomic.Int32) {
	t.Helper()
	conns = new(atomic.Int32)
	ln := serveRaw(t, conns, new(atomic.Int32), func(_, _ int, r *http.Request, nc net.Conn) bool {
		_, _ = io.Copy(io.Discard, r.Body)
		_, err := io.WriteString(nc, answers[r.URL.Path])
		return err == nil && !closeAfter[r.URL.Path]
	})
	return ln.Addr().String(), conns
}

// The lean path reads every response framing as net/http does and pools a
// connection only when the response's end is known: a HEAD answer with a
// Content-Length, 204 and 304 carry no body and free the connection at
// once; 1xx answers are skipped; a chunked body is pooled once read; a body
// delimited by the connection's close is read to that close and never
// pooled.
func TestLeanResponseFramings(t *testing.T) {
	answers := map[string]string{
		"/head":    "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
		"/204":     "HTTP/1.1 204 No Content\r\n\r\n",
		"/304":     "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
		"/hints":   "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"/chunked": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"/eof":     "HTTP/1.1 200 OK\r\n\r\nto the close",
		"/ok":      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	}
	addr, conns := scriptedProvider(t, answers, map[string]bool{"/eof": true})
	c := provider.New(provider.Options{})
	defer c.Close()
	p := domain.ProviderConfig{Name: "p", BaseURL: "http://" + addr}
	steps := []struct {
		method, path, body string
		idle, conns        int
	}{
		{http.MethodHead, "/head", "", 1, 1},
		{http.MethodGet, "/204", "", 1, 1},
		{http.MethodGet, "/304", "", 1, 1},
		{http.MethodGet, "/hints", "ok", 1, 1},
		{http.MethodGet, "/chunked", "abc", 1, 1},
		{http.MethodGet, "/eof", "to the close", 0, 1},
		{http.MethodGet, "/ok", "ok", 1, 2},
		{http.MethodPost, "/ok", "ok", 1, 2},
	}
	for _, s := range steps {
		req := domain.TunnelRequest{Method: s.method, Path: s.path}
		if s.method == http.MethodPost {
			req.Body = []byte(`{"n":1}`)
		}
		got, err := doRead(context.Background(), c, p, req, nil)
		if err != nil || got != s.body {
			t.Fatalf("%s %s: body %q, %v; want %q", s.method, s.path, got, err, s.body)
		}
		if n := provider.IdleConns(c, addr); n != s.idle {
			t.Fatalf("after %s %s: idle connections = %d, want %d", s.method, s.path, n, s.idle)
		}
		if n := int(conns.Load()); n != s.conns {
			t.Fatalf("after %s %s: connections opened = %d, want %d", s.method, s.path, n, s.conns)
		}
	}
}
