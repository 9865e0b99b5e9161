package e2e

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// iop node runs reads a node's own store a page at a time: each page's
// stderr names the command for the next, which lists the rest, and a
// cursor the node did not return is a 400 invalid_request through the
// edge's API (exit 1 from the CLI), not a first page again.
func TestNodeRunsPages(t *testing.T) {
	e := startEdge(t, defaultNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")

	var ids []string
	for range 3 {
		resp, body := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "x", "background": true})
		var acc struct {
			RunID string `json:"run_id"`
		}
		if resp.StatusCode != http.StatusAccepted || json.Unmarshal(body, &acc) != nil || acc.RunID == "" {
			t.Fatalf("background run: %d %s", resp.StatusCode, body)
		}
		waitRunStatus(t, e, acc.RunID, "succeeded", 10*time.Second)
		ids = append(ids, acc.RunID)
	}

	out, errOut, code := cli(t, e, "", "node", "runs", "n1", "--limit", "2")
	m := regexp.MustCompile(`^more runs on node n1: iop node runs n1 --limit 2 --cursor (\S+)\n$`).FindStringSubmatch(errOut)
	if code != 0 || m == nil || !strings.Contains(out, ids[2]) || !strings.Contains(out, ids[1]) || strings.Contains(out, ids[0]) {
		t.Fatalf("first page: %d\n%s\nstderr: %q", code, out, errOut)
	}
	out, errOut, code = cli(t, e, "", "node", "runs", "n1", "--limit", "2", "--cursor", m[1])
	if code != 0 || errOut != "" || !strings.Contains(out, ids[0]) || strings.Contains(out, ids[1]) || strings.Contains(out, ids[2]) {
		t.Fatalf("second page: %d\n%s\nstderr: %q", code, out, errOut)
	}

	resp, body := postJSON(t, e.url+"/v1/nodes/n1/commands", map[string]any{"command": "runs", "args": map[string]any{"cursor": "bogus"}})
	var eb struct {
		Error struct{ Code, Message string }
	}
	if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(body, &eb) != nil || eb.Error.Code != "invalid_request" || !strings.Contains(eb.Error.Message, "cursor") {
		t.Fatalf("a foreign cursor: %d %s", resp.StatusCode, body)
	}
	if _, errOut, code = cli(t, e, "", "node", "runs", "n1", "--cursor", "bogus"); code != 1 || !strings.Contains(errOut, "cursor") {
		t.Fatalf("iop node runs --cursor bogus: %d %q", code, errOut)
	}
}
