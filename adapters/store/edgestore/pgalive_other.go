//go:build !unix

package edgestore

import "net"

// peerClosed cannot peek here; a statement on a connection the server
// ended is retried once instead (Store.retry).
func peerClosed(net.Conn) bool { return false }
