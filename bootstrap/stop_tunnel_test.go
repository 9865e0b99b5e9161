package bootstrap_test

import (
	"bufio"
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
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
	tAddr, hAddr := freeAddr(t), freeAddr(t)
	cfg, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte(`
transport: {listen: "`+tAddr+`"}
http: {listen: "`+hAddr+`"}
nodes:
  - id: n1
    token: graph-test-token
    providers: [{name: vllm, type: openai, base_url: "`+upstream.URL+`", models: [m]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	es := bootstrap.EdgeSettings{Config: cfg, Logger: quiet()}
	edge := fxtest.New(t, bootstrap.Edge(es), fx.NopLogger)
	edge.RequireStart()
	node := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{
		Edge: tAddr, Token: "graph-test-token", Logger: quiet(), Transport: nodeLink(t, es),
		DB: "file:" + filepath.Join(t.TempDir(), "n.db") + "?cache=shared&mode=rwc",
	}), fx.NopLogger)
	node.RequireStart()
	defer node.RequireStop()

	var resp *http.Response
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err = http.Post("http://"+hAddr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
		if err == nil && resp.StatusCode == 200 {
			break
		}
		if resp != nil {
			resp.Body.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tunnel never opened: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer resp.Body.Close()
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}

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
