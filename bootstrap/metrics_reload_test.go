package bootstrap_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/bootstrap"
)

// A reload that removes an adapter leaves its runs in flight going on the
// node: iop_runs_in_flight keeps counting them under that adapter until
// they end, so the gauge counts every run in flight.
func TestRunsInFlightOfARemovedAdapterStayCounted(t *testing.T) {
	tAddr, hAddr := freeAddr(t), freeAddr(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	write := func(adapters string) {
		t.Helper()
		doc := "transport: {listen: \"" + tAddr + "\"}\nhttp: {listen: \"" + hAddr + "\"}\nnodes:\n  - id: n1\n    token: graph-test-token\n    adapters:\n" + adapters
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	keep := "      - {name: keep, type: exec, targets: {echo: {command: [\"cat\"]}}}\n"
	write(keep + "      - {name: slow, type: exec, targets: {hold: {command: [\"sleep\", \"60\"]}}}\n")
	cfg, err := config.LoadEdge(path)
	if err != nil {
		t.Fatal(err)
	}
	es := bootstrap.EdgeSettings{Config: cfg, ConfigPath: path, Logger: quiet()}
	edge := fxtest.New(t, bootstrap.Edge(es), fx.NopLogger)
	edge.RequireStart()
	defer edge.RequireStop()
	node := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{
		Edge: tAddr, Token: "graph-test-token", Logger: quiet(), Transport: nodeLink(t, es),
		DB: "file:" + filepath.Join(dir, "n.db") + "?cache=shared&mode=rwc",
	}), fx.NopLogger)
	node.RequireStart()
	defer node.RequireStop()

	base := "http://" + hAddr
	call := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	inFlight := func(adapter string) string { // the series' value, "" when there is none
		_, b := call("GET", "/metrics", "")
		m := regexp.MustCompile(`(?m)^iop_runs_in_flight\{adapter="` + adapter + `",node="n1"\} (\S+)$`).FindStringSubmatch(b)
		if m == nil {
			return ""
		}
		return m[1]
	}
	until("the node to register", func() bool { _, b := call("GET", "/healthz", ""); return strings.Contains(b, `"nodes":1`) })

	code, b := call("POST", "/v1/runs", `{"node":"n1","adapter":"slow","target":"hold","background":true}`)
	var run struct {
		RunID string `json:"run_id"`
	}
	if code != http.StatusAccepted || json.Unmarshal([]byte(b), &run) != nil || run.RunID == "" {
		t.Fatalf("start a run: %d %s", code, b)
	}
	if got := inFlight("slow"); got != "1" {
		t.Fatalf("iop_runs_in_flight{adapter=slow} = %q before the reload; want 1", got)
	}

	write(keep) // slow removed
	if code, b := call("POST", "/v1/admin/reload", ""); code != 200 || !strings.Contains(b, `"refreshed":["n1"]`) {
		t.Fatalf("reload: %d %s", code, b)
	}
	if _, b := call("GET", "/v1/nodes/n1", ""); strings.Contains(b, `"name":"slow"`) || !strings.Contains(b, `"runs_in_flight":1`) {
		t.Fatalf("after the reload the node's adapters should lack slow, its run still in flight: %s", b)
	}
	if got := inFlight("slow"); got != "1" {
		t.Fatalf("iop_runs_in_flight{adapter=slow} = %q after the reload removed slow while its run goes on; want 1", got)
	}
	if got := inFlight("keep"); got != "0" {
		t.Fatalf("iop_runs_in_flight{adapter=keep} = %q; want 0", got)
	}

	if code, b := call("POST", "/v1/runs/"+run.RunID+"/cancel", ""); code >= 300 {
		t.Fatalf("cancel: %d %s", code, b)
	}
	until("the removed adapter's series to go once its run ended", func() bool { return inFlight("slow") == "" })
}
