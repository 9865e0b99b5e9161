package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
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
