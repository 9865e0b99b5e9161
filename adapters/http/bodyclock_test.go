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

// The review's report: the body bound grew one second per 16 KiB read, so
// a client that sent 8 MiB at once could then idle ~520 s while the edge
// held the body's memory. Each wait for the body's next bytes is now
// bounded too: the client that stops is cut with a 400 that says so, long
// before the total bound it had earned.
func TestStalledBodyCutAtTheIdleBound(t *testing.T) {
	e := newEnv(t)
	e.api.BodyTimeout = time.Minute // the total bound is far off
	e.api.BodyIdleTimeout = 200 * time.Millisecond
	u, err := url.Parse(e.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/runs HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"input\":\"%s", u.Host, 256<<10, strings.Repeat("x", 128<<10))
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil && !(errors.Is(err, syscall.ECONNRESET) && len(b) > 0) {
		t.Fatalf("answer %q: %v", b, err)
	}
	if !strings.HasPrefix(string(b), "HTTP/1.1 400 ") || !strings.Contains(string(b), "no bytes for") {
		t.Fatalf("answer %q; want a 400 for a stalled body and the connection closed", b)
	}
}
