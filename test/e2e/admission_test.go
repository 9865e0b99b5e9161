package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCancelRightAfterAcceptedIsNeverLost is issue 9.5: eight clients each
// start background runs and cancel every one the moment its 202 arrives.
// Every cancel must succeed and every run must be recorded as cancelled.
func TestCancelRightAfterAcceptedIsNeverLost(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(64))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")

	const clients, perClient = 8, 6
	var mu sync.Mutex
	var ids []string
	var failures []string
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perClient {
				resp, body := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "sleep", "background": true,
					"session_id": fmt.Sprintf("c%d-%d", c, i)})
				if resp.StatusCode != http.StatusAccepted {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("start: %d %s", resp.StatusCode, body))
					mu.Unlock()
					continue
				}
				var acc struct {
					RunID string `json:"run_id"`
				}
				_ = json.Unmarshal(body, &acc)
				cresp, cbody := postJSON(t, e.url+"/v1/runs/"+acc.RunID+"/cancel", nil)
				mu.Lock()
				ids = append(ids, acc.RunID)
				if cresp.StatusCode != http.StatusOK {
					failures = append(failures, fmt.Sprintf("cancel %s: %d %s", acc.RunID, cresp.StatusCode, cbody))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d failed:\n%s", len(failures), clients*perClient, strings.Join(failures, "\n"))
	}
	for _, id := range ids {
		waitRunStatus(t, e, id, "cancelled", 10*time.Second)
	}
}

// TestRefusedRunsGetHonestStatuses is issue 13: admission (adapter, target,
// capacity, session busy) is decided before the edge answers, for
// background and foreground runs, over HTTP and through the CLI.
func TestRefusedRunsGetHonestStatuses(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")

	// Four slots: four background runs are admitted, the fifth is refused.
	for i := range 4 {
		out, errOut, code := cli(t, e, "", "run", "--node", "n1", "--adapter", "exec", "--target", "sleep", "--background")
		if code != 0 || !strings.Contains(out, "started in the background") {
			t.Fatalf("run %d: rc %d\n%s%s", i, code, out, errOut)
		}
	}
	out, errOut, code := cli(t, e, "", "run", "--node", "n1", "--adapter", "exec", "--target", "sleep", "--background")
	if code == 0 || strings.Contains(out, "started") || !strings.Contains(errOut, "at_capacity") {
		t.Fatalf("fifth background run: rc %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	wantStatus := func(body map[string]any, status int, code string) {
		t.Helper()
		resp, b := postJSON(t, e.url+"/v1/runs", body)
		var eb struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if resp.StatusCode != status || json.Unmarshal(b, &eb) != nil || eb.Error.Code != code || eb.Error.Message == "" {
			t.Fatalf("%v: %d %s, want %d %s", body, resp.StatusCode, b, status, code)
		}
		if strings.Contains(resp.Header.Get("Content-Type"), "event-stream") {
			t.Fatalf("%v: refused run answered as a stream", body)
		}
	}
	wantStatus(map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "x"}, 429, "at_capacity")
	wantStatus(map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "background": true}, 429, "at_capacity")
	wantStatus(map[string]any{"node": "n1", "adapter": "exec", "target": "nope", "background": true}, 404, "target_not_found")
	wantStatus(map[string]any{"node": "n1", "adapter": "exec", "target": "nope"}, 404, "target_not_found")
	wantStatus(map[string]any{"node": "n1", "adapter": "nope", "target": "x"}, 404, "adapter_not_found")

	// An unknown target through the CLI: one clear line, the code once, rc 1.
	out, errOut, code = cli(t, e, "", "run", "--node", "n1", "--adapter", "exec", "--target", "nope", "--background")
	if code != 1 || strings.Contains(out, "started") || strings.Count(errOut, "target_not_found") != 1 || !strings.Contains(errOut, `no target "nope"`) {
		t.Fatalf("unknown target: rc %d\nstdout %s\nstderr %s", code, out, errOut)
	}
}

// TestSessionBusyIsAConflict: a second run in a session that has one in
// flight is refused with 409 before anything streams.
func TestSessionBusyIsAConflict(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	resp, b := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "sleep", "session_id": "s1", "background": true})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("first: %d %s", resp.StatusCode, b)
	}
	for _, bg := range []bool{false, true} {
		resp, b = postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "session_id": "s1", "background": bg})
		if resp.StatusCode != http.StatusConflict || !strings.Contains(string(b), "session_busy") {
			t.Fatalf("second (background %v): %d %s", bg, resp.StatusCode, b)
		}
	}
}

// TestRunInputMayBeAnObject: input is text or a JSON object; exec gets the
// object as JSON on stdin.
func TestRunInputMayBeAnObject(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	evs := collectRun(t, startRun(t, t.Context(), e, map[string]any{"node": "n1", "adapter": "exec", "target": "upper",
		"input": map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}}}}))
	checkWellFormed(t, evs)
	var text string
	for _, ev := range evs {
		text += ev.Text
	}
	if !strings.HasPrefix(text, `{"MESSAGES":[{`) || !strings.Contains(text, `"CONTENT":"HI"`) {
		t.Fatalf("output %q", text)
	}
}

// TestHostileIDsAreRefusedAtTheEdge is issue 9.6: a NUL in a session id or
// a path is a 400 naming the field; no internal text reaches the caller.
func TestHostileIDsAreRefusedAtTheEdge(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	nd := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	resp, b := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "x", "session_id": "s\u0000x"})
	if resp.StatusCode != 400 || !strings.Contains(string(b), "invalid_request") || !strings.Contains(string(b), "session_id") {
		t.Fatalf("NUL session id: %d %s", resp.StatusCode, b)
	}
	for _, path := range []string{"/v1/runs/%00", "/v1/runs/run%00x", "/v1/runs?node=%00"} {
		r, err := http.Get(e.url + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 400 || !strings.Contains(string(body), "invalid_request") || strings.Contains(strings.ToLower(string(body)), "sql") {
			t.Fatalf("GET %s: %d %s", path, r.StatusCode, body)
		}
	}
	// The node never saw the hostile run: no error in its log.
	if out := nd.out.String(); strings.Contains(out, "level=ERROR") {
		t.Fatalf("node output:\n%s", out)
	}
}

// TestNodeReportsItsAdapterTypes: the edge loads a config with a type it
// has never heard of, and refuses it for a node that reports it cannot
// build it (config_error naming the node's types), while nodes with
// supported types register.
func TestNodeReportsItsAdapterTypes(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4)+`
  - id: n9
    token: e2e-token-0009
    adapters:
      - {name: tele, type: telepathy}
`)
	bus := watchBus(t, e)
	startNode(t, e, "e2e-token-0009")
	ev := bus.waitFor(t, 15*time.Second, "node.rejected for n9", func(m map[string]any) bool {
		return m["type"] == "node.rejected" && m["node"] == "n9"
	})
	reason, _ := ev["reason"].(string)
	if !strings.Contains(reason, "config_error") || !strings.Contains(reason, `type "telepathy"`) || !strings.Contains(reason, "exec, ollama") {
		t.Fatalf("reason %q", reason)
	}
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
}
