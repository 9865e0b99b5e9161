package client

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An edge that sends headers and then goes silent without closing the
// connection must not hang the CLI: the stream ends with a clear error.
func TestSilentStreamEndsWithClearError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		_, _ = c.Read(buf)
		_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n: keep-alive\n\n"))
		time.Sleep(5 * time.Second) // silent, connection open
	}()
	resp, err := http.Get("http://" + ln.Addr().String() + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	body := newIdleBody(resp.Body, 200*time.Millisecond)
	defer body.Close()
	sse := NewSSEReader(body)
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := sse.Next(); err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if !strings.Contains(err.Error(), "presumed dead") {
			t.Fatalf("error = %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a silent stream hung the reader")
	}
}
