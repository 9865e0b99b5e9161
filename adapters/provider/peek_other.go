//go:build !unix

package provider

import "net"

// peerClosed cannot peek here; a request on a connection the provider
// closed is retried instead (leanClient.do).
func peerClosed(net.Conn) bool { return false }
