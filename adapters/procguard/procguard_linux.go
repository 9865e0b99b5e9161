package procguard

import (
	"fmt"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Protect marks the process not dumpable (prctl PR_SET_DUMPABLE 0): its
// /proc/PID files become root's, so /proc/PID/environ, mem and the like are
// refused to every other process of the user, ptrace attach is refused, and
// no core file is written. The process still reads what it needs of its own
// /proc/self (stat, status, limits, fd, maps). A child is dumpable again from
// its execve, so what the node starts is unaffected.
//
// It also marks close-on-exec every descriptor above stderr the process
// inherited (a launcher's pipe, a file a wrapper script opened): a child
// gets its stdin, stdout, stderr and what it is explicitly given, never
// what happened to be open in whoever started the node. (What the process
// opens itself is close-on-exec already: Go opens everything so.) Call it
// first in main, before any child can exist.
func Protect() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	return closeInheritedOnExec()
}

// closeInheritedOnExec sets FD_CLOEXEC on every descriptor from 3 up: with
// close_range (Linux 5.11), else one by one from /proc/self/fd.
func closeInheritedOnExec() error {
	if err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list inherited descriptors: %w", err)
	}
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		// One closed since the listing (the listing's own) fails with
		// EBADF: nothing to mark.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && err != unix.EBADF {
			return fmt.Errorf("mark descriptor %d close-on-exec: %w", fd, err)
		}
	}
	return nil
}
