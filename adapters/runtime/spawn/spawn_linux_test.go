package spawn

import (
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
	if got := recorded(t, file); got != fmt.Sprintf("%d@%d", g.PGID(), startTime(g.PGID())) {
		t.Fatalf("recorded %q; want the child", got)
	}
	if cmd.SysProcAttr.Pdeathsig != syscall.SIGKILL || !cmd.SysProcAttr.Setpgid {
		t.Fatalf("SysProcAttr %+v", cmd.SysProcAttr)
	}
	KillAll()
	_ = cmd.Wait()
	g.Release()
	if got := recorded(t, file); got != "" {
		t.Fatalf("recorded after release: %q", got)
	}
}
