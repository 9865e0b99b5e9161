package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// controlNodes adds targets for cancel and reload tests.
func controlNodes(maxConc int) string {
	return defaultNodes(maxConc) + `
  - id: n3
    token: e2e-token-0003
    adapters:
      - name: slow
        type: exec
        targets:
          slow: {command: ["sh", "-c", "sleep 1.5; echo done"]}
`
}

// runUntilStarted opens a run and reads until its process printed something,
// returning the run id, the child's pid, and the open stream.
func runUntilStarted(t *testing.T, ctx context.Context, e *edge, body map[string]any) (string, int, *http.Response, *sseReader) {
	t.Helper()
	resp := startRun(t, ctx, e, body)
	if resp.StatusCode != 200 {
		t.Fatalf("run status %d", resp.StatusCode)
	}
	r := newSSE(resp.Body)
	var runID string
	pid := 0
	for {
		ev, err := r.Next()
		if err != nil {
			t.Fatalf("stream ended early: %v", err)
		}
		var re runEvent
		_ = json.Unmarshal([]byte(ev.Data), &re)
		runID = re.RunID
		if re.Type == "metadata" {
			var m struct {
				PID int `json:"pid"`
			}
			_ = json.Unmarshal(re.Metadata, &m)
			pid = m.PID
		}
		if re.Type == "delta" {
			return runID, pid, resp, r
		}
		if re.Type == "error" || re.Type == "complete" {
			t.Fatalf("run ended before starting: %s", ev.Data)
		}
	}
}

func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func waitGone(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if processGone(pid) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d still alive after %v", pid, within)
}

type runInfo struct {
	RunID  string `json:"run_id"`
	Node   string `json:"node"`
	Status string `json:"status"`
	Error  *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func waitRunStatus(t *testing.T, e *edge, runID, status string, within time.Duration) runInfo {
	t.Helper()
	deadline := time.Now().Add(within)
	var ri runInfo
	for time.Now().Before(deadline) {
		if err := getJSON(e.url+"/v1/runs/"+runID, &ri); err == nil && ri.Status == status {
			return ri
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("run %s never reached %s (last %+v)", runID, status, ri)
	return ri
}

func TestCancelStopsProcessWithinOneSecond(t *testing.T) {
	e := startEdge(t, controlNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	runID, pid, resp, r := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "sleep"})
	defer resp.Body.Close()
	if pid == 0 || processGone(pid) {
		t.Fatalf("no live child pid reported (pid %d)", pid)
	}
	began := time.Now()
	out, errOut, code := cli(t, e, "", "cancel", runID)
	if code != 0 {
		t.Fatalf("iop cancel: %d %s %s", code, out, errOut)
	}
	var last sseEvent
	n := 0
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		last = ev
		if ev.Event == "cancelled" || ev.Event == "complete" || ev.Event == "error" {
			n++
		}
	}
	if last.Event != "cancelled" || n != 1 {
		t.Fatalf("want exactly one terminal, cancelled; last %+v, terminals %d", last, n)
	}
	if d := time.Since(began); d > time.Second {
		t.Fatalf("cancelled arrived after %v", d)
	}
	waitGone(t, pid, time.Second)
	if ri := waitRunStatus(t, e, runID, "cancelled", 5*time.Second); ri.Error == nil || ri.Error.Message != "cancelled by request" {
		t.Fatalf("history of a run cancelled by request: %+v", ri.Error)
	}

	// Cancelling again: 409 run_finished; an unknown run: 404.
	resp2, body := postJSON(t, e.url+"/v1/runs/"+runID+"/cancel", nil)
	if resp2.StatusCode != 409 || !strings.Contains(string(body), "run_finished") {
		t.Fatalf("second cancel: %d %s", resp2.StatusCode, body)
	}
	resp3, body := postJSON(t, e.url+"/v1/runs/run_doesnotexist/cancel", nil)
	if resp3.StatusCode != 404 || !strings.Contains(string(body), "run_not_found") {
		t.Fatalf("unknown cancel: %d %s", resp3.StatusCode, body)
	}
}

func TestCallerDisconnectCancelsRun(t *testing.T) {
	e := startEdge(t, controlNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	bus := watchBus(t, e)

	ctx, cancel := context.WithCancel(context.Background())
	runID, pid, resp, _ := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "sleep"})
	cancel() // the caller goes away
	resp.Body.Close()
	waitGone(t, pid, time.Second)
	bus.waitFor(t, 5*time.Second, "cancelled on the bus", func(m map[string]any) bool {
		run, _ := m["run"].(map[string]any)
		return run != nil && run["run_id"] == runID && run["type"] == "cancelled"
	})
	// The history says the caller left, not that someone asked for the
	// cancel (the node records the reason the edge sent; the history takes
	// the node's cancelled event).
	if ri := waitRunStatus(t, e, runID, "cancelled", 5*time.Second); ri.Error == nil || ri.Error.Message != "caller left before the run ended" {
		t.Fatalf("history of a run whose caller left: %+v", ri.Error)
	}
}

