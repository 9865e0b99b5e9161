package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/internal/lockedbuf"
)

// startPiped starts a binary whose stdout and stderr are a pipe, as under
// `ssh host iop-node …` or `iop-node | tee`; closing the returned reader is
// that session or tee going away.
func startPiped(t *testing.T, name string, env []string, args ...string) (*proc, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	out := &lockedbuf.Buffer{}
	go func() { _, _ = io.Copy(out, r) }() // ends when r is closed
	p := &proc{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM, 5*time.Second)
		_ = r.Close()
	})
	return p, r
}

// An edge and a node whose output's reader went away (the ssh session they
// were started from dropped, a `| tee` exited) go on serving, their log
// lines lost, and still stop gracefully: each used to die of SIGPIPE at its
// next log line, the node without ending its runs. A run's process still
// gets SIGPIPE's and SIGHUP's default dispositions.
func TestABrokenLogPipeEndsNeitherBinary(t *testing.T) {
	t.Parallel()
	e := &edge{transport: freeAddr(t), config: filepath.Join(t.TempDir(), "edge.yaml")}
	httpAddr := freeAddr(t)
	e.url = "http://" + httpAddr
	nodes := fmt.Sprintf(`
  - id: n1
    token: %s
    adapters:
      - name: exec
        type: exec
        targets:
          sigs: {command: ["grep", "^SigIgn", "/proc/self/status"]}
`, testToken)
	if err := os.WriteFile(e.config, []byte(edgeConfig(e.transport, httpAddr, nodes)), 0o600); err != nil {
		t.Fatal(err)
	}
	e.pin = printCAPin(t, e.config)
	var edgeOut, nodeOut *os.File
	e.proc, edgeOut = startPiped(t, "iop-edge", nil, "--config", e.config)
	waitHealthy(t, e.url, e.proc)
	db := filepath.Join(t.TempDir(), "node.db")
	np, nodeOut := startPiped(t, "iop-node", []string{"IOP_NODE_TOKEN=" + testToken},
		"--edge", e.transport, "--db", "file:"+db+"?cache=shared&mode=rwc", "--log-level", "debug", "--ca-pin", e.pin)
	waitNode(t, e, "n1")

	_ = edgeOut.Close()
	_ = nodeOut.Close()
	// Each logs at once: the edge every request, the node the run.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 3 {
		evs := collectRun(t, startRun(t, ctx, e, map[string]any{"node": "n1", "adapter": "exec", "target": "sigs"}))
		checkWellFormed(t, evs)
		var text string
		for _, ev := range evs {
			if ev.Type == "delta" {
				text += ev.Text
			}
		}
		if last := evs[len(evs)-1]; last.Type != "complete" {
			t.Fatalf("run %d after the pipes broke ended %+v", i, last)
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "SigIgn:")), 16, 64)
		if err != nil {
			t.Fatalf("run output %q: %v", text, err)
		}
		if mask&(1<<(syscall.SIGPIPE-1)) != 0 || mask&(1<<(syscall.SIGHUP-1)) != 0 {
			t.Fatalf("a run's process ignores SIGPIPE or SIGHUP (SigIgn %016x)", mask)
		}
	}
	if np.exited() || e.exited() {
		t.Fatalf("a broken log pipe ended a process (node exited: %v %v, edge exited: %v %v)", np.exited(), np.err, e.exited(), e.err)
	}
	if err := np.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := np.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("iop-node exited %d (%v) after SIGTERM", code, np.err)
	}
	if err := e.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := e.waitExit(t, 20*time.Second); code != 0 {
		t.Fatalf("iop-edge exited %d (%v) after SIGTERM", code, e.err)
	}
}
