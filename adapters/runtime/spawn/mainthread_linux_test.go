package spawn

import (
	"fmt"
	"os"
	osexec "os/exec"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
)

// Locked in init, the main goroutine runs main, so TestMain, on the main
// thread, where TestMain then runs what onMainThread hands it: the tests
// run in goroutines of their own, as always.
func init() { runtime.LockOSThread() }

var mainThreadFuncs = make(chan func())

func TestMain(m *testing.M) {
	go func() { os.Exit(m.Run()) }()
	for f := range mainThreadFuncs {
		f()
	}
}

// onMainThread runs f on the process's main thread and returns when f has.
func onMainThread(f func()) {
	done := make(chan struct{})
	mainThreadFuncs <- func() { defer close(done); f() }
	<-done
}

// spawnerOnMainThread makes the spawner goroutine start on the main thread
// (where the Go scheduler may well put it) until the test ends.
func spawnerOnMainThread(t *testing.T) {
	t.Helper()
	spawner.mu.Lock()
	running := spawner.reqs != nil
	spawner.mu.Unlock()
	if running {
		t.Fatal("the spawner is running: a child of an earlier test is live")
	}
	old := goSpawner
	goSpawner = func(loop func()) {
		go onMainThread(loop)
	}
	t.Cleanup(func() { goSpawner = old })
}

// The spawner never forks on the main thread, even when its goroutine
// starts there: the main thread's children are the node's orphans.
func TestSpawnerNeverForksOnTheMainThread(t *testing.T) {
	spawnerOnMainThread(t)
	g, err := Start(osexec.Command("sleep", "300"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		g.Signal(syscall.SIGKILL)
		_ = g.Wait()
		g.Release()
	}()
	if kids := mainThreadChildren(); slices.Contains(kids, g.PGID()) {
		t.Fatalf("child %d was forked by the main thread (its children: %v)", g.PGID(), kids)
	}
	if p, ok := readStat(g.PGID()); !ok || p.ppid != selfPID {
		t.Fatalf("child %d: not this process's child (%+v, %v)", g.PGID(), p, ok)
	}
}

// adoptedRunsEnv, set, makes the re-run test binary the node of
// TestARunStartedAsTheOnlyOtherEndsIsNotItsOrphan.
const adoptedRunsEnv = "IOP_SPAWN_TEST_ADOPTED_RUNS"

// A node (after Adopt) that starts a run while the only other one is being
// reaped: the new run, forked but not yet registered, is no orphan of the
// one ending, however the scheduler placed the spawner. When the spawner
// forked on the main thread, the ending run's Wait took it for its orphan,
// killed and reaped it, and the new run's Wait failed with "waitid: no
// child processes" (or the run was SIGKILLed).
func TestARunStartedAsTheOnlyOtherEndsIsNotItsOrphan(t *testing.T) {
	if os.Getenv(adoptedRunsEnv) != "" {
		spawnerOnMainThread(t)
		if err := adoptedRuns(); err != nil {
			t.Fatal(err)
		}
		return
	}
	cmd := osexec.Command(os.Args[0], "-test.run=^TestARunStartedAsTheOnlyOtherEndsIsNotItsOrphan$", "-test.count=1")
	cmd.Env = append(os.Environ(), adoptedRunsEnv+"=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the node: %v\n%s", err, out)
	}
}

// adoptedRuns adopts and runs short children from two goroutines at once,
// so that one often starts while the other, then the only live one, is
// being reaped; it reports the first run that failed.
func adoptedRuns() error {
	if err := Adopt(); err != nil {
		return err
	}
	const runs = 300
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := range runs {
				g, err := Start(osexec.Command("true"))
				if err != nil {
					errs <- fmt.Errorf("worker %d run %d: start: %w", w, i, err)
					return
				}
				err = g.Wait()
				g.Release()
				if err != nil {
					errs <- fmt.Errorf("worker %d run %d (pid %d): %w", w, i, g.PGID(), err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
