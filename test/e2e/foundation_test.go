package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/adapters/store/sqlite"
	"iop/domain"
)

func TestRunStreamsInOrderThroughHTTP(t *testing.T) {
	e := startEdge(t, defaultNodes(4))
	n := startNode(t, e, testToken)
	waitNode(t, e, "n1")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "count"})
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	evs := collectRun(t, resp)
	checkWellFormed(t, evs)
	if evs[0].Type != "start" || evs[len(evs)-1].Type != "complete" {
		t.Fatalf("want start…complete, got %+v", evs)
	}
	var text strings.Builder
	for _, ev := range evs {
		if ev.Type == "delta" {
			text.WriteString(ev.Text)
		}
		if ev.Node != "n1" || ev.RunID != evs[0].RunID {
			t.Fatalf("event with wrong node/run: %+v", ev)
		}
	}
	if text.String() != "line1\nline2\nline3\nline4\nline5\n" {
		t.Fatalf("deltas = %q", text.String())
	}

	// The node's own SQLite file holds the run with its final status.
	runID := evs[0].RunID
	db, err := sqlite.Open(ctx, "file:"+n.db+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	run, err := sqlite.NewRunStore(db).GetRun(ctx, runID)
	if err != nil {
		t.Fatalf("run %s not in node store: %v", runID, err)
	}
	s := run.Snapshot()
	if s.Status != domain.RunSucceeded || s.Adapter != "exec" || s.Target != "count" || s.FinishedAt.IsZero() {
		t.Fatalf("stored run = %+v", s)
	}
}

