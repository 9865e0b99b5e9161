//go:build unix && !aix && !solaris

package sqlite

import (
	"errors"
	"os"
	"syscall"
)

var errLockHeld = errors.New("lock held by another process")

// flock takes f's exclusive flock without waiting. flock, not fcntl: its
// lock belongs to the open file, so a second LockFile in the same process
// (a test's second node) is refused too, and closing some other descriptor
// of the file does not drop it. Go opens files close-on-exec, so children
// never inherit it.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return errLockHeld
		}
		return err
	}
}
