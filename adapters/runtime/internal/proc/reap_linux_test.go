package proc_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"iop/adapters/runtime/internal/proc"
	"iop/adapters/runtime/runtimetest"
	"iop/adapters/runtime/spawn"
)

// As iop-node does: orphans of the children come to this process. Every
// child these tests start goes through spawn.Start.
func TestMain(m *testing.M) {
	if err := spawn.Adopt(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// agent is a started fake agent that has left the processes
// runtimetest.Detach leaves, and goes on running.
type agent struct {
	p      *proc.Process
	left   map[string]runtimetest.Proc
	cancel context.CancelFunc
	lines  *bufio.Reader
}

// startAgent starts a fake agent that detaches tools as the CLIs do, waits
// until it is ready and its tools' pids are read, then lets it run tail.
func startAgent(t *testing.T, grace time.Duration, tail string) *agent {
	t.Helper()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p, err := proc.Start(ctx, proc.Spec{Path: "/bin/sh", Args: []string{"-c", runtimetest.Detach(t, dir, 287) + "echo ready; " + runtimetest.UntilGo(dir) + tail}, KillGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{p: p, cancel: cancel, lines: bufio.NewReader(p.Stdout)}
	if line, err := a.lines.ReadString('\n'); line != "ready\n" {
		t.Fatalf("agent said %q, %v", line, err)
	}
	a.left = runtimetest.DetachedPIDs(t, dir)
	runtimetest.Go(t, dir)
	return a
}

// end waits for the agent (reading its output to the end).
func (a *agent) end() {
	_, _ = io.Copy(io.Discard, a.lines)
	a.p.Wait()
}

// requireReaped fails unless every process in left has exited and been
// waited for (no zombie left behind).
func requireReaped(t *testing.T, what string, left map[string]runtimetest.Proc) {
	t.Helper()
	for name, p := range left {
		if !p.WaitReaped(5 * time.Second) {
			t.Errorf("%s: the %s process (pid %d) is still there (zombie: %v)", what, name, p.PID, p.Zombie())
		}
	}
}

func requireAlive(t *testing.T, what string, left map[string]runtimetest.Proc) {
	t.Helper()
	for name, p := range left {
		if !p.Alive() {
			t.Errorf("%s: the %s process (pid %d) was killed", what, name, p.PID)
		}
	}
}

// A cancelled agent takes with it the tools it ran in sessions of their
// own, those whose parent has gone included, and they are reaped; another
// agent running meanwhile keeps its own.
func TestCancelKillsDetachedTools(t *testing.T) {
	other := startAgent(t, time.Second, "exec sleep 60")
	a := startAgent(t, time.Second, "exec sleep 60")
	a.cancel()
	a.end()
	if !a.p.Stopped() {
		t.Error("not Stopped")
	}
	requireReaped(t, "the cancelled agent's", map[string]runtimetest.Proc{"tool": a.left["tool"], "orphan": a.left["orphan"], "stray": a.left["stray"]})
	requireAlive(t, "the other agent's", other.left)
	// Its environment emptied, an orphan cannot be told from another
	// agent's: it goes once no other agent is running.
	requireAlive(t, "the cancelled agent's", map[string]runtimetest.Proc{"bare": a.left["bare"]})
	other.cancel()
	other.end()
	requireReaped(t, "the second agent's", other.left)
	requireReaped(t, "the first agent's", map[string]runtimetest.Proc{"bare": a.left["bare"]})
}

// An agent that ends on its own leaves nothing running either.
func TestExitKillsDetachedTools(t *testing.T) {
	a := startAgent(t, time.Second, "exit 0")
	a.end()
	if st := a.p.Stopped(); st {
		t.Error("Stopped for an agent that exited on its own")
	}
	requireReaped(t, "the agent's", a.left)
}

// Kill (the run's sink failed) kills the agent's tools too, at once.
func TestKillKillsDetachedTools(t *testing.T) {
	a := startAgent(t, time.Hour, "exec sleep 60")
	a.p.Kill()
	requireReaped(t, "the agent's", a.left)
}

// A TERM the agent ignores still ends with its tools killed after the
// grace; an agent that keeps running after its tools got TERM is not
// waited for longer.
func TestCancelIgnoringTermKillsDetachedTools(t *testing.T) {
	a := startAgent(t, 200*time.Millisecond, "trap '' TERM; while :; do sleep 0.1; done")
	a.cancel()
	a.end()
	requireReaped(t, "the agent's", a.left)
}

// The node stopping (spawn.KillAll) kills the tools of the agents still
// running.
func TestKillAllKillsDetachedTools(t *testing.T) {
	a := startAgent(t, time.Hour, "exec sleep 60")
	spawn.KillAll()
	requireReaped(t, "the agent's", a.left)
	a.end()
}

// An orphan that exits on its own while its agent runs is a zombie of this
// process's until the agent's end reaps it.
func TestExitedOrphanIsReaped(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	dir := t.TempDir()
	script := `sh -c 'setsid sh -c "echo \$\$ > ` + dir + `/quick; exec sleep 0.1" &'; ` +
		`while [ ! -s ` + dir + `/quick ]; do sleep 0.01; done; echo ready; ` + runtimetest.UntilGo(dir)
	p, err := proc.Start(context.Background(), proc.Spec{Path: "/bin/sh", Args: []string{"-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewReader(p.Stdout)
	if line, err := lines.ReadString('\n'); line != "ready\n" {
		t.Fatalf("agent said %q, %v", line, err)
	}
	b, err := os.ReadFile(dir + "/quick")
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		t.Fatal(err)
	}
	quick, ok := runtimetest.ProcOf(pid)
	if !ok {
		t.Fatal("the orphan is gone already")
	}
	for deadline := time.Now().Add(10 * time.Second); !quick.Zombie(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the orphan (pid %d) never became this process's zombie", pid)
		}
	}
	runtimetest.Go(t, dir)
	_, _ = io.Copy(io.Discard, lines)
	p.Wait()
	if !quick.Reaped() {
		t.Fatalf("the orphan (pid %d) is still a zombie after its agent ended", pid)
	}
}

// An agent that exited on its own was not stopped, even if its run's
// context ends while what it left is still being dealt with (here a
// process that escaped it, holding its stderr, while another agent runs:
// Wait waits for the stderr copy).
func TestExitedAgentNotStoppedByLateCancel(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	other := startAgent(t, time.Second, "exec sleep 60")
	defer func() { other.cancel(); other.end() }()
	dir := t.TempDir()
	script := `env -i setsid /bin/sh -c 'echo $$ > ` + dir + `/tmp && mv ` + dir + `/tmp ` + dir + `/escaped; exec sleep 60' >/dev/null & ` +
		`while [ ! -s ` + dir + `/escaped ]; do sleep 0.01; done; exit 0`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := proc.Start(ctx, proc.Spec{Path: "/bin/sh", Args: []string{"-c", script}, KillGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	leader, ok := runtimetest.ProcOf(p.PGID())
	if !ok {
		t.Fatal("the agent is gone already")
	}
	// Reaped: Wait has seen it exit, and waits for its stderr now.
	if !leader.WaitReaped(10 * time.Second) {
		t.Fatal("the agent never exited")
	}
	cancel()
	_, _ = io.Copy(io.Discard, p.Stdout)
	p.Wait()
	if p.Stopped() {
		t.Error("Stopped for an agent that exited on its own before its context ended")
	}
	b, err := os.ReadFile(dir + "/escaped")
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err == nil {
		if esc, ok := runtimetest.ProcOf(pid); ok {
			// The other agent's end takes it; if not, this does.
			t.Cleanup(func() {
				if esc.Alive() {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
		}
	}
}
