//go:build unix

// Package sockpeek tells whether an idle connection a pool holds can still
// carry a request, with one non-blocking peek at its socket (a system call,
// no wait, no goroutine per idle connection watching it).
package sockpeek

import (
	"crypto/tls"
	"net"
	"syscall"
)

// Supported reports whether Closed can look at a socket on this system.
const Supported = true

// Closed reports whether the idle connection nc can no longer carry a
// request: its peer closed or reset it, or sent bytes nobody asked for (a
// server's goodbye before it ends a session). A TLS connection is looked at
// on its socket: a record waiting or a close shows there. A connection that
// is no socket counts as open.
//
// The peek does not wait for readiness, so it returns at once whatever
// read deadline nc has, unless that deadline has already passed: the
// caller clears one it left set.
func Closed(nc net.Conn) bool {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	var buf [1]byte
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		_, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait for readiness
	})
	if err != nil {
		return true
	}
	// Nothing to read: still open. Anything else (the end of the stream,
	// unexpected bytes, an error) leaves it unusable.
	return perr != syscall.EAGAIN && perr != syscall.EWOULDBLOCK && perr != syscall.EINTR
}
