//go:build !unix

// Package sockpeek tells whether an idle connection a pool holds can still
// carry a request; on this system it cannot look (see the unix build).
package sockpeek

import "net"

// Supported reports whether Closed can look at a socket on this system.
const Supported = false

// Closed cannot peek here: every connection counts as open, and callers
// retry a request a closed connection failed.
func Closed(net.Conn) bool { return false }