func TestBackgroundRunSurvivesCaller(t *testing.T) {
	e := startEdge(t, controlNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")

	resp, body := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "count", "background": true})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("background run: %d %s", resp.StatusCode, body)
	}
	var acc struct {
		RunID string `json:"run_id"`
		Node  string `json:"node"`
	}
	if err := json.Unmarshal(body, &acc); err != nil || acc.RunID == "" || acc.Node != "n1" {
		t.Fatalf("202 body %s", body)
	}
	waitRunStatus(t, e, acc.RunID, "succeeded", 10*time.Second)
	// The edge's history writes in batches (every 200 ms at most): the
	// listing catches up with the run's end within one batch.
	waitFor(t, "iop runs lists the run as succeeded", func() error {
		out, _, code := cli(t, e, "", "runs", "--node", "n1")
		if code != 0 || !strings.Contains(out, acc.RunID) || !strings.Contains(out, "succeeded") {
			return fmt.Errorf("iop runs: %d\n%s", code, out)
		}
		return nil
	})
	out, _, code := cli(t, e, "", "runs", "--status", "succeeded", "--json")
	if code != 0 || !strings.Contains(out, acc.RunID) {
		t.Fatalf("iop runs --json: %d\n%s", code, out)
	}
}

func TestAtCapacityThenAdmittedAfterCancel(t *testing.T) {
	e := startEdge(t, controlNodes(1))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	runID, pid, resp, r := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "sleep"})
	defer resp.Body.Close()
	// Refused before anything streams: 429 with the error body.
	if resp2, body := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "x"}); resp2.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), "at_capacity") {
		t.Fatalf("second run: %d %s", resp2.StatusCode, body)
	}
	var evs []runEvent
	if r, body := postJSON(t, e.url+"/v1/runs/"+runID+"/cancel", nil); r.StatusCode != 200 {
		t.Fatalf("cancel: %d %s", r.StatusCode, body)
	}
	for {
		ev, err := r.Next()
		if err != nil || ev.Event == "cancelled" {
			break
		}
	}
	waitGone(t, pid, time.Second)
	evs = collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "ok"}))
	checkWellFormed(t, evs)
	if evs[len(evs)-1].Type != "complete" {
		t.Fatalf("after cancel: %+v", evs)
	}
}