func TestRunThroughCLI(t *testing.T) {
	e := startEdge(t, defaultNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")

	out, errOut, code := cli(t, e, "", "run", "--node", "n1", "--adapter", "exec", "--target", "upper", "hello iop")
	// Piped, stdout is what the program printed, byte for byte: tr adds no
	// newline, and neither does iop.
	if code != 0 || out != "HELLO IOP" {
		t.Fatalf("iop run upper: code %d stdout %q stderr %q", code, out, errOut)
	}
	out, _, code = cli(t, e, "from stdin\n", "run", "--adapter", "exec", "--node", "n1", "--target", "upper", "-")
	if code != 0 || out != "FROM STDIN\n" {
		t.Fatalf("iop run from stdin: code %d stdout %q", code, out)
	}
	out, errOut, code = cli(t, e, "", "run", "--node", "n1", "--adapter", "exec", "--target", "fail")
	if code == 0 || !strings.Contains(out, "partial") || !strings.Contains(errOut, "exit status 3") || !strings.Contains(errOut, "boom") {
		t.Fatalf("iop run fail: code %d stdout %q stderr %q", code, out, errOut)
	}
	_, errOut, code = cli(t, e, "", "run", "--node", "nope", "--adapter", "exec", "--target", "upper", "x")
	if code == 0 || !strings.Contains(errOut, "node_not_found") {
		t.Fatalf("unknown node: code %d stderr %q", code, errOut)
	}
	out, _, code = cli(t, e, "", "nodes")
	if code != 0 || !strings.Contains(out, "n1") {
		t.Fatalf("iop nodes: code %d out %q", code, out)
	}
}

func TestHTTPErrors(t *testing.T) {
	e := startEdge(t, defaultNodes(4))
	for _, tc := range []struct {
		body   map[string]any
		status int
		code   string
	}{
		{map[string]any{"target": "x"}, 400, "invalid_request"},
		{map[string]any{"adapter": "exec", "bogus": 1}, 400, "invalid_request"},
		{map[string]any{"adapter": "exec", "node": "ghost"}, 404, "node_not_found"},
		{map[string]any{"adapter": "exec"}, 503, "no_node_available"},
	} {
		resp, body := postJSON(t, e.url+"/v1/runs", tc.body)
		if resp.StatusCode != tc.status || !strings.Contains(string(body), `"code":"`+tc.code+`"`) {
			t.Errorf("%v: got %d %s, want %d %s", tc.body, resp.StatusCode, body, tc.status, tc.code)
		}
	}
}

func TestWrongTokenAndDuplicateNodeRejected(t *testing.T) {
	e := startEdge(t, defaultNodes(4))
	bus := watchBus(t, e)
	first := startNode(t, e, testToken)
	waitNode(t, e, "n1")

	bad := startNode(t, e, "not-a-real-token")
	if code := bad.waitExit(t, 15*time.Second); code == 0 {
		t.Fatalf("node with wrong token exited 0")
	}
	if !strings.Contains(bad.out.String(), "unknown_token") {
		t.Fatalf("wrong-token node output lacks a clear reason:\n%s", bad.out.String())
	}
	bus.waitFor(t, 5*time.Second, "node.rejected unknown_token", func(m map[string]any) bool {
		return m["type"] == "node.rejected" && m["reason"] == "unknown_token"
	})

	dup := startNode(t, e, testToken)
	bus.waitFor(t, 10*time.Second, "node.rejected duplicate_connection", func(m map[string]any) bool {
		return m["type"] == "node.rejected" && m["node"] == "n1" && m["reason"] == "duplicate_connection"
	})
	if dup.exited() {
		t.Fatalf("duplicate node should keep retrying, it exited:\n%s", dup.out.String())
	}
	// The live connection is untouched: runs still reach the first node.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	evs := collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "count"}))
	checkWellFormed(t, evs)
	if evs[len(evs)-1].Type != "complete" || first.exited() {
		t.Fatalf("first node disturbed: %+v", evs)
	}
	for _, ev := range bus.snapshot() {
		for _, v := range ev {
			if s, ok := v.(string); ok && strings.Contains(s, testToken) {
				t.Fatalf("token leaked into an event: %v", ev)
			}
		}
	}
	if strings.Contains(e.out.String(), testToken) || strings.Contains(first.out.String(), testToken) {
		t.Fatal("token leaked into logs")
	}
}

func TestKillingNodeMidRunEndsCallerStream(t *testing.T) {
	e := startEdge(t, defaultNodes(4))
	n := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	bus := watchBus(t, e)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "sleep"})
	defer resp.Body.Close()
	r := newSSE(resp.Body)
	for {
		ev, err := r.Next()
		if err != nil {
			t.Fatalf("stream ended before the run started: %v", err)
		}
		if ev.Event == "delta" {
			break
		}
	}
	n.stop(syscall.SIGKILL, time.Second)
	var last sseEvent
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		last = ev
	}
	if last.Event != "error" || !strings.Contains(last.Data, `"code":"node_disconnected"`) {
		t.Fatalf("last event = %+v, want error node_disconnected", last)
	}
	bus.waitFor(t, 5*time.Second, "node.disconnected", func(m map[string]any) bool {
		return m["type"] == "node.disconnected" && m["node"] == "n1"
	})
}

