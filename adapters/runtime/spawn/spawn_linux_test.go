package spawn

import (
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/adapters/runtime/runtimetest"
)

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if !alive(pid) {
			return
		}
	}
	t.Fatalf("pid %d still alive", pid)
}

// leftover starts what an earlier node would have left: a group whose leader
// is dead and whose member (a sleep) lives on. It returns the group and the
// member's pid.
func leftover(t *testing.T) (pgid, member int) {
	t.Helper()
	cmd := osexec.Command("sh", "-c", "sleep 30 & echo $!; wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Fscan(out, &pid); err != nil {
		t.Fatal(err)
	}
	pgid = cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !alive(pid) {
		t.Fatal("the member died with its leader")
	}
	return pgid, pid
}

func TestRecordKillsWhatAnEarlierNodeLeft(t *testing.T) {
	file := filepath.Join(t.TempDir(), "node.db.children")
	pgid, member := leftover(t)
	// A live leader that is not the recorded process (its start time
	// differs: the pid was reused) is left alone.
	other := osexec.Command("sleep", "30")
	other.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	rec := fmt.Sprintf("%d 1\n%d %d\n", pgid, other.Process.Pid, startTime(other.Process.Pid)+1)
	if err := os.WriteFile(file, []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	killed, err := Record(file)
	t.Cleanup(func() { _, _ = Record("") })
	if err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Errorf("killed %d groups; want 1", killed)
	}
	waitGone(t, member)
	if !alive(other.Process.Pid) {
		t.Error("an unrelated process reusing a recorded pid was killed")
	}
}

func TestStartRecordsAndReleases(t *testing.T) {
	file := filepath.Join(t.TempDir(), "node.db.children")
	if _, err := Record(file); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = Record("") })
	cmd := osexec.Command("sleep", "30")
	g, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := load(file)
	if err != nil || len(groups) != 1 || groups[0].pgid != g.PGID() {
		t.Fatalf("recorded %v, %v; want the child %d", groups, err, g.PGID())
	}
	// The recorded range holds the start time /proc reports, which is what
	// a restarted node compares it with.
	if st := startTime(g.PGID()); st == 0 || st < groups[0].start || st > groups[0].startMax {
		t.Fatalf("child started at tick %d; recorded [%d, %d]", st, groups[0].start, groups[0].startMax)
	}
	if cmd.SysProcAttr.Pdeathsig != syscall.SIGKILL || !cmd.SysProcAttr.Setsid || cmd.SysProcAttr.Setpgid {
		t.Fatalf("SysProcAttr %+v", cmd.SysProcAttr)
	}
	KillAll()
	_ = cmd.Wait()
	g.Release()
	if got := recorded(t, file); got != "" {
		t.Fatalf("recorded after release: %q", got)
	}
}

// A recorded leader still alive with its start time in the recorded range
// is the earlier node's child, and its group is killed.
func TestRecordKillsALiveLeaderStartedInTheRecordedRange(t *testing.T) {
	file := filepath.Join(t.TempDir(), "node.db.children")
	leader := osexec.Command("sleep", "30")
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	pid := leader.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL); _ = leader.Wait() })
	st := startTime(pid)
	if st == 0 {
		t.Fatal("no start time")
	}
	if err := os.WriteFile(file, fmt.Appendf(nil, "%d %d %d\n", pid, st-1, st+1), 0o600); err != nil {
		t.Fatal(err)
	}
	killed, err := Record(file)
	t.Cleanup(func() { _, _ = Record("") })
	if err != nil || killed != 1 {
		t.Fatalf("Record = %d, %v; want the group killed", killed, err)
	}
	_ = leader.Wait()
}

