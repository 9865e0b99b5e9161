package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"iop/adapters/store/pgtest"
)

// monitoringNodes has one node with exec targets and a provider.
func monitoringNodes(p *provider) string {
	return fmt.Sprintf(`
  - id: n1
    token: %s
    adapters:
      - name: exec
        type: exec
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
          fail: {command: ["sh", "-c", "echo partial; echo boom >&2; exit 3"]}
          sleep: {command: ["sh", "-c", "echo started; exec sleep 300"]}
    providers:
      - {name: oai, type: openai, base_url: %q, models: [m-sse, m-500]}
`, testToken, p.URL)
}

// scrapeMetrics GETs url and parses it with the Prometheus text parser.
func scrapeMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	body, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("metrics do not parse: %v\n%s", err, body)
	}
	return fams
}

// metricValue sums the samples of name whose labels include want; a
// histogram counts its observations.
func metricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	var sum float64
next:
	for _, m := range f.Metric {
		for k, v := range want {
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		case m.Summary != nil:
			sum += float64(m.Summary.GetSampleCount())
		}
	}
	return sum
}

type historyRun struct {
	RunID  string `json:"run_id"`
	Node   string `json:"node"`
	Key    string `json:"key"`
	Status string `json:"status"`
}

type historyPage struct {
	Runs       []historyRun `json:"runs"`
	NextCursor string       `json:"next_cursor"`
}

// allRuns walks every page of GET /v1/runs?query.
func allRuns(t *testing.T, e *edge, query string) []historyRun {
	t.Helper()
	var out []historyRun
	cursor := ""
	for range 100 {
		var p historyPage
		url := e.url + "/v1/runs?limit=2&" + query
		if cursor != "" {
			url += "&cursor=" + cursor
		}
		if err := getJSON(url, &p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p.Runs...)
		if p.NextCursor == "" {
			return out
		}
		cursor = p.NextCursor
	}
	t.Fatal("cursor never ended")
	return nil
}

func countStatus(runs []historyRun) map[string]int {
	m := map[string]int{}
	for _, r := range runs {
		m[r.Status]++
	}
	return m
}

type usageResp struct {
	Usage []struct {
		Group        string `json:"group"`
		Runs         int64  `json:"runs"`
		Tunnels      int64  `json:"tunnels"`
		Requests     int64  `json:"requests"`
		Errors       int64  `json:"errors"`
		PromptTokens int64  `json:"prompt_tokens"`
		TotalTokens  int64  `json:"total_tokens"`
		BodyBytes    int64  `json:"body_bytes"`
	} `json:"usage"`
}

// waitFor polls f for up to 15 s.
func waitFor(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: %v", what, err)
}

