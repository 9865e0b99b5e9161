package bootstrap_test

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/bootstrap"
	"iop/internal/lockedbuf"
)

const (
	warnPlainAPI     = "http.listen is not a loopback address and http.tls is not set: API keys and all run data cross the network in clear"
	warnPublicMetric = "metrics.listen is not a loopback address: GET /metrics there needs no key"
	warnPlainLink    = "the link to the edge is plaintext (--insecure) and the edge is not on a loopback address"
)

// startEdge starts an edge from doc and returns what it logged at start.
func startEdge(t *testing.T, doc string) string {
	t.Helper()
	cfg, err := config.ParseEdge(filepath.Join(t.TempDir(), "edge.yaml"), []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedbuf.Buffer
	edge := fxtest.New(t, bootstrap.Edge(bootstrap.EdgeSettings{Config: cfg, Logger: slog.New(slog.NewTextHandler(&logs, nil))}), fx.NopLogger)
	edge.RequireStart()
	edge.RequireStop()
	return logs.String()
}

// A keyed API on a network address without http.tls, and metrics.listen on
// a network address, are warned about once at start; on loopback they are
// not.
func TestEdgeWarnsOfCleartextAPIAndPublicMetrics(t *testing.T) {
	// Port 0: the kernel picks a free one at bind (a port found free on
	// loopback could be taken on 0.0.0.0 by another test meanwhile).
	doc := func(host string) string {
		return `
transport: {listen: "127.0.0.1:0"}
http:
  listen: "` + host + `:0"
  api_keys: [{name: ops, key_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, scopes: [admin]}]
metrics: {listen: "` + host + `:0"}
`
	}
	logs := startEdge(t, doc("0.0.0.0"))
	for _, w := range []string{warnPlainAPI, warnPublicMetric} {
		if n := strings.Count(logs, w); n != 1 || !strings.Contains(logs, "level=WARN msg=\""+w) {
			t.Errorf("public edge logged %q %d times, want one warning:\n%s", w, n, logs)
		}
	}
	logs = startEdge(t, doc("127.0.0.1"))
	for _, w := range []string{warnPlainAPI, warnPublicMetric} {
		if strings.Contains(logs, w) {
			t.Errorf("loopback edge warned %q:\n%s", w, logs)
		}
	}
}

// A node whose plaintext link (--insecure) goes to an edge that is not on
// loopback warns once at start: its token crosses the network in clear.
func TestNodeWarnsOfPlaintextLinkOffLoopback(t *testing.T) {
	for edge, want := range map[string]bool{"192.0.2.1:7700": true, "edge.example.com:7700": true, "127.0.0.1:1": false, "localhost:1": false} {
		var logs lockedbuf.Buffer
		node := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{
			Edge: edge, Token: "graph-test-token", Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			DB: "file:" + filepath.Join(t.TempDir(), "n.db") + "?cache=shared&mode=rwc",
		}), fx.NopLogger)
		node.RequireStart()
		node.RequireStop()
		if n := strings.Count(logs.String(), warnPlainLink); (n == 1) != want || n > 1 {
			t.Errorf("node dialing %s in plaintext warned %d times, want %v:\n%s", edge, n, want, logs.String())
		}
	}
}
