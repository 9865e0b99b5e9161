package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitDraining waits (up to a generous deadline) until the edge lists node
// id as draining: the node has begun its graceful stop.
func waitDraining(t *testing.T, e *edge, id string) {
	t.Helper()
	waitFor(t, "node "+id+" draining", func() error {
		var nl nodeList
		if err := getJSON(e.url+"/v1/nodes", &nl); err != nil {
			return err
		}
		for _, n := range nl.Nodes {
			if n.ID == id && n.Connected && n.Draining {
				return nil
			}
		}
		return fmt.Errorf("not draining")
	})
}

// A second SIGTERM while the edge stops gracefully — here waiting for a
// provider tunnel that still streams, which it may do for 12 of the stop's
// 15 s — ends the edge at once with 143 (128 + SIGTERM) after one line
// saying so. fx swallowed the second signal: the edge went on waiting.
func TestSecondSIGTERMStopsTheEdgeAtOnce(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"x\":1}\n\n"))
		w.(http.Flusher).Flush()
		select { // a long generation
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(upstream.Close)
	t.Cleanup(func() { close(release) })
	e := startEdge(t, `
  - id: n1
    token: `+testToken+`
    providers: [{name: vllm, type: openai, base_url: "`+upstream.URL+`", models: [m]}]
`)
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var resp *http.Response
	waitFor(t, "the tunnel to open", func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
		req.Header.Set("Content-Type", "application/json")
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		if r.StatusCode != 200 {
			r.Body.Close()
			return fmt.Errorf("status %d", r.StatusCode)
		}
		resp = r
		return nil
	})
	defer resp.Body.Close()
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}

	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The stop has begun once the HTTP listener is closed.
	waitFor(t, "the edge's HTTP listener to close", func() error {
		r, err := http.Get(e.url + "/healthz")
		if err == nil {
			r.Body.Close()
			return fmt.Errorf("healthz answered %d", r.StatusCode)
		}
		return nil
	})
	if e.exited() {
		t.Fatalf("the edge did not wait for the tunnel:\n%s", e.out.String())
	}
	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The graceful stop would exit 0, after 12 s.
	if code := e.waitExit(t, 30*time.Second); code != 143 {
		t.Fatalf("iop-edge exited %d after a second SIGTERM, want 143:\n%s", code, e.out.String())
	}
	if out := e.out.String(); !strings.Contains(out, "stopping gracefully") || strings.Count(out, "second signal: stopping now without waiting") != 1 {
		t.Fatalf("want one line saying the second signal stops it:\n%s", out)
	}
}

// A node given SIGINT twice (Ctrl-C, Ctrl-C) while it drains a run that
// ignores SIGTERM exits at once with 130 (128 + SIGINT), and takes the
// run's process with it. A single signal still drains: the run ends
// cancelled at its caller and the node exits 0.
func TestSecondSIGINTStopsTheNodeAtOnce(t *testing.T) {
	t.Parallel()
	e := startEdge(t, drainNodes(drainProvider(t, "provider1"), drainProvider(t, "provider2")))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("twice", func(t *testing.T) {
		n := startNode(t, e, testToken)
		waitNode(t, e, "n1")
		_, pid, resp, _ := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "stubborn"})
		defer resp.Body.Close()
		if err := n.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		// The run holds the stop for 2 s (the exec adapter's SIGKILL grace).
		waitDraining(t, e, "n1")
		if err := n.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if code := n.waitExit(t, 30*time.Second); code != 130 {
			t.Fatalf("iop-node exited %d after a second SIGINT, want 130:\n%s", code, n.out.String())
		}
		if out := n.out.String(); !strings.Contains(out, "stopping gracefully") || strings.Count(out, "second signal: stopping now without waiting") != 1 {
			t.Fatalf("want one line saying the second signal stops it:\n%s", out)
		}
		waitGone(t, pid, 10*time.Second)
	})

	t.Run("once", func(t *testing.T) {
		n := startNode(t, e, "e2e-token-0002")
		waitNode(t, e, "n2")
		_, _, resp, r := runUntilStarted(t, ctx, e, map[string]any{"node": "n2", "adapter": "exec", "target": "stubborn"})
		defer resp.Body.Close()
		if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		var last sseEvent
		for {
			ev, err := r.Next()
			if err != nil {
				break
			}
			last = ev
		}
		if last.Event != "cancelled" {
			t.Fatalf("the run ended with %+v, want cancelled", last)
		}
		if code := n.waitExit(t, 30*time.Second); code != 0 {
			t.Fatalf("iop-node exited %d after one SIGTERM, want 0:\n%s", code, n.out.String())
		}
		if out := n.out.String(); !strings.Contains(out, "stopping gracefully") || strings.Contains(out, "second signal") {
			t.Fatalf("output:\n%s", out)
		}
	})
}

// A foreground run whose stream the edge's graceful stop cuts is recorded
// cancelled ("edge shutting down") in the edge's history before the edge
// exits, as the README says: the stop cut the following of the run at once,
// so the row stayed running until the node registered again — for good
// when it never did (here it stops too, as on a host's shutdown).
func TestEdgeStopRecordsTheRunsItCut(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	n := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runID, pid, resp, r := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "sleep"})
	defer resp.Body.Close()

	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if last := lastEvent(t, r); last.Event != "error" || !strings.Contains(last.Data, `"code":"shutting_down"`) {
		t.Fatalf("the run's stream ended with %+v, want error shutting_down", last)
	}
	if code := e.waitExit(t, 20*time.Second); code != 0 {
		t.Fatalf("iop-edge exited %d:\n%s", code, e.out.String())
	}
	waitGone(t, pid, 5*time.Second)
	n.stop(syscall.SIGTERM, 10*time.Second)

	e.proc = startEdgeProc(t, e.config)
	waitHealthy(t, e.url, e.proc)
	var ri runInfo
	if err := getJSON(e.url+"/v1/runs/"+runID, &ri); err != nil {
		t.Fatal(err)
	}
	if ri.Status != "cancelled" || ri.Error == nil || ri.Error.Message != "edge shutting down" {
		t.Fatalf("the history after the edge's stop holds %+v, want cancelled: edge shutting down", ri)
	}
	var page struct {
		Runs []runInfo `json:"runs"`
	}
	if err := getJSON(e.url+"/v1/runs?status=running", &page); err != nil || len(page.Runs) != 0 {
		t.Fatalf("running rows after the edge's stop: %+v %v", page.Runs, err)
	}
}