// monitoringScenario does a known mix of runs, tunnels, errors and cancels,
// then checks that /metrics, the history and usage all say exactly that,
// across an edge restart, with the store at dsn ("" = the default SQLite
// file in the state directory).
func monitoringScenario(t *testing.T, dsn string) {
	p := newProvider(t)
	metricsAddr := freeAddr(t)
	extra := fmt.Sprintf("\nmetrics:\n  listen: %q\n", metricsAddr)
	if dsn != "" {
		extra += fmt.Sprintf("store:\n  dsn: %q\n", dsn)
	}
	e := startEdge(t, monitoringNodes(p)+extra)
	startNode(t, e, testToken, "IOP_NODE_STATS_INTERVAL=100ms")
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// 3 runs succeed, 1 fails, 1 is cancelled, 1 background run keeps going.
	for i := range 3 {
		evs := collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": fmt.Sprint("x", i)}))
		if evs[len(evs)-1].Type != "complete" {
			t.Fatalf("run %d: %+v", i, evs)
		}
	}
	if evs := collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "fail"})); evs[len(evs)-1].Type != "error" {
		t.Fatalf("fail run: %+v", evs)
	}
	runID, _, resp, r := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "sleep"})
	if rr, body := postJSON(t, e.url+"/v1/runs/"+runID+"/cancel", nil); rr.StatusCode != 200 {
		t.Fatalf("cancel: %d %s", rr.StatusCode, body)
	}
	for {
		ev, err := r.Next()
		if err != nil || ev.Event == "cancelled" {
			break
		}
	}
	resp.Body.Close()
	rr, body := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "sleep", "background": true})
	if rr.StatusCode != http.StatusAccepted {
		t.Fatalf("background run: %d %s", rr.StatusCode, body)
	}
	var bg struct {
		RunID string `json:"run_id"`
	}
	_ = json.Unmarshal(body, &bg)

	// 2 tunnels stream with usage (7 prompt + 40 completion each), 1 gets a 500.
	// The second spells the model "m-sse:latest": it is counted, as the
	// first, under the name the provider declares.
	for i, model := range []string{"m-sse", "m-sse:latest"} {
		resp := postTunnel(t, ctx, e.url+"/v1/chat/completions", fmt.Sprint("s", i), chatBody(model, true))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), "[DONE]") {
			t.Fatalf("tunnel %d: %d %s", i, resp.StatusCode, b)
		}
	}
	resp = postTunnel(t, ctx, e.url+"/v1/chat/completions", "e1", chatBody("m-500", false))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 {
		t.Fatalf("m-500 tunnel: %d", resp.StatusCode)
	}

	// /metrics on the API listener and on metrics.listen alone.
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"iop_runs_total", map[string]string{"node": "n1", "adapter": "exec", "status": "succeeded"}, 3},
		{"iop_runs_total", map[string]string{"node": "n1", "adapter": "exec", "status": "failed"}, 1},
		{"iop_runs_total", map[string]string{"node": "n1", "adapter": "exec", "status": "cancelled"}, 1},
		{"iop_run_duration_seconds", map[string]string{"adapter": "exec"}, 5},
		{"iop_runs_in_flight", map[string]string{"node": "n1", "adapter": "exec"}, 1},
		{"iop_tunnel_requests_total", map[string]string{"node": "n1", "provider": "oai", "model": "m-sse", "code": "200"}, 2},
		{"iop_tunnel_requests_total", map[string]string{"node": "n1", "provider": "oai", "model": "m-500", "code": "500"}, 1},
		{"iop_tunnel_first_byte_seconds", nil, 3},
		{"iop_tokens_total", map[string]string{"node": "n1", "model": "m-sse", "kind": "prompt"}, 14},
		{"iop_tokens_total", map[string]string{"node": "n1", "model": "m-sse", "kind": "completion"}, 80},
		{"iop_nodes_connected", nil, 1},
		{"iop_node_registrations_total", map[string]string{"outcome": "accepted"}, 1},
		{"iop_history_dropped_rows_total", nil, 0},
		// What the node reports about itself over its link.
		{"iop_node_adapter_slots_in_use", map[string]string{"node": "n1", "adapter": "exec"}, 1},
		{"iop_node_child_processes", map[string]string{"node": "n1"}, 1},
		{"iop_node_provider_first_byte_seconds", map[string]string{"node": "n1", "provider": "oai"}, 3},
	}
	waitFor(t, "metrics match what the test did", func() error {
		for _, url := range []string{e.url + "/metrics", "http://" + metricsAddr + "/metrics"} {
			f := scrapeMetrics(t, url)
			for _, c := range checks {
				if got := metricValue(f, c.name, c.labels); got != c.want {
					return fmt.Errorf("%s: %s%v = %v, want %v", url, c.name, c.labels, got, c.want)
				}
			}
			for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "iop_link_heartbeat_rtt_seconds", "iop_eventbus_dropped_total"} {
				if f[name] == nil {
					return fmt.Errorf("%s missing", name)
				}
			}
			if v := metricValue(f, "iop_link_frames_total", map[string]string{"node": "n1", "direction": "in"}); v <= 0 {
				return fmt.Errorf("no frames counted in from n1 (%v)", v)
			}
			if v := metricValue(f, "iop_tunnel_body_bytes_total", map[string]string{"direction": "out"}); v <= 0 {
				return fmt.Errorf("no tunnel bytes out (%v)", v)
			}
			if v := metricValue(f, "iop_node_store_bytes", map[string]string{"node": "n1"}); v <= 0 {
				return fmt.Errorf("node store size not reported (%v)", v)
			}
		}
		return nil
	})

	checkHistory := func(stage string, wantRunning int) {
		t.Helper()
		waitFor(t, stage+": history", func() error {
			runs := allRuns(t, e, "node=n1")
			got := countStatus(runs)
			want := map[string]int{"succeeded": 3, "failed": 1, "cancelled": 2 - wantRunning, "running": wantRunning}
			for k, v := range want {
				if got[k] != v {
					return fmt.Errorf("statuses %v, want %v", got, want)
				}
			}
			if len(runs) != 6 {
				return fmt.Errorf("%d runs, want 6", len(runs))
			}
			for _, r := range runs {
				if r.Key != "anonymous" || r.Node != "n1" {
					return fmt.Errorf("run %+v", r)
				}
			}
			if failed := allRuns(t, e, "status=failed&adapter=exec&key=anonymous"); len(failed) != 1 {
				return fmt.Errorf("%d failed runs", len(failed))
			}
			var u usageResp
			if err := getJSON(e.url+"/v1/usage?group_by=key", &u); err != nil {
				return err
			}
			if len(u.Usage) != 1 || u.Usage[0].Group != "anonymous" || u.Usage[0].Runs != 6 || u.Usage[0].Tunnels != 3 ||
				u.Usage[0].Requests != 9 || u.Usage[0].Errors != 1 || u.Usage[0].TotalTokens != 94 || u.Usage[0].BodyBytes <= 0 {
				return fmt.Errorf("usage by key %+v", u.Usage)
			}
			if err := getJSON(e.url+"/v1/usage?group_by=model", &u); err != nil {
				return err
			}
			for _, g := range u.Usage {
				if g.Group == "m-sse" && (g.Tunnels != 2 || g.PromptTokens != 14) {
					return fmt.Errorf("usage by model %+v", u.Usage)
				}
			}
			return nil
		})
	}
	checkHistory("before restart", 1)
	out, errOut, code := cli(t, e, "", "usage", "--by", "node")
	if code != 0 || !strings.Contains(out, "n1") || !strings.Contains(out, "REQUESTS") || !strings.Contains(out, " 9 ") {
		t.Fatalf("iop usage: %d\n%s%s", code, out, errOut)
	}

	// The edge restarts: the history is still there, and the background
	// run still in flight on the node can be cancelled.
	e.stop(syscall.SIGTERM, 10*time.Second)
	e.proc = startEdgeProc(t, e.config)
	waitHealthy(t, e.url, e.proc)
	waitNode(t, e, "n1")
	checkHistory("after restart", 1)
	if rr, body := postJSON(t, e.url+"/v1/runs/"+bg.RunID+"/cancel", nil); rr.StatusCode != 200 || !strings.Contains(string(body), `"node":"n1"`) {
		t.Fatalf("cancel after restart: %d %s", rr.StatusCode, body)
	}
	checkHistory("after cancel", 0)
	// The node agrees: the run is cancelled in its own store.
	waitFor(t, "node store says cancelled", func() error {
		rr, body := postJSON(t, e.url+"/v1/nodes/n1/commands", map[string]any{"command": "run_get", "args": map[string]string{"run_id": bg.RunID}})
		if rr.StatusCode != 200 || !strings.Contains(string(body), `"status":"cancelled"`) {
			return fmt.Errorf("%d %s", rr.StatusCode, body)
		}
		return nil
	})
	if rr, body := postJSON(t, e.url+"/v1/runs/"+bg.RunID+"/cancel", nil); rr.StatusCode != 409 {
		t.Fatalf("second cancel after restart: %d %s", rr.StatusCode, body)
	}
}

