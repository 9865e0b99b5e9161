//go:build !linux

package spawn

import (
	"os/exec"
	"sync"
	"syscall"
)

// Without Pdeathsig and /proc, children are killed at shutdown only. Each
// leads a session of its own, without a controlling terminal (see
// spawn_linux.go).
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

var spawner struct{ mu sync.Mutex }

func startLocked(cmd *exec.Cmd) (lo, hi uint64, err error) { return 0, 0, cmd.Start() }

func stopIfIdle() {}

func stopIfIdleLocked() {}

func startTime(int) uint64 { return 0 }

func stale(*Group) bool { return false }
