package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/adapters/store/pgtest"
)

// Two edges share one PostgreSQL history (store.edge_id a and b), both
// listing node n1 with the same token; n1 is connected to b and runs a
// background run there. A reload of a that removes n1 leaves b's row
// alone: it used to be written failed node_removed while the run went on
// on b (and stayed so once it ended).
func TestSharedHistoryReloadLeavesTheOtherEdgesRuns(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.Own(t)
	store := func(id string) string { return fmt.Sprintf("\nstore:\n  dsn: %q\n  edge_id: %s\n", dsn, id) }
	a := startEdge(t, defaultNodes(4)+store("a"))
	b := startEdge(t, defaultNodes(4)+store("b"))
	startNode(t, b, testToken)
	waitNode(t, b, "n1")

	resp, body := postJSON(t, b.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "sleep", "background": true})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("background run on b: %d %s", resp.StatusCode, body)
	}
	var started struct {
		RunID string `json:"run_id"`
	}
	if err := json.Unmarshal(body, &started); err != nil || started.RunID == "" {
		t.Fatalf("background run on b: %s (%v)", body, err)
	}
	status := func(e *edge) (map[string]any, error) {
		var r map[string]any
		err := getJSON(e.url+"/v1/runs/"+started.RunID, &r)
		return r, err
	}
	// a reads it from the shared history once b has written the row.
	waitFor(t, "b's row running in the history", func() error {
		if r, err := status(a); err != nil || r["status"] != "running" {
			return fmt.Errorf("%v %v", r, err)
		}
		return nil
	})

	// a's config without n1, reloaded; a then stops, writing what it queued.
	cfg, err := os.ReadFile(a.config)
	if err != nil {
		t.Fatal(err)
	}
	without := strings.Replace(string(cfg), defaultNodes(4), "\n"+defaultNodes(4)[strings.Index(defaultNodes(4), "  - id: n2"):], 1)
	if without == string(cfg) {
		t.Fatal("n1 not found in a's config")
	}
	if err := os.WriteFile(a.config, []byte(without), 0o600); err != nil {
		t.Fatal(err)
	}
	resp, body = postJSON(t, a.url+"/v1/admin/reload", map[string]any{})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reload of a: %d %s", resp.StatusCode, body)
	}
	a.proc.stop(syscall.SIGTERM, 10*time.Second)
	if r, err := status(b); err != nil || r["status"] != "running" {
		t.Fatalf("b's run after a's reload removed n1: %v %v, want running", r, err)
	}
	waitNode(t, b, "n1")
}

// Two edges share one PostgreSQL history, each with a node of its own: a
// background run edge a dispatched is listed and read through edge b, and
// a cancel through b (POST or iop cancel) is refused at once naming edge a,
// the one to ask: it said only that node n1 "is not connected", which
// README follows with "cancel again once it is back" — never, through b.
// Through a, the cancel succeeds.
func TestSharedHistoryCancelThroughTheOtherEdgeNamesTheDispatchingEdge(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.Own(t)
	store := func(id string) string { return fmt.Sprintf("\nstore:\n  dsn: %q\n  edge_id: %s\n", dsn, id) }
	nodes := defaultNodes(4)
	n2 := nodes[strings.Index(nodes, "  - id: n2"):]
	a := startEdge(t, nodes[:strings.Index(nodes, "  - id: n2")]+store("a"))
	b := startEdge(t, "\n"+n2+store("b"))
	startNode(t, a, testToken)
	startNode(t, b, "e2e-token-0002")
	waitNode(t, a, "n1")
	waitNode(t, b, "n2")

	resp, body := postJSON(t, a.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "sleep", "background": true})
	var started struct {
		RunID string `json:"run_id"`
	}
	if err := json.Unmarshal(body, &started); resp.StatusCode != http.StatusAccepted || err != nil || started.RunID == "" {
		t.Fatalf("background run on a: %d %s (%v)", resp.StatusCode, body, err)
	}
	waitFor(t, "a's row running, read through b", func() error {
		var r map[string]any
		if err := getJSON(b.url+"/v1/runs/"+started.RunID, &r); err != nil || r["status"] != "running" {
			return fmt.Errorf("%v %v", r, err)
		}
		return nil
	})
	resp, body = postJSON(t, b.url+"/v1/runs/"+started.RunID+"/cancel", map[string]any{})
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), `cancel it through edge \"a\"`) {
		t.Fatalf("cancel through b: %d %s; want 404 naming edge a", resp.StatusCode, body)
	}
	cancel := exec.Command(filepath.Join(binDir, "iop"), "cancel", started.RunID)
	cancel.Env = append(os.Environ(), "IOP_EDGE="+b.url)
	if out, err := cancel.CombinedOutput(); err == nil || !strings.Contains(string(out), `cancel it through edge "a"`) {
		t.Fatalf("iop cancel through b: %v\n%s", err, out)
	}
	resp, body = postJSON(t, a.url+"/v1/runs/"+started.RunID+"/cancel", map[string]any{})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("cancel through a: %d %s", resp.StatusCode, body)
	}
}