func TestMonitoringSQLite(t *testing.T) {
	t.Parallel()
	monitoringScenario(t, "")
}

func TestMonitoringPostgres(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.Own(t)
	monitoringScenario(t, dsn)
}

// With the database stopped mid-test, runs keep working and the dropped
// history rows are counted.
func TestHistoryOutageCostsRowsNotRuns(t *testing.T) {
	t.Parallel()
	srv, dsn := pgtest.Own(t)
	e := startEdge(t, defaultNodes(4)+fmt.Sprintf("\nstore:\n  dsn: %q\n", dsn))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := func() {
		t.Helper()
		evs := collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "x"}))
		checkWellFormed(t, evs)
		if evs[len(evs)-1].Type != "complete" {
			t.Fatalf("run: %+v", evs)
		}
	}
	run()
	waitFor(t, "the first run recorded", func() error {
		if runs := allRuns(t, e, ""); len(runs) != 1 {
			return fmt.Errorf("%d runs", len(runs))
		}
		return nil
	})
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		run()
	}
	waitFor(t, "dropped rows counted", func() error {
		if v := metricValue(scrapeMetrics(t, e.url+"/metrics"), "iop_history_dropped_rows_total", nil); v < 3 {
			return fmt.Errorf("iop_history_dropped_rows_total = %v", v)
		}
		return nil
	})
	// The history cannot be read: a clear error, not a hang.
	resp, err := http.Get(e.url + "/v1/runs")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "history_unavailable") {
		t.Fatalf("GET /v1/runs with the database down: %d %s", resp.StatusCode, b)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	run()
	waitFor(t, "recording again after the database came back", func() error {
		if runs := allRuns(t, e, ""); len(runs) < 2 {
			return fmt.Errorf("%d runs", len(runs))
		}
		return nil
	})
}

