package exec_test

import (
	"context"
	"errors"
	osexec "os/exec"
	"strings"
	"testing"
	"time"

	"iop/adapters/runtime/exec"
	"iop/adapters/runtime/runtimetest"
	"iop/domain"
)

// detaching is a target that leaves behind what runtimetest.Detach does,
// prints "ready", then runs tail once runtimetest.Go is called on the
// returned dir (where its pids are).
func detaching(t *testing.T, tail string) (domain.ExecTarget, string) {
	t.Helper()
	if _, err := osexec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	dir := t.TempDir()
	return shell(runtimetest.Detach(t, dir, 293) + "echo ready; " + runtimetest.UntilGo(dir) + tail), dir
}

// run is a run in progress.
type run struct {
	sink   *runtimetest.Sink
	cancel context.CancelFunc
	done   chan error
}

// startRun starts target on a and waits until it has printed "ready".
func startRun(t *testing.T, a *exec.Adapter, target string) *run {
	t.Helper()
	ctx, cancel := context.WithCancel(testContext(t))
	t.Cleanup(cancel)
	r := &run{sink: &runtimetest.Sink{}, cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- a.Execute(ctx, domain.RunRequest{RunID: target, Adapter: "local", Target: target}, r.sink)
	}()
	ready := func(evs []domain.RunEvent) bool {
		for _, ev := range evs {
			if ev.Type.Terminal() || strings.Contains(ev.Text, "ready") {
				return true
			}
		}
		return false
	}
	if err := r.sink.WaitFor(testContext(t), ready); err != nil || !strings.Contains(r.sink.Text(), "ready") {
		t.Fatalf("the target never got ready (%v): %v", err, r.sink.Events())
	}
	return r
}

func requireReaped(t *testing.T, what string, left map[string]runtimetest.Proc, names ...string) {
	t.Helper()
	for _, name := range names {
		if p := left[name]; !p.WaitReaped(5 * time.Second) {
			t.Errorf("%s: the %s process (pid %d) is still there (zombie: %v)", what, name, p.PID, p.Zombie())
		}
	}
}

// A cancelled, a timed-out and a finished run each take with them what
// their command left in sessions of its own, reaped; a run going on
// meanwhile keeps its own, and takes them when it ends.
func TestRunEndKillsDetachedProcesses(t *testing.T) {
	other, otherDir := detaching(t, "exec sleep 60")
	cancelled, cancelledDir := detaching(t, "exec sleep 60")
	timedOut, timedOutDir := detaching(t, "exec sleep 60")
	timedOut.Timeout = 3 * time.Second // long enough for the pids to be read first
	finished, finishedDir := detaching(t, "exit 0")
	a := newAdapter(t, map[string]domain.ExecTarget{"other": other, "cancelled": cancelled, "timed-out": timedOut, "finished": finished})
	a.KillGrace = time.Second

	o := startRun(t, a, "other")
	otherLeft := runtimetest.DetachedPIDs(t, otherDir)
	runtimetest.Go(t, otherDir)

	r := startRun(t, a, "cancelled")
	left := runtimetest.DetachedPIDs(t, cancelledDir)
	runtimetest.Go(t, cancelledDir)
	r.cancel()
	if err := <-r.done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
	requireReaped(t, "cancelled", left, "tool", "orphan", "stray")
	// Without its tag, an orphan is not told from another run's until no
	// other run is going.
	if p := left["bare"]; !p.Alive() {
		t.Error("cancelled: the orphan with an emptied environment went while another run was going")
	}

	r = startRun(t, a, "timed-out")
	timedOutLeft := runtimetest.DetachedPIDs(t, timedOutDir)
	runtimetest.Go(t, timedOutDir)
	if err := <-r.done; err != nil {
		t.Fatalf("timed-out run: %v", err)
	}
	requireTerminal(t, r.sink, domain.EventError, domain.CodeTimeout)
	requireReaped(t, "timed out", timedOutLeft, "tool", "orphan", "stray")

	r = startRun(t, a, "finished")
	finishedLeft := runtimetest.DetachedPIDs(t, finishedDir)
	runtimetest.Go(t, finishedDir)
	if err := <-r.done; err != nil {
		t.Fatalf("finished run: %v", err)
	}
	requireTerminal(t, r.sink, domain.EventComplete, "")
	requireReaped(t, "finished", finishedLeft, "tool", "orphan", "stray")

	for name, p := range otherLeft {
		if !p.Alive() {
			t.Errorf("the other run's %s process (pid %d) was killed", name, p.PID)
		}
	}
	o.cancel()
	if err := <-o.done; !errors.Is(err, context.Canceled) {
		t.Fatalf("other run: %v", err)
	}
	requireReaped(t, "other", otherLeft, "tool", "orphan", "bare", "stray")
	// The last run gone, so are the untagged orphans the others left.
	requireReaped(t, "cancelled", left, "bare")
	requireReaped(t, "timed out", timedOutLeft, "bare")
	requireReaped(t, "finished", finishedLeft, "bare")
}
