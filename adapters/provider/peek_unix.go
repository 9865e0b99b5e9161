//go:build unix

package provider

import (
	"net"
	"syscall"
)

// peerClosed reports whether an idle connection can no longer carry a
// request: the provider closed or reset it, or sent bytes nobody asked for.
// One non-blocking peek (a system call, no wait) before each reuse catches
// providers that close idle connections after a few seconds (uvicorn's
// default keep-alive is 5 s) without a goroutine per idle connection
// watching for it, as http.Transport has.
func peerClosed(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	var buf [1]byte
	var n int
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait for readiness
	})
	if err != nil {
		return true
	}
	if perr == syscall.EAGAIN || perr == syscall.EWOULDBLOCK || perr == syscall.EINTR {
		return false // nothing to read: still open
	}
	_ = n // n == 0: end of stream; n > 0: unexpected bytes; either way unusable
	return true
}