func TestReloadAddsTargetWithoutRestartingNode(t *testing.T) {
	e := startEdge(t, controlNodes(4))
	nd := startNode(t, e, "e2e-token-0003")
	waitNode(t, e, "n3")
	bus := watchBus(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A run that is in flight across the reload must complete undisturbed.
	before := startRun(t, ctx, e, map[string]any{"node": "n3", "adapter": "slow", "target": "slow"})
	orig, _ := os.ReadFile(e.config)
	// An invalid file is rejected whole, with its line, and changes nothing.
	if err := os.WriteFile(e.config, append(append([]byte{}, orig...), []byte("\n  - id: bad\n    tokn: x\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	r, body := postJSON(t, e.url+"/v1/admin/reload", nil)
	if r.StatusCode != 422 || !strings.Contains(string(body), "config_error") || !strings.Contains(string(body), "line") {
		t.Fatalf("invalid reload: %d %s", r.StatusCode, body)
	}
	added := strings.Replace(string(orig), `          slow: {command: ["sh", "-c", "sleep 1.5; echo done"]}`,
		`          slow: {command: ["sh", "-c", "sleep 1.5; echo done"]}
          hello: {command: ["echo", "hello after reload"]}`, 1)
	if added == string(orig) {
		t.Fatal("test could not edit the config")
	}
	if err := os.WriteFile(e.config, []byte(added), 0o600); err != nil {
		t.Fatal(err)
	}
	r, body = postJSON(t, e.url+"/v1/admin/reload", nil)
	if r.StatusCode != 200 || !strings.Contains(string(body), "n3") {
		t.Fatalf("reload: %d %s", r.StatusCode, body)
	}
	bus.waitFor(t, 5*time.Second, "node.config_refreshed", func(m map[string]any) bool {
		return m["type"] == "node.config_refreshed" && m["node"] == "n3"
	})
	evs := collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n3", "adapter": "slow", "target": "hello"}))
	checkWellFormed(t, evs)
	if evs[len(evs)-1].Type != "complete" || !strings.Contains(evs[1].Text+evs[len(evs)-2].Text, "hello after reload") {
		t.Fatalf("new target: %+v", evs)
	}
	evs = collectRun(t, before)
	checkWellFormed(t, evs)
	if evs[len(evs)-1].Type != "complete" || evs[len(evs)-2].Text != "done\n" {
		t.Fatalf("run across reload: %+v", evs)
	}

	// SIGHUP reloads too.
	refreshed := len(bus.snapshot())
	hupped := strings.Replace(added, `hello: {command: ["echo", "hello after reload"]}`,
		`hello: {command: ["echo", "hello after reload"]}
          hup: {command: ["echo", "hello after SIGHUP"]}`, 1)
	if err := os.WriteFile(e.config, []byte(hupped), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	bus.waitFrom(t, refreshed, 5*time.Second, "node.config_refreshed after SIGHUP", func(m map[string]any) bool {
		return m["type"] == "node.config_refreshed" && m["node"] == "n3"
	})
	evs = collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n3", "adapter": "slow", "target": "hup"}))
	checkWellFormed(t, evs)
	if evs[len(evs)-1].Type != "complete" || !strings.Contains(evs[len(evs)-2].Text, "hello after SIGHUP") {
		t.Fatalf("target added by SIGHUP: %+v", evs)
	}
	if nd.exited() {
		t.Fatal("node restarted")
	}
}

func TestStatusCommandsCountCorrectly(t *testing.T) {
	e := startEdge(t, controlNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, target := range []string{"upper", "count", "fail"} {
		collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": target, "input": "x"}))
	}
	r, body := postJSON(t, e.url+"/v1/nodes/n1/commands", map[string]any{"command": "usage_status"})
	if r.StatusCode != 200 {
		t.Fatalf("usage_status: %d %s", r.StatusCode, body)
	}
	var us struct {
		Adapters []struct {
			Adapter   string `json:"adapter"`
			RunsTotal int    `json:"runs_total"`
			Succeeded int    `json:"succeeded"`
			Failed    int    `json:"failed"`
		} `json:"adapters"`
	}
	if err := json.Unmarshal(body, &us); err != nil || len(us.Adapters) != 1 {
		t.Fatalf("usage_status body %s", body)
	}
	if a := us.Adapters[0]; a.Adapter != "exec" || a.RunsTotal != 3 || a.Succeeded != 2 || a.Failed != 1 {
		t.Fatalf("usage_status = %+v", a)
	}
	r, body = postJSON(t, e.url+"/v1/nodes/n1/commands", map[string]any{"command": "transport_status"})
	var ts struct {
		Connected bool  `json:"connected"`
		FramesIn  int64 `json:"frames_in"`
		FramesOut int64 `json:"frames_out"`
		BytesIn   int64 `json:"bytes_in"`
		BytesOut  int64 `json:"bytes_out"`
	}
	if r.StatusCode != 200 || json.Unmarshal(body, &ts) != nil || !ts.Connected || ts.FramesIn < 4 || ts.FramesOut < 10 || ts.BytesIn == 0 || ts.BytesOut == 0 {
		t.Fatalf("transport_status: %d %s", r.StatusCode, body)
	}
	r, body = postJSON(t, e.url+"/v1/nodes/n1/commands", map[string]any{"command": "no_such_command"})
	if r.StatusCode != 400 || !strings.Contains(string(body), "unknown_command") {
		t.Fatalf("unknown command: %d %s", r.StatusCode, body)
	}
	r, body = postJSON(t, e.url+"/v1/nodes/ghost/commands", map[string]any{"command": "capabilities"})
	if r.StatusCode != 404 {
		t.Fatalf("command on unknown node: %d %s", r.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodDelete, e.url+"/v1/sessions/s1?node=n1&adapter=exec", nil)
	dr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	dr.Body.Close()
	if dr.StatusCode != 501 {
		t.Fatalf("terminate session on exec: %d, want 501 session_unsupported", dr.StatusCode)
	}
}

// SIGTERM while a SIGHUP reload waits on nodes that never answer its
// config pushes (frozen with SIGSTOP; the edge's heartbeat would notice
// only after a minute) stops the edge at once and cleanly: the stop
// cancels the reload instead of waiting out a push timeout per node, and
// then closes HTTP, the node links and the history as usual.
func TestEdgeStopsCleanlyDuringAStuckReload(t *testing.T) {
	// Both nodes' adapters change with maxConc, so both get a push; n9,
	// which never connects, is listed once the reload has replaced the
	// directory, just before it pushes.
	nodes := func(maxConc int, extra string) string {
		const n2 = "token: e2e-token-0002\n    adapters:\n      - name: exec\n        type: exec\n"
		return strings.Replace(defaultNodes(maxConc), n2, fmt.Sprintf("%s        max_concurrency: %d\n", n2, maxConc), 1) + extra
	}
	e := &edge{transport: freeAddr(t), config: filepath.Join(t.TempDir(), "edge.yaml")}
	httpAddr := freeAddr(t)
	e.url = "http://" + httpAddr
	write := func(nodes string) {
		t.Helper()
		c := strings.Replace(edgeConfig(e.transport, httpAddr, nodes), "heartbeat_timeout: 2s", "heartbeat_timeout: 60s", 1)
		if err := os.WriteFile(e.config, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(nodes(4, ""))
	e.pin = printCAPin(t, e.config)
	e.proc = startEdgeProc(t, e.config)
	waitHealthy(t, e.url, e.proc)
	var frozen []*node
	for _, tok := range []string{testToken, "e2e-token-0002"} {
		n := startNode(t, e, tok)
		// Runs before the harness's SIGTERM of the node (cleanups run last
		// first), which a stopped process would not act on.
		t.Cleanup(func() { _ = n.cmd.Process.Signal(syscall.SIGCONT) })
		frozen = append(frozen, n)
	}
	waitNode(t, e, "n1")
	waitNode(t, e, "n2")
	for _, n := range frozen {
		if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}

	write(nodes(5, "\n  - id: n9\n    token: e2e-token-0009\n"))
	if err := e.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	listed := func() bool {
		var nl nodeList
		if getJSON(e.url+"/v1/nodes", &nl) != nil {
			return false
		}
		for _, n := range nl.Nodes {
			if n.ID == "n9" {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(10 * time.Second); !listed(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the SIGHUP reload did not replace the directory:\n%s", e.out.String())
		}
	}

	// A stop that waited out the two pushes (10 s each, one after the
	// other) ran past fx's 15 s stop timeout and exited 1; one that waited
	// out even a single push timeout (10 s) would miss this deadline.
	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := e.waitExit(t, 5*time.Second); code != 0 {
		t.Fatalf("iop-edge exited %d, want 0:\n%s", code, e.out.String())
	}
	if out := e.out.String(); strings.Contains(out, "stopping:") {
		t.Fatalf("the edge reported a failed stop:\n%s", out)
	}
	// The pushes were cancelled, not timed out: they used to be logged as
	// "timeout: waiting for config ack: context canceled".
	if out := e.out.String(); strings.Contains(out, "timeout: waiting for config ack") || !strings.Contains(out, "config refresh cancelled before the node answered") {
		t.Fatalf("the cancelled pushes were not logged as cancelled:\n%s", out)
	}
}

// A background run goes on while its node is away for a few seconds (frozen
// with SIGSTOP until the edge's heartbeat gives up on the link). The node
// is back before the run ends, so the repair at its registration finds it
// still running; the edge keeps asking, and the history — read as a list,
// which asks no node — ends up with the run's end. Meanwhile the node's
// in-flight count includes the run, as the node's own does.
func TestBackgroundRunOutlivingALinkLossEndsInTheHistory(t *testing.T) {
	e := startEdge(t, `
  - id: n1
    token: `+testToken+`
    adapters:
      - name: exec
        type: exec
        max_concurrency: 2
        targets:
          slow: {command: ["sh", "-c", "sleep 8; echo done"]}
`)
	n := startNode(t, e, testToken)
	t.Cleanup(func() { _ = n.cmd.Process.Signal(syscall.SIGCONT) }) // before the harness's SIGTERM
	waitNode(t, e, "n1")
	resp, body := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "slow", "background": true})
	var bg struct {
		RunID string `json:"run_id"`
	}
	if resp.StatusCode != 202 || json.Unmarshal(body, &bg) != nil || bg.RunID == "" {
		t.Fatalf("background run: %d %s", resp.StatusCode, body)
	}
	// Only the node is frozen: its child, sleep, goes on.
	if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the edge letting go of the run", func() error {
		if !strings.Contains(e.out.String(), "background run's node link broke") {
			return errors.New("not yet")
		}
		return nil
	})
	if err := n.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	inFlight := func() (int, error) {
		var nl nodeList
		if err := getJSON(e.url+"/v1/nodes", &nl); err != nil {
			return 0, err
		}
		for _, nd := range nl.Nodes {
			if nd.ID == "n1" && nd.Connected && len(nd.Adapters) == 1 {
				return nd.Adapters[0].InFlight, nil
			}
		}
		return 0, errors.New("n1 is not connected")
	}
	status := func() (string, error) {
		var page struct {
			Runs []struct {
				RunID  string `json:"run_id"`
				Status string `json:"status"`
			} `json:"runs"`
		}
		if err := getJSON(e.url+"/v1/runs?node=n1", &page); err != nil {
			return "", err
		}
		for _, r := range page.Runs {
			if r.RunID == bg.RunID {
				return r.Status, nil
			}
		}
		return "", errors.New("the run is not in the history")
	}
	// The run is still going when the node is back (it sleeps 8 s).
	waitFor(t, "the run counted on the node that is back", func() error {
		if st, err := status(); err != nil || st != "running" {
			return fmt.Errorf("status %q, %v: the run ended before it could be seen going", st, err)
		}
		if got, err := inFlight(); err != nil || got != 1 {
			return fmt.Errorf("in flight %d, %v", got, err)
		}
		return nil
	})
	deadline := time.Now().Add(40 * time.Second)
	for {
		st, err := status()
		if err == nil && st == "succeeded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the history still says %q (%v) long after the run ended", st, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitFor(t, "the run's slot free once it ended", func() error {
		if got, err := inFlight(); err != nil || got != 0 {
			return fmt.Errorf("in flight %d, %v", got, err)
		}
		return nil
	})
}

// Ctrl-C (SIGINT) or SIGTERM during "iop run" cancels the run with a cancel
// request before the CLI leaves, exits 130, and says so only once the edge
// confirmed it: the history records a cancel asked for, not a caller that
// left, which is all that happened before (and nothing at all where the
// edge did not see the connection go).
func TestCLIInterruptCancelsTheRun(t *testing.T) {
	e := startEdge(t, controlNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "iop"), "run", "--node", "n1", "--adapter", "exec", "--target", "sleep", "x")
		cmd.Env = append(os.Environ(), "IOP_EDGE="+e.url)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "started\n" {
			t.Fatalf("%v: first line %q: %v", sig, line, err)
		}
		_ = cmd.Process.Signal(sig)
		err = cmd.Wait()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Fatalf("%v: %v, stderr %q; want exit 130", sig, err, stderr.String())
		}
		m := regexp.MustCompile(`^iop: interrupted; run (run_\w+) is cancelled\n$`).FindStringSubmatch(stderr.String())
		if m == nil {
			t.Fatalf("%v: stderr %q", sig, stderr.String())
		}
		if ri := waitRunStatus(t, e, m[1], "cancelled", 5*time.Second); ri.Error == nil || ri.Error.Message != "cancelled by request" {
			t.Fatalf("%v: history of the interrupted run: %+v", sig, ri.Error)
		}
	}
}

// "iop run … | head -1": the reader of iop's stdout goes while the run goes
// on. The next write fails, iop cancels the run with a cancel request (as
// on Ctrl-C: the edge records a cancel asked for, not only a caller that
// left) and exits 1 saying what became of the run. It died of SIGPIPE
// (exit 141), without a cancel, leaving the run to the edge noticing the
// connection go, which it never does behind a proxy that keeps its
// upstream open.
func TestCLIBrokenPipeCancelsTheRun(t *testing.T) {
	e := startEdge(t, `
  - id: n1
    token: `+testToken+`
    adapters:
      - name: exec
        type: exec
        targets:
          ticks: {command: ["sh", "-c", "echo started; while :; do sleep 0.1; echo tick; done"]}
`)
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "iop"), "run", "--node", "n1", "--adapter", "exec", "--target", "ticks", "x")
	cmd.Env = append(os.Environ(), "IOP_EDGE="+e.url)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || line != "started\n" {
		t.Fatalf("first line %q: %v", line, err)
	}
	_ = r.Close() // head -1 exits
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("%v, stderr %q; want exit 1", err, stderr.String())
	}
	m := regexp.MustCompile(`^iop: write /dev/stdout: broken pipe; run (run_\w+) is cancelled\n$`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("stderr %q", stderr.String())
	}
	if ri := waitRunStatus(t, e, m[1], "cancelled", 5*time.Second); ri.Error == nil || ri.Error.Message != "cancelled by request" {
		t.Fatalf("history of the run: %+v", ri.Error)
	}
}