func TestNodeComesBackAfterEdgeRestart(t *testing.T) {
	e := startEdge(t, defaultNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")

	e.stop(syscall.SIGTERM, 10*time.Second)
	e.proc = startEdgeProc(t, e.config)
	waitHealthy(t, e.url, e.proc)
	waitNode(t, e, "n1")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	evs := collectRun(t, startRun(t, ctx, e, map[string]any{"adapter": "exec", "target": "upper", "input": "again"}))
	checkWellFormed(t, evs)
	if evs[len(evs)-1].Type != "complete" {
		t.Fatalf("after restart: %+v", evs)
	}
}

// A session's next run goes to the node that holds it even after the edge
// restarted (its memory of sessions is empty then): the edge recalls the
// node from its history. n1 has more free slots, so a run placed afresh
// would go there; the session lives on n2.
func TestSessionFindsItsNodeAfterEdgeRestart(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(8))
	startNode(t, e, testToken)
	startNode(t, e, "e2e-token-0002")
	waitNode(t, e, "n1")
	waitNode(t, e, "n2")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runOn := func(body map[string]any) string {
		t.Helper()
		resp := startRun(t, ctx, e, body)
		node := resp.Header.Get("X-IOP-Node")
		if evs := collectRun(t, resp); len(evs) == 0 || evs[len(evs)-1].Type != "complete" {
			t.Fatalf("run %v: %+v", body, evs)
		}
		return node
	}
	if n := runOn(map[string]any{"node": "n2", "adapter": "exec", "target": "upper", "session_id": "chat-9", "input": "one"}); n != "n2" {
		t.Fatalf("first turn on %q", n)
	}
	// A run outside the session is placed by free slots: n1.
	if n := runOn(map[string]any{"adapter": "exec", "target": "upper", "input": "x"}); n != "n1" {
		t.Fatalf("a run without a session went to %q, want n1 (most free slots)", n)
	}

	e.stop(syscall.SIGTERM, 10*time.Second)
	e.proc = startEdgeProc(t, e.config)
	waitHealthy(t, e.url, e.proc)
	waitNode(t, e, "n1")
	waitNode(t, e, "n2")
	if n := runOn(map[string]any{"adapter": "exec", "target": "upper", "session_id": "chat-9", "input": "two"}); n != "n2" {
		t.Fatalf("the session's turn after the edge restarted went to %q, want n2", n)
	}
	// A new session is placed afresh.
	if n := runOn(map[string]any{"adapter": "exec", "target": "upper", "session_id": "chat-10", "input": "x"}); n != "n1" {
		t.Fatalf("a new session went to %q, want n1", n)
	}
	var page struct {
		Runs []struct {
			Node      string `json:"node"`
			SessionID string `json:"session_id"`
		} `json:"runs"`
	}
	// The history is written in batches: the second turn's row comes soon.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := getJSON(e.url+"/v1/runs?session=chat-9", &page); err != nil {
			t.Fatal(err)
		}
		if len(page.Runs) >= 2 || time.Now().After(deadline) {
			break
		}
	}
	if len(page.Runs) != 2 || page.Runs[0].Node != "n2" || page.Runs[1].Node != "n2" || page.Runs[0].SessionID != "chat-9" {
		t.Fatalf("GET /v1/runs?session=chat-9: %+v", page.Runs)
	}
}

// A node removed from edge.yaml while the edge was stopped is refused when
// the edge starts again (unknown_token) and stops its runs, so nothing
// would ever settle the history row of its background run: the edge ends
// it at start, failed node_removed, and a cancel of it answers
// run_finished. It used to stay running for good (a cancel answered
// node_not_found, /v1/usage counted it running).
func TestEdgeStartEndsTheRunsOfANodeRemovedWhileStopped(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	resp, body := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "sleep", "background": true})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("background run: %d %s", resp.StatusCode, body)
	}
	var started struct {
		RunID string `json:"run_id"`
	}
	if err := json.Unmarshal(body, &started); err != nil || started.RunID == "" {
		t.Fatalf("background run: %s (%v)", body, err)
	}
	run := func() (map[string]any, error) {
		var r map[string]any
		err := getJSON(e.url+"/v1/runs/"+started.RunID, &r)
		return r, err
	}
	waitFor(t, "the row running in the history", func() error {
		if r, err := run(); err != nil || r["status"] != "running" {
			return fmt.Errorf("%v %v", r, err)
		}
		return nil
	})

	e.stop(syscall.SIGTERM, 10*time.Second)
	cfg, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	without := strings.Replace(string(cfg), defaultNodes(4), "\n"+defaultNodes(4)[strings.Index(defaultNodes(4), "  - id: n2"):], 1)
	if without == string(cfg) {
		t.Fatal("n1 not found in the config")
	}
	if err := os.WriteFile(e.config, []byte(without), 0o600); err != nil {
		t.Fatal(err)
	}
	e.proc = startEdgeProc(t, e.config)
	waitHealthy(t, e.url, e.proc)

	waitFor(t, "the row ended node_removed", func() error {
		r, err := run()
		if err != nil {
			return err
		}
		er, _ := r["error"].(map[string]any)
		if r["status"] != "failed" || er["code"] != "node_removed" {
			return fmt.Errorf("row %v", r)
		}
		return nil
	})
	if _, stderr, code := cli(t, e, "", "cancel", started.RunID); code == 0 || !strings.Contains(stderr, "run_finished") {
		t.Fatalf("iop cancel of the removed node's run: exit %d, %s; want run_finished", code, stderr)
	}
}