// --pprof serves the profiler on loopback and is refused anywhere else.
func TestPprofLoopbackOnly(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(cfg, []byte(edgeConfig(freeAddr(t), freeAddr(t), defaultNodes(1))), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := start(t, "iop-edge", nil, "--config", cfg, "--pprof", "0.0.0.0:0")
	if code := bad.waitExit(t, 10*time.Second); code != 2 || !strings.Contains(bad.out.String(), "loopback") {
		t.Fatalf("--pprof on all interfaces: exit %d\n%s", code, bad.out.String())
	}
	addr := freeAddr(t)
	good := start(t, "iop-edge", nil, "--config", cfg, "--pprof", addr)
	waitFor(t, "pprof index", func() error {
		if good.exited() {
			t.Fatalf("edge exited: %s", good.out.String())
		}
		resp, err := http.Get("http://" + addr + "/debug/pprof/")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), "goroutine") {
			return fmt.Errorf("%d %s", resp.StatusCode, b)
		}
		return nil
	})
}

// The history records each request's key name; usage sums by it; a key
// limited to some nodes sees only their runs and usage; /metrics needs read
// and, covering every node, is refused to the node-limited key.
func TestHistoryByKeyName(t *testing.T) {
	t.Parallel()
	e, _, _, _ := authEdge(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runFor := func(key, node string) string {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"node": node, "adapter": "exec", "target": "upper", "input": "hi"})
		evs := collectRun(t, startRunKey(t, ctx, e, key, body))
		if evs[len(evs)-1].Type != "complete" {
			t.Fatalf("run as %s: %+v", key, evs)
		}
		return evs[0].RunID
	}
	runnerRun := runFor(runsKey, "n1")
	runFor(n2Key, "n2")
	status, _, b := request(t, ctx, "POST", e.url+"/v1/chat/completions", inferenceKey, chatBody("m-sse", false))
	if status != 200 {
		t.Fatalf("tunnel: %d %s", status, b)
	}

	getAs := func(key, path string, v any) int {
		t.Helper()
		status, _, b := request(t, ctx, "GET", e.url+path, key, nil)
		if status == 200 && v != nil {
			if err := json.Unmarshal(b, v); err != nil {
				t.Fatalf("%s: %v %s", path, err, b)
			}
		}
		return status
	}
	waitFor(t, "usage by key name", func() error {
		var u usageResp
		if st := getAs(adminKey, "/v1/usage?group_by=key", &u); st != 200 {
			return fmt.Errorf("status %d", st)
		}
		got := map[string][2]int64{}
		for _, g := range u.Usage {
			got[g.Group] = [2]int64{g.Runs, g.Tunnels}
		}
		want := map[string][2]int64{"runner": {1, 0}, "n2-only": {1, 0}, "inferer": {0, 1}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("usage by key %v, want %v", got, want)
		}
		return nil
	})
	var p historyPage
	if getAs(readKey, "/v1/runs?key=runner", &p); len(p.Runs) != 1 || p.Runs[0].RunID != runnerRun || p.Runs[0].Key != "runner" {
		t.Fatalf("runs of key runner: %+v", p.Runs)
	}
	// The n2-only key sees n2's history only.
	p = historyPage{}
	if getAs(n2Key, "/v1/runs", &p); len(p.Runs) != 1 || p.Runs[0].Node != "n2" {
		t.Fatalf("n2-only key lists %+v", p.Runs)
	}
	if st := getAs(n2Key, "/v1/runs/"+runnerRun, nil); st != 404 {
		t.Fatalf("n2-only key reads a run of n1: %d", st)
	}
	var u usageResp
	if getAs(n2Key, "/v1/usage?group_by=node", &u); len(u.Usage) != 1 || u.Usage[0].Group != "n2" {
		t.Fatalf("n2-only key usage %+v", u.Usage)
	}
	if st := getAs("", "/metrics", nil); st != 401 {
		t.Fatalf("/metrics without a key: %d", st)
	}
	if st := getAs(readKey, "/metrics", nil); st != 200 {
		t.Fatalf("/metrics with a read key: %d", st)
	}
	if st := getAs(n2Key, "/metrics", nil); st != 403 {
		t.Fatalf("/metrics with the n2-only key: %d", st)
	}
}

// A bare stats interval is refused saying a unit is needed, as edge.yaml's
// durations are, not with flag's "parse error" and the whole usage text.
func TestNodeAsksForAStatsIntervalUnit(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	for _, o := range []nodeOptions{{env: []string{"IOP_NODE_STATS_INTERVAL=30"}}, {args: []string{"--stats-interval", "30"}}} {
		n := startNodeOpts(t, e, testToken, o)
		if code := n.waitExit(t, 10*time.Second); code != 2 || !strings.Contains(n.out.String(), `invalid duration "30" (use Go syntax with a unit`) {
			t.Fatalf("%+v: exit %d, want 2 asking for a unit:\n%s", o, code, n.out.String())
		}
	}
}