// BenchmarkChildStartTime is what Start pays to record a child's start
// time: reading /proc/PID/stat after the fork (before) against reading the
// boot clock on both sides of it.
func BenchmarkChildStartTime(b *testing.B) {
	child := osexec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	b.Run("proc-stat", func(b *testing.B) {
		runtimetest.ReportCPU(b, func() {
			for b.Loop() {
				_ = startTime(child.Process.Pid)
			}
		})
	})
	b.Run("boot-clock", func(b *testing.B) {
		runtimetest.ReportCPU(b, func() {
			for b.Loop() {
				_, _ = bootTicks(), bootTicks()
			}
		})
	})
}

// BenchmarkWaitSweep is what Wait adds to a run whose command left nothing
// behind, after the child has exited: the leader's group killed (as before)
// and, in a node that called Adopt, the main thread's children read for
// orphans of its own.
func BenchmarkWaitSweep(b *testing.B) {
	was := adopted.Swap(true) // as after Adopt; this process has no orphans
	b.Cleanup(func() { adopted.Store(was) })
	g := &Group{pgid: fakePGID, tagged: []byte("\x00" + TagEnv + "=bench\x00")}
	runtimetest.ReportCPU(b, func() {
		for b.Loop() {
			g.reaped = false
			g.reap()
		}
	})
}

// A child's tree is the same whether the kernel lists each task's children
// or a scan of every process's parent stands in for the lists.
func TestSubtreeWithoutChildrenFiles(t *testing.T) {
	cmd := osexec.Command("sh", "-c", "setsid sleep 30 & sh -c 'sleep 30 & wait' & echo; wait")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range subtree([]pinfo{{pid: cmd.Process.Pid}}) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		_ = cmd.Wait()
	})
	if _, err := out.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	root, ok := readStat(cmd.Process.Pid)
	if !ok {
		t.Fatal("no root")
	}
	pids := func() string {
		var s []int
		for _, p := range subtree([]pinfo{root}) {
			s = append(s, p.pid)
		}
		slices.Sort(s)
		return fmt.Sprint(s)
	}
	var lists string
	// The shells fork as they go: wait until all four are there.
	for deadline := time.Now().Add(5 * time.Second); strings.Count(lists, " ") < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("tree %s: want the shell, a sleep, a shell and its sleep", lists)
		}
		lists = pids()
	}
	if !childrenFiles() {
		t.Skip("no children files to compare with")
	}
	was := childrenFiles
	childrenFiles = func() bool { return false }
	defer func() { childrenFiles = was }()
	if scanned := pids(); scanned != lists {
		t.Fatalf("scanned tree %s, listed %s", scanned, lists)
	}
}

// A group another call holds (a Wait killing a leftover slow to die, for up
// to reapWait) does not keep KillAll from killing the others: the node's
// forced stop gives KillAll a second at most before it exits.
func TestKillAllKillsTheOthersWhileAGroupIsHeld(t *testing.T) {
	a := osexec.Command("sleep", "30")
	ga, err := Start(a)
	if err != nil {
		t.Fatal(err)
	}
	defer ga.Release()
	b := osexec.Command("sh", "-c", "sleep 30 & echo $!; wait")
	out, err := b.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	gb, err := Start(b)
	if err != nil {
		ga.Signal(syscall.SIGKILL)
		_ = ga.Wait()
		t.Fatal(err)
	}
	defer gb.Release()
	var member int
	if _, err := fmt.Fscan(out, &member); err != nil {
		t.Fatal(err)
	}
	// A's lock held, as reap holds it while it awaits a killed process.
	ga.mu.Lock()
	done := make(chan struct{})
	go func() { KillAll(); close(done) }()
	for deadline := time.Now().Add(5 * time.Second); alive(member) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	bAlive := alive(member)
	ga.mu.Unlock()
	<-done
	// A, unreaped, is killed once its holder lets go.
	errA := ga.Wait()
	errB := gb.Wait()
	if bAlive {
		t.Fatal("KillAll did not kill group B while group A's lock was held")
	}
	for name, err := range map[string]error{"A": errA, "B": errB} {
		if err == nil || !strings.Contains(err.Error(), "killed") {
			t.Errorf("group %s's leader ended with %v; want it killed", name, err)
		}
	}
}
