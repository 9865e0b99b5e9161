package spawn

import (
	"bytes"
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

	"golang.org/x/sys/unix"
)

// sessionOf returns pid's session id and controlling terminal (tty_nr, 0
// for none) from /proc/PID/stat.
func sessionOf(t *testing.T, pid int) (sid, tty int) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	// After the command name: state, ppid, pgrp, session, tty_nr.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	sid, _ = strconv.Atoi(f[3])
	tty, _ = strconv.Atoi(f[4])
	return sid, tty
}

// A child leads a session of its own, without a controlling terminal, and
// its process group is still its pid.
func TestChildLeadsASessionOfItsOwn(t *testing.T) {
	g, err := Start(osexec.Command("sleep", "30"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		g.Signal(syscall.SIGKILL)
		_ = g.Wait()
		g.Release()
	}()
	pid := g.PGID()
	if sid, tty := sessionOf(t, pid); sid != pid || tty != 0 {
		t.Errorf("child %d: session %d, tty %d; want its own session (%d), no terminal", pid, sid, tty, pid)
	}
	if pgrp, ok := readStat(pid); !ok || pgrp.pgrp != pid {
		t.Errorf("child %d: process group %d; want its own", pid, pgrp.pgrp)
	}
}

// joinGroup names, in the re-run test binary, the process group it tries
// to join.
const joinGroup = "IOP_SPAWN_TEST_JOIN_GROUP"

// A child cannot hide in the node's process group, which runsOrphan and
// KillAll leave alone.
func TestChildCannotJoinTheNodesGroup(t *testing.T) {
	if pg := os.Getenv(joinGroup); pg != "" {
		pgrp, _ := strconv.Atoi(pg)
		fmt.Print(syscall.Setpgid(0, pgrp))
		os.Exit(0)
	}
	cmd := osexec.Command(os.Args[0], "-test.run=^TestChildCannotJoinTheNodesGroup$")
	cmd.Env = append(os.Environ(), joinGroup+"="+strconv.Itoa(syscall.Getpgrp()))
	var out bytes.Buffer
	cmd.Stdout = &out
	g, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	err = g.Wait()
	g.Release()
	if err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != syscall.EPERM.Error() {
		t.Fatalf("setpgid(0, the node's group) in a child: %q; want %q", got, syscall.EPERM.Error())
	}
}

// ttyNode names, in the re-run test binary, that it is a node run in a
// terminal (a session of its own whose controlling terminal is a pty).
const ttyNode = "IOP_SPAWN_TEST_TTY_NODE"

// A node run in a terminal does not make its children jobs of that
// terminal: one that reads /dev/tty (a git credential prompt, an ssh
// passphrase) is not stopped by SIGTTIN for ever, but finds no terminal.
func TestChildIsNotStoppedByTheNodesTerminal(t *testing.T) {
	if os.Getenv(ttyNode) != "" {
		ttyNodeMain()
		return
	}
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer ptmx.Close()
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Skipf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Skipf("pty number: %v", err)
	}
	pts, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("open pty: %v", err)
	}
	node := osexec.Command(os.Args[0], "-test.run=^TestChildIsNotStoppedByTheNodesTerminal$")
	node.Env = append(os.Environ(), ttyNode+"=1")
	node.Stdin = pts
	var out bytes.Buffer
	node.Stdout = &out
	node.Stderr = &out
	node.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	err = node.Start()
	pts.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Wait(); err != nil {
		t.Fatalf("node: %v: %s", err, out.String())
	}
	if got := out.String(); !strings.HasPrefix(got, "child: ") || !strings.Contains(got, "rc=") || strings.Contains(got, "rc=0") {
		t.Fatalf("node in a terminal, child reading /dev/tty: %q; want it to find no terminal", got)
	}
}

// ttyNodeMain is the node in a terminal: it starts a child that reads
// /dev/tty and reports whether it finished or was stopped.
func ttyNodeMain() {
	cmd := osexec.Command("sh", "-c", `read x </dev/tty; echo "rc=$?"`)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	g, err := Start(cmd)
	if err != nil {
		fmt.Println("start:", err)
		os.Exit(1)
	}
	done := make(chan struct{})
	go func() { _ = g.Wait(); close(done) }()
	for {
		select {
		case <-done:
			g.Release()
			fmt.Printf("child: %s", out.String())
			os.Exit(0)
		case <-time.After(10 * time.Millisecond):
		}
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(g.PGID()) + "/stat"); err == nil {
			s := string(b)
			if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 && f[0] == "T" {
				g.Signal(syscall.SIGKILL)
				<-done
				g.Release()
				fmt.Println("child stopped by the terminal")
				os.Exit(0)
			}
		}
	}
}

