package httpapi_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A client still trickling its body (a byte every 5 ms, far below the
// minimum rate) is cut at the body bound with a 400 that says why, and the
// connection ends; the e2e test TestTrickledBodyCutLongStreamGoesOn checks
// the same on every surface at the default 10 s bound.
func TestTrickledBodyCutWithA400(t *testing.T) {
	e := newEnv(t)
	e.api.BodyTimeout = 200 * time.Millisecond
	u, err := url.Parse(e.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		path := "/v1/runs"
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{", path, u.Host)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		}()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		close(stop)
		<-done
		c.Close()
		// The server closes a connection whose client is still sending; a
		// byte landing in that instant makes the kernel end it with a reset
		// after the answer, which the client has read by then.
		if err != nil && errors.Is(err, syscall.ECONNRESET) && strings.Contains(string(b), "too slowly") {
			err = nil
		}
		if err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 400 ") || !strings.Contains(string(b), "too slowly") {
			t.Fatalf("attempt %d: answer %q, read error %v; want the 400 and the connection closed", i, b, err)
		}
	}
}
