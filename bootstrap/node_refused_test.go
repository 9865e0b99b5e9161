package bootstrap_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/bootstrap"
	"iop/internal/lockedbuf"
)

// fileEdge is an in-process edge started from an edge.yaml it can reload.
type fileEdge struct {
	settings bootstrap.EdgeSettings
	path     string
	http     string // host:port of the HTTP API
	link     string // host:port of the node link
	logs     *lockedbuf.Buffer
}

// startFileEdge writes file to an edge.yaml, with {{link}} and {{http}} replaced
// by free addresses, and starts an edge on it.
func startFileEdge(t *testing.T, file string, opts ...fx.Option) *fileEdge {
	t.Helper()
	e := &fileEdge{link: freeAddr(t), http: freeAddr(t), logs: &lockedbuf.Buffer{}}
	e.path = filepath.Join(t.TempDir(), "edge.yaml")
	e.write(t, file)
	cfg, err := config.LoadEdge(e.path)
	if err != nil {
		t.Fatal(err)
	}
	e.settings = bootstrap.EdgeSettings{Config: cfg, ConfigPath: e.path, Logger: slog.New(slog.NewTextHandler(e.logs, nil))}
	app := fxtest.New(t, append([]fx.Option{bootstrap.Edge(e.settings), fx.NopLogger}, opts...)...)
	app.RequireStart()
	t.Cleanup(app.RequireStop)
	return e
}

func (e *fileEdge) write(t *testing.T, file string) {
	t.Helper()
	file = strings.NewReplacer("{{link}}", e.link, "{{http}}", e.http).Replace(file)
	if err := os.WriteFile(e.path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
}

// call sends a JSON request to the edge's API and decodes its answer into out.
func (e *fileEdge) call(t *testing.T, method, path string, body any, want int, out any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+e.http+path, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %s: %v", method, path, b, err)
		}
	}
}

// waitFor polls cond every 20 ms until it holds, failing after limit (a
// bound for a hang, not a measurement).
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

const refusedEdge = `
transport: {listen: "{{link}}"}
http: {listen: "{{http}}"}
nodes:
  - id: n1
    token: TOKEN
    adapters: [{name: exec, type: exec, targets: {sleep: {command: ["sleep", "3600"]}}}]
`

// A node whose token a reload changed is cut off, and refused when it
// registers again. It says so at once, naming its runs in flight, and stops
// them as SIGTERM does before it exits 1: it used to say nothing and go on
// until its background runs ended on their own (here an hour).
func TestNodeRefusedWithRunsInFlightSaysSoAndStops(t *testing.T) {
	e := startFileEdge(t, strings.Replace(refusedEdge, "TOKEN", "refused-test-token-1", 1))
	var nodeLogs lockedbuf.Buffer
	node := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{
		Edge: e.link, Token: "refused-test-token-1", Transport: nodeLink(t, e.settings),
		Logger:     slog.New(slog.NewTextHandler(&nodeLogs, nil)),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		DB: "file:" + filepath.Join(t.TempDir(), "n.db") + "?cache=shared&mode=rwc",
	}), fx.NopLogger)
	node.RequireStart()
	stopped := false
	defer func() {
		if !stopped {
			node.RequireStop()
		}
	}()
	waitFor(t, 10*time.Second, "the node to register", func() bool {
		var list struct {
			Nodes []struct {
				Connected bool `json:"connected"`
			} `json:"nodes"`
		}
		e.call(t, "GET", "/v1/nodes", nil, 200, &list)
		return len(list.Nodes) == 1 && list.Nodes[0].Connected
	})
	var run struct {
		RunID string `json:"run_id"`
	}
	e.call(t, "POST", "/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "sleep", "background": true}, 202, &run)

	e.write(t, strings.Replace(refusedEdge, "TOKEN", "refused-test-token-2", 1))
	var res struct {
		Disconnected []string `json:"disconnected"`
	}
	e.call(t, "POST", "/v1/admin/reload", nil, 200, &res)
	if len(res.Disconnected) != 1 {
		t.Fatalf("reload = %+v, want n1 disconnected", res)
	}

	select {
	case sig := <-node.Wait():
		if sig.ExitCode != 1 {
			t.Fatalf("node stopping with exit code %d, want 1", sig.ExitCode)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the refused node did not begin to stop; its log:\n%s", nodeLogs.String())
	}
	logs := nodeLogs.String()
	if !strings.Contains(logs, "the edge refused this node's token") || !strings.Contains(logs, "exiting once its 1 run in flight is stopped") || !strings.Contains(logs, "runs_in_flight=1") {
		t.Fatalf("the refusal was not logged with the run in flight:\n%s", logs)
	}
	// The stop ends the run (an hour of sleep) within the stop's limits.
	node.RequireStop()
	stopped = true
}
