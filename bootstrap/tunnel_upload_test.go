package bootstrap_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/bootstrap"
)

// accessSeen is a slog handler that watches for the access line of route
// from the caller at remote, which the server logs once the route's
// handler has returned, and sends on done, right then, the stack of each
// goroutine still in the tunnel's body uploader. Lines of other callers
// are ignored: an earlier request's line, logged late, would list the
// uploader of a request still going.
type accessSeen struct {
	route  string
	remote atomic.Pointer[string]
	done   chan []string
}

func (h *accessSeen) Enabled(context.Context, slog.Level) bool { return true }
func (h *accessSeen) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *accessSeen) WithGroup(string) slog.Handler            { return h }
func (h *accessSeen) Handle(_ context.Context, r slog.Record) error {
	want := h.remote.Load()
	if want == nil {
		return nil
	}
	route, remote := false, false
	r.Attrs(func(a slog.Attr) bool {
		route = route || (a.Key == "route" && a.Value.String() == h.route)
		remote = remote || (a.Key == "remote" && a.Value.String() == *want)
		return true
	})
	if route && remote {
		buf := make([]byte, 1<<20)
		var uploaders []string
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "(*tunnelStream).sendBody") {
				uploaders = append(uploaders, g)
			}
		}
		select {
		case h.done <- uploaders:
		default:
		}
	}
	return nil
}

// A tunnel can end while the caller is still sending the request's body:
// here the node cannot reach its provider and says so at once, while the
// caller has sent a blob upload's headers and stalls. The handler must answer with
// the tunnel's error and must not return with the tunnel's uploader still
// reading the request's body: net/http forbids reading it once ServeHTTP
// returned (its own Close of the body then blocks on that read until the
// body clock's deadline, and a late read over a size limit races with the
// server). The uploader used to be given up on after 1 s and left reading.
func TestTunnelEndingBeforeTheBodyLeavesNoReader(t *testing.T) {
	upstream := "http://" + freeAddr(t) // nothing listens there
	tAddr, hAddr := freeAddr(t), freeAddr(t)
	cfg, err := config.ParseEdge(filepath.Join(t.TempDir(), "edge.yaml"), []byte(`
transport: {listen: "`+tAddr+`"}
http: {listen: "`+hAddr+`"}
nodes:
  - id: n1
    token: graph-test-token
    providers: [{name: ol, type: ollama, base_url: "`+upstream+`", models: [m]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	seen := &accessSeen{route: "/api/", done: make(chan []string, 1)}
	es := bootstrap.EdgeSettings{Config: cfg, Logger: slog.New(seen)}
	edge := fxtest.New(t, bootstrap.Edge(es), fx.NopLogger)
	edge.RequireStart()
	defer edge.RequireStop()
	node := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{
		Edge: tAddr, Token: "graph-test-token", Logger: quiet(), Transport: nodeLink(t, es),
		DB: "file:" + filepath.Join(t.TempDir(), "n.db") + "?cache=shared&mode=rwc",
	}), fx.NopLogger)
	node.RequireStart()
	defer node.RequireStop()

	// A blob upload's body streams to the node as it comes. Wait until
	// the node's provider is there (a small upload gets the node's 502).
	blob := "/api/blobs/sha256:" + strings.Repeat("0", 64)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Post("http://"+hAddr+blob, "application/octet-stream", strings.NewReader("small"))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusBadGateway {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the provider never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The headers of a body declared at 2 MiB, then nothing: the uploader
	// waits in a read of the body when the node's answer comes (with part
	// of the body sent, it might be sending that part instead and stop
	// on the ended stream).
	conn, err := net.Dial("tcp", hAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	local := conn.LocalAddr().String()
	seen.remote.Store(&local)
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", blob, hAddr, 2<<20); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(got), "provider unreachable") {
		t.Fatalf("status %d %s, want the node's 502 (provider unreachable)", resp.StatusCode, got)
	}
	select {
	case uploaders := <-seen.done: // the handler returned
		if len(uploaders) > 0 {
			t.Fatalf("the handler returned with the tunnel's uploader still running:\n%s", strings.Join(uploaders, "\n\n"))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never returned")
	}
}