// startWithPID starts cmd with pid pid, by setting the pid namespace's last
// pid (root only); it skips the test when it cannot.
func startWithPID(t *testing.T, cmd *osexec.Cmd, pid int) {
	t.Helper()
	const lastPID = "/proc/sys/kernel/ns_last_pid"
	for range 20 {
		f, err := os.OpenFile(lastPID, os.O_WRONLY, 0)
		if err != nil {
			t.Skipf("cannot choose the next pid (%v)", err)
		}
		_, err = f.WriteString(strconv.Itoa(pid - 1))
		f.Close()
		if err != nil {
			t.Skipf("cannot choose the next pid (%v)", err)
		}
		c := *cmd
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		if c.Process.Pid == pid {
			*cmd = c
			return
		}
		// Another process forked in between: try again.
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	t.Skipf("pid %d kept going to other processes", pid)
}

// A group whose leader Wait has reaped but that is not yet released (the
// exec adapter releases it once the run's output is read and its end
// sent) is not killed by KillAll: its pid, so the group's id, may name an
// unrelated process by now.
func TestKillAllSparesAReapedGroupsPID(t *testing.T) {
	g, err := Start(osexec.Command("true"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	other := osexec.Command("sleep", "30")
	other.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	startWithPID(t, other, g.PGID())
	KillAll()
	// What ends it tells whether KillAll hit it.
	_ = other.Process.Signal(syscall.SIGTERM)
	err = other.Wait()
	if ws, ok := other.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("an unrelated process with a reaped group's pid %d ended with %v; want it left alone (ended by our SIGTERM)", g.PGID(), err)
	}
}

// startGroupWithPID starts name through Start with pid pid, as
// startWithPID does.
func startGroupWithPID(t *testing.T, pid int, name string, args ...string) *Group {
	t.Helper()
	const lastPID = "/proc/sys/kernel/ns_last_pid"
	for range 20 {
		if err := os.WriteFile(lastPID, []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Skipf("cannot choose the next pid (%v)", err)
		}
		g, err := Start(osexec.Command(name, args...))
		if err != nil {
			t.Fatal(err)
		}
		if g.PGID() == pid {
			return g
		}
		g.Signal(syscall.SIGKILL)
		_ = g.Wait()
		g.Release()
	}
	t.Skipf("pid %d kept going to other processes", pid)
	return nil
}

// The exec adapter releases a run's group only once the run's output is
// read and its end sent, after Wait reaped the leader; meanwhile the
// kernel may give the leader's pid to the node's next child. The late
// release must leave that child's group alone: live, recorded for after a
// crash, and its death signal's thread (the spawner) running.
func TestReleaseOfAReapedGroupSparesTheNextChildWithItsPID(t *testing.T) {
	file := filepath.Join(t.TempDir(), "node.db.children")
	if _, err := Record(file); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = Record("") })
	old, err := Start(osexec.Command("true"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Release()
	if err := old.Wait(); err != nil {
		t.Fatal(err)
	}
	next := startGroupWithPID(t, old.PGID(), "sleep", "30")
	defer next.Release()
	old.Release()

	spawner.mu.Lock()
	stopped := spawner.reqs == nil
	spawner.mu.Unlock()
	reg.mu.Lock()
	live := reg.live[next.PGID()] == next
	reg.mu.Unlock()
	groups, err := load(file)
	if err != nil {
		t.Fatal(err)
	}
	recorded := slices.ContainsFunc(groups, func(g *Group) bool { return g.pgid == next.PGID() })
	// What ends it tells whether the spawner's end killed it.
	next.Signal(syscall.SIGTERM)
	err = next.Wait()
	ws, ok := next.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if stopped || !live || !recorded || !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("after the release of a reaped group with the same pid %d: spawner stopped %v, the new group live %v, recorded %v; the new run ended with %v (want it ended by our SIGTERM)",
			old.PGID(), stopped, live, recorded, err)
	}
}
