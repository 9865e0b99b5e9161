//go:build linux

package main

import "golang.org/x/sys/unix"

// withoutEcho turns off the echo of the terminal fd, when fd is one, and
// returns what turns it back on; ok is false when fd is not a terminal.
func withoutEcho(fd uintptr) (restore func(), ok bool) {
	t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
	if err != nil {
		return nil, false
	}
	old := *t
	t.Lflag &^= unix.ECHO
	if err := unix.IoctlSetTermios(int(fd), unix.TCSETS, t); err != nil {
		return nil, false
	}
	return func() { _ = unix.IoctlSetTermios(int(fd), unix.TCSETS, &old) }, true
}
