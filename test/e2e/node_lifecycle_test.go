package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/adapters/store/sqlite"
	"iop/domain"
)

// A second node started on a store a live node uses (the default iop.db of
// one working directory, say) is refused at once, and leaves the live
// node's children and runs alone: it used to kill every process group the
// live node had recorded and mark its running runs failed ("node restarted
// while the run was in flight").
func TestSecondNodeOnSameStoreIsRefused(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	first := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runID, pid, resp, r := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "sleep"})
	defer resp.Body.Close()
	if pid == 0 || !pidAlive(pid) {
		t.Fatalf("no live child pid reported (pid %d)", pid)
	}

	// Another node's token, the same store; info level, so that its output
	// is what an operator sees.
	second := startNodeOpts(t, e, "e2e-token-0002", nodeOptions{db: first.db, args: []string{"--log-level", "info"}})
	if code := second.waitExit(t, 15*time.Second); code != 1 {
		t.Fatalf("second node exited %d, want 1; output:\n%s", code, second.out.String())
	}
	want := fmt.Sprintf("iop-node: cannot start: another iop-node is using %s (pid %d)\n", first.db, first.cmd.Process.Pid)
	if got := second.out.String(); got != want {
		t.Fatalf("second node said:\n%q\nwant:\n%q", got, want)
	}

	if !pidAlive(pid) {
		t.Fatalf("the first node's child %d was killed by the second node", pid)
	}
	if first.exited() {
		t.Fatalf("the first node exited:\n%s", first.out.String())
	}
	var ri runInfo
	if err := getJSON(e.url+"/v1/runs/"+runID, &ri); err != nil || ri.Status != "running" {
		t.Fatalf("run after the second node: %+v %v, want running", ri, err)
	}
	// The run is still the first node's: it cancels normally.
	if resp, body := postJSON(t, e.url+"/v1/runs/"+runID+"/cancel", nil); resp.StatusCode != 200 {
		t.Fatalf("cancel: %d %s", resp.StatusCode, body)
	}
	if last := lastEvent(t, r); last.Event != "cancelled" {
		t.Fatalf("last event %+v, want cancelled", last)
	}
	waitPidGone(t, pid, 5*time.Second, "the cancelled run's child")
}

// lastEvent reads r to its end and returns the last event.
func lastEvent(t *testing.T, r *sseReader) sseEvent {
	t.Helper()
	var last sseEvent
	for {
		ev, err := r.Next()
		if err != nil {
			return last
		}
		last = ev
	}
}

