//go:build unix

package edgestore

import (
	"crypto/tls"
	"net"
	"syscall"
	"time"
)

// peerClosed reports whether an idle connection to PostgreSQL can no
// longer carry a statement: the server closed or reset it, or sent bytes
// nobody asked for (the FATAL a server sends before it ends a session: a
// restart, idle_session_timeout, pg_terminate_backend). One non-blocking
// peek, no wait (as the provider client's check of its idle connections).
func peerClosed(nc net.Conn) bool {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn() // the socket: a record waiting or a close shows there
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	// pgdriver leaves the last statement's read deadline set; once it has
	// passed, a read fails before it looks. Each statement sets its own.
	if err := nc.SetReadDeadline(time.Time{}); err != nil {
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
