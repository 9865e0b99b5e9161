package procguard

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Protect marks the process not dumpable (prctl PR_SET_DUMPABLE 0): its
// /proc/PID files become root's, so /proc/PID/environ, mem and the like are
// refused to every other process of the user, ptrace attach is refused, and
// no core file is written. The process still reads what it needs of its own
// /proc/self (stat, status, limits, fd, maps). A child is dumpable again from
// its execve, so what the node starts is unaffected. Call it first in main,
// before any child can exist.
func Protect() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	return nil
}
