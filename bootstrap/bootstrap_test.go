package bootstrap_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/adapters/transport"
	"iop/bootstrap"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func edgeSettings(t *testing.T, transport, httpAddr string) bootstrap.EdgeSettings {
	t.Helper()
	cfg, err := config.ParseEdge(filepath.Join(t.TempDir(), "edge.yaml"), []byte(`
transport: {listen: "`+transport+`"}
http: {listen: "`+httpAddr+`"}
nodes:
  - id: n1
    token: graph-test-token
    adapters: [{name: exec, type: exec, targets: {echo: {command: ["cat"]}}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	return bootstrap.EdgeSettings{Config: cfg, Logger: quiet()}
}

// nodeLink is the node-side link settings that trust the edge of es by its
// CA pin, as iop-node --ca-pin does.
func nodeLink(t *testing.T, es bootstrap.EdgeSettings) transport.Config {
	t.Helper()
	lt, err := bootstrap.OpenLinkTLS(es.Config, quiet())
	if err != nil {
		t.Fatal(err)
	}
	nc := &config.NodeConfig{Edge: es.Config.Transport.Listen, TLS: config.NodeTLS{CAPin: lt.Pin}}
	tc, err := bootstrap.NodeLinkTLS(nc)
	if err != nil || tc == nil {
		t.Fatalf("node TLS: %v", err)
	}
	return transport.Config{TLS: tc}
}

func TestGraphsValidate(t *testing.T) {
	if err := fx.ValidateApp(bootstrap.Edge(edgeSettings(t, "127.0.0.1:0", "127.0.0.1:0")), fx.NopLogger); err != nil {
		t.Fatalf("edge graph: %v", err)
	}
	if err := fx.ValidateApp(bootstrap.Node(bootstrap.NodeSettings{Edge: "127.0.0.1:1", Token: "x", DB: "file::memory:", Logger: quiet()}), fx.NopLogger); err != nil {
		t.Fatalf("node graph: %v", err)
	}
}

// TestEdgeAndNodeStartTogether starts both graphs in-process on free ports,
// waits for the node to register, and stops both cleanly.
func TestEdgeAndNodeStartTogether(t *testing.T) {
	tAddr, hAddr := freeAddr(t), freeAddr(t)
	es := edgeSettings(t, tAddr, hAddr)
	edge := fxtest.New(t, bootstrap.Edge(es), fx.NopLogger)
	edge.RequireStart()
	defer edge.RequireStop()

	node := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{
		Edge: tAddr, Token: "graph-test-token", Logger: quiet(), Transport: nodeLink(t, es),
		DB: "file:" + filepath.Join(t.TempDir(), "n.db") + "?cache=shared&mode=rwc",
	}), fx.NopLogger)
	node.RequireStart()
	defer node.RequireStop()

	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + hAddr + "/v1/nodes")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), `"id":"n1"`) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("node never registered")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBusyPortFailsStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	app := fx.New(bootstrap.Edge(edgeSettings(t, ln.Addr().String(), "127.0.0.1:0")), fx.NopLogger)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = app.Start(ctx)
	if err == nil {
		_ = app.Stop(ctx)
		t.Fatal("edge started on a busy transport port")
	}
	if !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("unclear start error: %v", err)
	}
}

func TestNodeWithoutTokenFailsStart(t *testing.T) {
	app := fx.New(bootstrap.Node(bootstrap.NodeSettings{Edge: "127.0.0.1:1", DB: "file::memory:", Logger: quiet()}), fx.NopLogger)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := app.Start(ctx); err == nil || !strings.Contains(err.Error(), "token") {
		_ = app.Stop(ctx)
		t.Fatalf("start without token: %v", err)
	}
}

// freeAddr is a loopback address free a moment ago, for a listener the
// test starts later.
func freeAddr(t *testing.T) string {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		// The kernel hands a port just closed out again (about one pair of
		// calls in 6,000): an edge given the same address for its link and
		// its HTTP API failed to start. One returned before is not used twice.
		if _, taken := handedOut.LoadOrStore(addr, true); !taken {
			return addr
		}
	}
}

// handedOut holds every address freeAddr returned in this process.
var handedOut sync.Map

// http.max_connections_per_address reaches the HTTP listener: past it a
// connection is answered 503 too_many_connections.
func TestHTTPConnectionCapFromConfig(t *testing.T) {
	hAddr := freeAddr(t)
	es := edgeSettings(t, freeAddr(t), hAddr)
	es.Config.HTTP.MaxConnectionsPerAddress = 2
	edge := fxtest.New(t, bootstrap.Edge(es), fx.NopLogger)
	edge.RequireStart()
	defer edge.RequireStop()

	status := func(nc net.Conn) int {
		t.Helper()
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(nc, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 3 {
		nc, err := net.Dial("tcp", hAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		want := 200
		if i == 2 {
			want = 503
		}
		if got := status(nc); got != want {
			t.Fatalf("connection %d: status %d; want %d", i+1, got, want)
		}
	}
}
