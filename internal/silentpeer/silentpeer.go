// Package silentpeer is a test peer that takes TCP connections and never
// answers on them: what a frozen process whose listen queue still accepts
// looks like to a client, for tests of its handshake and header timeouts.
package silentpeer

import (
	"net"
	"testing"
)

// Listen starts the peer on a free loopback port and returns its address.
// It holds every connection, unread, until the test ends.
func Listen(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return ln.Addr().String()
}
