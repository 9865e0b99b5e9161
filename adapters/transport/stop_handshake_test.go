package transport

import (
	"net"
	"testing"
	"time"
)

// A node stopping while an edge that took its connection does not answer
// (a load balancer without a backend, a frozen edge) stops at once, over
// plaintext and TLS alike: the register exchange used to run under its own
// deadline only, so the stop waited out the handshake timeout.
func TestStopEndsAHandshakeTheEdgeDoesNotAnswer(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "plaintext", true: "tls"}[withTLS], func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			mustf(t, err, "listen")
			accepted := make(chan net.Conn, 1)
			go func() {
				nc, err := ln.Accept()
				if err == nil {
					accepted <- nc
				}
			}()
			t.Cleanup(func() { _ = ln.Close() })
			tc := testConfig()
			tc.HandshakeTimeout = time.Hour
			if withTLS {
				tc.TLS = clientTLS(t, ClientTLS{CAPin: "sha256:" + "00000000000000000000000000000000000000000000000000000000000000aa"}, ln.Addr().String())
			}
			cl := startClient(t, ClientConfig{Addr: ln.Addr().String(), Token: testToken, Transport: tc}, newFakeNode())
			select {
			case nc := <-accepted:
				defer nc.Close()
			case <-time.After(30 * time.Second):
				t.Fatal("the node never connected")
			}
			cl.cancel()
			select {
			case <-cl.done:
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return after its stop while the edge did not answer the handshake")
			}
		})
	}
}
