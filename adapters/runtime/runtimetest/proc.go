package runtimetest

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
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
