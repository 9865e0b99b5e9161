package bootstrap_test

import (
	"bufio"
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun/driver/sqliteshim"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/bootstrap"
)

// An edge stopping while a provider tunnel still streams gives the HTTP
// server only part of its stop time: the tunnel is cut when that runs out,
// and the rest of the stop still runs in time — the history's last writes,
// this tunnel's record among them, reach the file, and the stop reports no
// failure. The HTTP server used to wait out the whole stop time, after
// which fx skipped the history's closing hook.
func TestStopCutsAStreamingTunnelAndKeepsTheHistory(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"x\":1}\n\n"))
		w.(http.Flusher).Flush()
		select { // a long generation
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer upstream.Close()

	dir := t.TempDir()
	edge, node, hAddr := tunnelPair(t, dir, upstream.URL)
	defer node.RequireStop()
	resp, _ := openStream(t, hAddr)
	defer resp.Body.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	began := time.Now()
	if err := edge.Stop(ctx); err != nil {
		t.Fatalf("stop after %v: %v", time.Since(began), err)
	}
	db, err := sql.Open(sqliteshim.ShimName, "file:"+filepath.Join(dir, "edge-state", "edge.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM edge_tunnels").Scan(&n); err != nil || n != 1 {
		t.Fatalf("edge_tunnels rows after the stop: %d, %v; want the cut tunnel's", n, err)
	}
}

// A node stopping while a provider tunnel streams lets it end before its
// link closes: the edge sends it no new request once it drains, and the
// caller gets the whole answer. The node used to close its link at once
// (it waited for its runs only), cutting the answer short.
func TestNodeStopLetsAStreamingTunnelEnd(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	releaseNow := func() { once.Do(func() { close(release) }) }
	defer releaseNow()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"x\":1}\n\n"))
		w.(http.Flusher).Flush()
		select { // a generation still going when the node is told to stop
		case <-release:
			_, _ = w.Write([]byte("data: {\"x\":2}\n\ndata: [DONE]\n\n"))
		case <-r.Context().Done():
		}
	}))
	defer upstream.Close()

	edge, node, hAddr := tunnelPair(t, t.TempDir(), upstream.URL)
	defer edge.RequireStop()
	resp, body := openStream(t, hAddr)
	defer resp.Body.Close()

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		stopped <- node.Stop(ctx)
	}()
	// The generation goes on once the edge knows the node is stopping (or
	// has lost it: the cut this test guards against).
	for deadline := time.Now().Add(10 * time.Second); ; {
		r, err := http.Get("http://" + hAddr + "/v1/nodes")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if strings.Contains(string(b), `"draining":true`) || strings.Contains(string(b), `"connected":false`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node never drained: %s", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	releaseNow()
	rest, err := io.ReadAll(body)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the rest of the answer: %q, %v; want it whole", rest, err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("node stop: %v", err)
	}
}

// tunnelPair starts an edge (its state in dir) and a node with one
// OpenAI-type provider at upstream, serving model m; the caller stops them.
func tunnelPair(t *testing.T, dir, upstream string) (edge, node *fxtest.App, hAddr string) {
	t.Helper()
	tAddr, hAddr := freeAddr(t), freeAddr(t)
	cfg, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte(`
transport: {listen: "`+tAddr+`"}
http: {listen: "`+hAddr+`"}
nodes:
  - id: n1
    token: graph-test-token
    providers: [{name: vllm, type: openai, base_url: "`+upstream+`", models: [m]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	es := bootstrap.EdgeSettings{Config: cfg, Logger: quiet()}
	edge = fxtest.New(t, bootstrap.Edge(es), fx.NopLogger)
	edge.RequireStart()
	node = fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{
		Edge: tAddr, Token: "graph-test-token", Logger: quiet(), Transport: nodeLink(t, es),
		DB: "file:" + filepath.Join(t.TempDir(), "n.db") + "?cache=shared&mode=rwc",
	}), fx.NopLogger)
	node.RequireStart()
	return edge, node, hAddr
}

// openStream posts a streamed chat completion for m to the edge at hAddr,
// once its node serves it, and returns the answer with its first line read.
func openStream(t *testing.T, hAddr string) (*http.Response, *bufio.Reader) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Post("http://"+hAddr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
		if err == nil && resp.StatusCode == 200 {
			body := bufio.NewReader(resp.Body)
			if line, err := body.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
				resp.Body.Close()
				t.Fatalf("first line %q, %v", line, err)
			}
			return resp, body
		}
		if resp != nil {
			resp.Body.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tunnel never opened: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
