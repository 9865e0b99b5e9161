//go:build unix

package sockpeek_test

import (
	"net"
	"testing"
	"time"

	"iop/adapters/internal/sockpeek"
)

// pair returns the two ends of a loopback TCP connection.
func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// eventually polls Closed until it says want (the peer's FIN or bytes take
// a moment to arrive), failing after a generous wait.
func eventually(t *testing.T, c net.Conn, want bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if sockpeek.Closed(c) == want {
			return
		}
	}
	t.Fatalf("%s: Closed stayed %v", what, !want)
}

func TestClosed(t *testing.T) {
	c, s := pair(t)
	if sockpeek.Closed(c) {
		t.Fatal("an open, quiet connection counted closed")
	}
	s.Close()
	eventually(t, c, true, "peer closed")

	c, s = pair(t)
	if _, err := s.Write([]byte("FATAL")); err != nil {
		t.Fatal(err)
	}
	eventually(t, c, true, "unasked-for bytes")

	// A peek reads nothing: the bytes are still there for a reader.
	buf := make([]byte, 5)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "FATAL" {
		t.Fatalf("read after peek: %q, %v", buf[:n], err)
	}
}
