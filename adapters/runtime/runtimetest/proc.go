package runtimetest

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// GroupGone waits up to d for every process of group pgid to be gone and
// reports whether they went. A killed process leaves once the kernel has
// run it to deliver the signal, which on a loaded machine takes a moment.
func GroupGone(pgid int, d time.Duration) bool {
	for end := time.Now().Add(d); GroupAlive(pgid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// GroupAlive reports whether any process of process group pgid is still
// running. Zombies count as dead: where the init process does not reap
// orphans (some containers), a killed grandchild stays a zombie for ever and
// keeps kill(-pgid, 0) succeeding. Without /proc it trusts kill(-pgid, 0).
func GroupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		state, pgrp, ok := procStat(pid)
		if ok && pgrp == pgid && state != 'Z' && state != 'X' {
			return true
		}
	}
	return false
}

// procStat reads the state and process group of pid from /proc/<pid>/stat,
// whose second field (the command name) may itself hold spaces and ")".
func procStat(pid int) (state byte, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	// After ") ": state ppid pgrp ...
	f := bytes.Fields(b[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, false
	}
	pgrp, err = strconv.Atoi(string(f[2]))
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], pgrp, true
}

// Detach returns shell commands that leave behind what an agent's tools
// can: `sleep secs` in a session of its own, a child of the shell (as the
// CLIs run their tool commands); the same double-forked, so that its
// parent has exited (an orphan); that again with an environment of PATH
// alone; and one left in a session whose leader (its parent) has exited,
// so that its process group has no leader. Each writes its pid to
// dir/tool, dir/orphan, dir/bare and dir/stray once in its session, and
// the commands end once all four have.
func Detach(t testing.TB, dir string, secs int) string {
	t.Helper()
	tool := filepath.Join(dir, "detached.sh")
	script := `echo $$ > "$(dirname "$0")/$1"; exec sleep ` + strconv.Itoa(secs) + " </dev/null >/dev/null 2>&1\n"
	if err := os.WriteFile(tool, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	wait := "while"
	for i, name := range detachedNames {
		if i > 0 {
			wait += " ||"
		}
		wait += " [ ! -s " + filepath.Join(dir, name) + " ]"
	}
	return "setsid /bin/sh " + tool + " tool & " +
		"sh -c 'setsid /bin/sh " + tool + " orphan &'; " +
		"sh -c 'env -i PATH=\"$PATH\" setsid /bin/sh " + tool + " bare &'; " +
		"setsid sh -c '/bin/sh " + tool + " stray &'; " +
		wait + "; do sleep 0.01; done; "
}

// detachedNames are the processes Detach leaves.
var detachedNames = []string{"tool", "orphan", "bare", "stray"}

// UntilGo returns a shell command that waits until Go is called on dir.
func UntilGo(dir string) string {
	return "while [ ! -e " + dir + "/go ]; do sleep 0.01; done; "
}

// Go ends the wait of UntilGo(dir).
func Go(t testing.TB, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// DetachedPIDs reads the pids Detach wrote to dir, by name ("tool",
// "orphan", "bare", "stray"), with their start times.
func DetachedPIDs(t testing.TB, dir string) map[string]Proc {
	t.Helper()
	out := map[string]Proc{}
	for _, name := range detachedNames {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %q", name, b)
		}
		p, ok := ProcOf(pid)
		if !ok {
			t.Fatalf("%s (pid %d) is not running", name, pid)
		}
		t.Cleanup(func() { p.kill() })
		out[name] = p
	}
	return out
}

// Proc is a process, told from a later one with its pid by its start time.
type Proc struct {
	PID   int
	Start uint64
}

// ProcOf returns the process pid is now, if there is one.
func ProcOf(pid int) (Proc, bool) {
	_, _, start, ok := procStart(pid)
	return Proc{PID: pid, Start: start}, ok
}

// Alive reports whether p is running (a zombie is not).
func (p Proc) Alive() bool {
	state, _, start, ok := procStart(p.PID)
	return ok && start == p.Start && state != 'Z' && state != 'X'
}

// Reaped reports whether p is gone, zombie included: it exited and its
// parent has waited for it.
func (p Proc) Reaped() bool {
	_, _, start, ok := procStart(p.PID)
	return !ok || start != p.Start
}

// Zombie reports whether p has exited but is not yet waited for.
func (p Proc) Zombie() bool {
	state, _, start, ok := procStart(p.PID)
	return ok && start == p.Start && (state == 'Z' || state == 'X')
}

func (p Proc) kill() {
	if p.Alive() {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
}

// WaitReaped waits up to d for p to be reaped and reports whether it was.
func (p Proc) WaitReaped(d time.Duration) bool {
	for end := time.Now().Add(d); !p.Reaped(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// procStart reads the state, parent and start time of pid.
func procStart(pid int) (state byte, ppid int, start uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, 0, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	start, err2 := strconv.ParseUint(string(f[19]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, 0, false
	}
	return f[0][0], ppid, start, true
}