// A node stopped with SIGTERM ends its runs as the README says: the caller's
// stream ends with one cancelled event ("node shutting down"), and the edge
// and the node both record the run cancelled. The link used to close first,
// so callers got node_disconnected and the edge recorded the run failed.
func TestNodeShutdownCancelsItsRuns(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	n := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runID, pid, resp, r := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "sleep"})
	defer resp.Body.Close()

	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var last sseEvent
	terminals := 0
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		last = ev
		switch ev.Event {
		case "cancelled", "complete", "error":
			terminals++
		}
	}
	var re runEvent
	_ = json.Unmarshal([]byte(last.Data), &re)
	if last.Event != "cancelled" || terminals != 1 || re.Error == nil || re.Error.Message != "node shutting down" {
		t.Fatalf("stream ended with %+v (%d terminal events), want one cancelled: node shutting down", last, terminals)
	}
	// Well within the harness's 5 s grace and fx's stop timeout.
	if code := n.waitExit(t, 8*time.Second); code != 0 {
		t.Fatalf("node exited %d:\n%s", code, n.out.String())
	}
	if !processGone(pid) {
		t.Fatalf("child %d outlived its node", pid)
	}
	waitRunStatus(t, e, runID, "cancelled", 5*time.Second)

	db, err := sqlite.Open(ctx, "file:"+n.db+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	run, err := sqlite.NewRunStore(db).GetRun(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	if s := run.Snapshot(); s.Status != domain.RunCancelled || s.ErrorMessage != "node shutting down" {
		t.Fatalf("node store: %s %q, want cancelled: node shutting down", s.Status, s.ErrorMessage)
	}
}

// A start failure in a constructor (a store that cannot be opened) is one
// plain line on stderr naming the cause, and exit 1: not fx's wiring chain
// ("could not build arguments for function …") after two ERROR log lines
// with stack traces, nor SQLite's "out of memory (14)".
func TestStartFailureIsOneLine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	isDir := filepath.Join(dir, "isdir.db")
	if err := os.Mkdir(isDir, 0o700); err != nil {
		t.Fatal(err)
	}
	edgeCfg := filepath.Join(dir, "edge.yaml")
	stateDir := filepath.Join(file, "state")
	cfg := fmt.Sprintf("state_dir: %s\ntransport:\n  listen: %q\nhttp:\n  listen: %q\nnodes:%s", stateDir, freeAddr(t), freeAddr(t), defaultNodes(1))
	if err := os.WriteFile(edgeCfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	node := func(db string) []string {
		return []string{"--edge", freeAddr(t), "--token", testToken, "--insecure", "--db", db}
	}
	cases := []struct {
		name, bin string
		args      []string
		want      string
	}{
		{"node store in a missing directory", "iop-node", node("file:/nonexistent/dir/x.db"),
			"iop-node: cannot start: cannot open database file /nonexistent/dir/x.db: directory /nonexistent/dir does not exist\n"},
		{"node store is a directory", "iop-node", node("file:" + isDir + "?cache=shared&mode=rwc"),
			fmt.Sprintf("iop-node: cannot start: open node store %q: cannot open database file %s: it is a directory\n", "file:"+isDir+"?cache=shared&mode=rwc", isDir)},
		{"edge state_dir cannot be created", "iop-edge", []string{"--config", edgeCfg},
			fmt.Sprintf("iop-edge: cannot start: cannot create state_dir %s: mkdir %s: not a directory\n", stateDir, file)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(binDir, tc.bin), tc.args...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if code := cmd.ProcessState.ExitCode(); code != 1 {
				t.Fatalf("exit %d (%v), want 1; stderr:\n%s", code, err, stderr.String())
			}
			if got := stderr.String(); got != tc.want || strings.Count(got, "\n") != 1 {
				t.Fatalf("stderr:\n%s\nwant exactly:\n%s", got, tc.want)
			}
			if stdout.Len() != 0 {
				t.Fatalf("stdout: %q", stdout.String())
			}
		})
	}
}

// drainNodes is two nodes alike: n1 wins a tie by its id. Its "stubborn"
// target ignores SIGTERM (ignored signals stay ignored across exec), so a
// run of it ends only at the exec adapter's SIGKILL, 2 s after the node
// began to stop: the node drains that long. Each has an OpenAI provider
// serving model "m" (n1's at provider1, n2's at provider2); only n1's
// serves "only-n1".
func drainNodes(provider1, provider2 string) string {
	node := func(id, token, provider, models string) string {
		return fmt.Sprintf(`
  - id: %s
    token: %s
    providers:
      - {name: oai, type: openai, base_url: %q, models: [%s]}
    adapters:
      - name: exec
        type: exec
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
          sleep: {command: ["sh", "-c", "echo started; exec sleep 300"]}
          stubborn: {command: ["sh", "-c", "trap '' TERM; echo started; exec sleep 300"]}`, id, token, provider, models)
	}
	return node("n1", testToken, provider1, "m, only-n1") + node("n2", "e2e-token-0002", provider2, "m") + "\n"
}

