package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/adapters/runtime/runtimetest"
)

// detachNodes is n1 with exec targets that leave behind what an agent's
// tools can (runtimetest.Detach), then wait; each names the directory its
// pids go to.
func detachNodes(t *testing.T, targets ...string) (string, map[string]string) {
	t.Helper()
	dirs := map[string]string{}
	yaml := fmt.Sprintf("\n  - id: n1\n    token: %s\n    adapters:\n      - name: exec\n        type: exec\n        targets:", testToken)
	for _, name := range targets {
		dir := t.TempDir()
		dirs[name] = dir
		script, _ := json.Marshal(runtimetest.Detach(t, dir, 297) + "echo ready; exec sleep 300")
		yaml += fmt.Sprintf("\n          %s: {command: [\"sh\", \"-c\", %s]}", name, script)
	}
	return yaml + "\n", dirs
}

// A cancelled run takes with it what its command left running in sessions
// of its own, those whose parent had exited included, and the node reaps
// them; so does a node that stops.
func TestRunEndKillsDetachedProcesses(t *testing.T) {
	t.Parallel()
	nodes, dirs := detachNodes(t, "cancel", "stop")
	e := startEdge(t, nodes)
	n := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	runID, _, resp, r := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "cancel"})
	defer resp.Body.Close()
	left := runtimetest.DetachedPIDs(t, dirs["cancel"])
	if resp, body := postJSON(t, e.url+"/v1/runs/"+runID+"/cancel", nil); resp.StatusCode != 200 {
		t.Fatalf("cancel: %d %s", resp.StatusCode, body)
	}
	if last := lastEvent(t, r); last.Event != "cancelled" {
		t.Fatalf("last event %+v, want cancelled", last)
	}
	for name, p := range left {
		if !p.WaitReaped(5 * time.Second) {
			t.Errorf("the cancelled run's %s process (pid %d) is still there (zombie: %v)", name, p.PID, p.Zombie())
		}
	}

	_, _, resp2, _ := runUntilStarted(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "stop"})
	defer resp2.Body.Close()
	left = runtimetest.DetachedPIDs(t, dirs["stop"])
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := n.waitExit(t, 8*time.Second); code != 0 {
		t.Fatalf("node exited %d:\n%s", code, n.out.String())
	}
	for name, p := range left {
		if p.Alive() {
			t.Errorf("the %s process (pid %d) of a run outlived its node", name, p.PID)
		}
	}
}

// toolProcs returns the processes running `sleep secs` or a command line
// holding it (a shell running it), with their start times.
func toolProcs(secs string) []runtimetest.Proc {
	var out []runtimetest.Proc
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cl, []byte("sleep")) || !bytes.Contains(cl, []byte(secs)) {
			continue
		}
		if p, ok := runtimetest.ProcOf(pid); ok {
			out = append(out, p)
		}
	}
	return out
}

// stopDuringTool runs adapter, whose stand-in asks for a shell command that
// starts `sleep <bg>` in a session of its own and goes away, then runs
// `sleep <fg>`; once both run, it cancels the run. Every process of the
// command must be gone, and reaped, once the run is cancelled.
func stopDuringTool(t *testing.T, e *edge, adapter, fg, bg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp := startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": adapter, "input": "run the command"})
	defer resp.Body.Close()
	r := newSSE(resp.Body)
	ev, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	var first agentEvent
	_ = json.Unmarshal([]byte(ev.Data), &first)
	var fgs, bgs []runtimetest.Proc
	for deadline := time.Now().Add(90 * time.Second); len(fgs) == 0 || len(bgs) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the command never ran")
		}
		fgs, bgs = toolProcs(fg), toolProcs(bg)
	}
	if resp, body := postJSON(t, e.url+"/v1/runs/"+first.RunID+"/cancel", nil); resp.StatusCode != 200 {
		t.Fatalf("cancel: %d %s", resp.StatusCode, body)
	}
	waitRunStatus(t, e, first.RunID, "cancelled", 10*time.Second)
	for _, p := range append(fgs, bgs...) {
		if !p.WaitReaped(5 * time.Second) {
			cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID))
			t.Errorf("pid %d (%q) outlived the cancelled run (zombie: %v)", p.PID, strings.ReplaceAll(string(cl), "\x00", " "), p.Zombie())
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
}

// toolCommand is a shell command that leaves `sleep bg` behind in a
// session of its own, then runs `sleep fg`; fg and bg are unique to the
// test process, so that its processes are told from other tests'.
func toolCommand(tag int) (cmd, fg, bg string) {
	fg = fmt.Sprintf("%d.%d1", 600+tag, os.Getpid())
	bg = fmt.Sprintf("%d.%d2", 600+tag, os.Getpid())
	return fmt.Sprintf("sh -c 'setsid sleep %s </dev/null >/dev/null 2>&1 &'; sleep %s", bg, fg), fg, bg
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