// drainProvider is an OpenAI provider whose every answer names it.
func drainProvider(t *testing.T, name string) string {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"from":%q}`, name)
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// While a SIGTERM'd node drains (its runs end and their last events reach
// their callers), new runs go to the other node and succeed. The draining
// node used to be chosen all through the drain — here it wins every tie —
// and each run it was sent failed with 503 shutting_down. Provider tunnels
// skip it too: a model both serve goes to the other node, one only it
// serves, or a request pinned to it, is a 503 saying it is shutting down
// (tunnels used to go to it, and be cut when it closed its link).
func TestDrainingNodeGetsNoNewRuns(t *testing.T) {
	t.Parallel()
	e := startEdge(t, drainNodes(drainProvider(t, "provider1"), drainProvider(t, "provider2")))
	n1 := startNode(t, e, testToken)
	startNode(t, e, "e2e-token-0002")
	waitNode(t, e, "n1")
	waitNode(t, e, "n2")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// One run in flight on each node, so n1 wins the tie while it drains.
	_, _, resp1, r1 := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "stubborn"})
	defer resp1.Body.Close()
	_, _, resp2, _ := runUntilStarted(t, ctx, e, map[string]any{"node": "n2", "adapter": "exec", "target": "sleep"})
	defer resp2.Body.Close()

	bus := watchBus(t, e)
	if err := n1.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	bus.waitFor(t, 10*time.Second, "node.draining for n1", func(m map[string]any) bool {
		return m["type"] == "node.draining" && m["node"] == "n1"
	})
	var nl nodeList
	if err := getJSON(e.url+"/v1/nodes", &nl); err != nil {
		t.Fatal(err)
	}
	for _, n := range nl.Nodes {
		if n.Connected && n.Draining != (n.ID == "n1") {
			t.Fatalf("node %s listed draining=%v; want only n1 draining", n.ID, n.Draining)
		}
	}
	// iop nodes says so too: "online" hid the drain, while runs went elsewhere.
	out, stderr, code := cli(t, e, "", "nodes")
	if code != 0 || !regexp.MustCompile(`(?m)^n1 +draining `).MatchString(out) || !regexp.MustCompile(`(?m)^n2 +online `).MatchString(out) {
		t.Fatalf("iop nodes during n1's drain (exit %d, stderr %q):\n%s", code, stderr, out)
	}
	for _, tc := range []struct {
		model, pin string
		status     int
		want       string // the body, or the error code
	}{
		{"m", "", http.StatusOK, `{"from":"provider2"}`},
		{"m", "", http.StatusOK, `{"from":"provider2"}`},
		{"only-n1", "", http.StatusServiceUnavailable, domain.CodeNoNodeAvailable},
		{"m", "n1", http.StatusServiceUnavailable, domain.CodeShuttingDown},
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/chat/completions", bytes.NewReader(chatBody(tc.model, false)))
		req.Header.Set("Content-Type", "application/json")
		if tc.pin != "" {
			req.Header.Set("X-IOP-Node", tc.pin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Fatalf("chat %s (pin %q) during n1's drain: %d %s, want %d", tc.model, tc.pin, resp.StatusCode, body, tc.status)
		}
		if tc.status == http.StatusOK {
			if string(body) != tc.want {
				t.Fatalf("chat %s during n1's drain answered %s, want %s", tc.model, body, tc.want)
			}
			continue
		}
		var doc struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(body, &doc); err != nil || doc.Error.Code != tc.want || !strings.Contains(doc.Error.Message, "shutting down") {
			t.Fatalf("chat %s (pin %q) during n1's drain answered %s, want error %s saying shutting down", tc.model, tc.pin, body, tc.want)
		}
	}
	for i := range 3 {
		evs := collectRun(t, startRun(t, ctx, e, map[string]any{"adapter": "exec", "target": "upper", "input": "abc"}))
		checkWellFormed(t, evs)
		if last := evs[len(evs)-1]; last.Type != "complete" || last.Node != "n2" {
			t.Fatalf("run %d during n1's drain ended %+v, want complete on n2", i, last)
		}
	}
	// The drain was under way all along: n1's run ends only now, cancelled.
	var last sseEvent
	for {
		ev, err := r1.Next()
		if err != nil {
			break
		}
		last = ev
	}
	if last.Event != "cancelled" {
		t.Fatalf("n1's run ended with %+v, want cancelled", last)
	}
	if code := n1.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("n1 exited %d:\n%s", code, n1.out.String())
	}
}

// SIGHUP (a closed terminal, or a reload signal sent to every iop process)
// ends neither binary: the node ignores it and its run goes on; the edge
// reloads on it, and ignores it while it stops. By default a HUP killed the
// node at once, without telling the edge it drained or ending its runs.
func TestSIGHUPEndsNeitherBinary(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	n := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runID, _, resp, _ := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "sleep"})
	defer resp.Body.Close()
	for _, p := range []*proc{n.proc, e.proc} {
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if n.exited() || e.exited() {
		t.Fatalf("a SIGHUP ended a process (node exited: %v, edge exited: %v)\nnode:\n%s\nedge:\n%s", n.exited(), e.exited(), n.out.String(), e.out.String())
	}
	waitNode(t, e, "n1")
	waitRunStatus(t, e, runID, "running", 5*time.Second)
}
