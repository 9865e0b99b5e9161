package client

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
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

// slowBody yields its chunks one per Read; Close makes every later Read fail.
type slowBody struct {
	chunks []string
	closed atomic.Bool
}

func (s *slowBody) Read(p []byte) (int, error) {
	if s.closed.Load() {
		return 0, errors.New("read on closed body")
	}
	if len(s.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.chunks[0])
	s.chunks = s.chunks[1:]
	return n, nil
}

func (s *slowBody) Close() error { s.closed.Store(true); return nil }

// Time the caller spends between reads (writing to a slow stdout) is not
// the edge's silence: only a wait inside Read counts. The idle timer ran
// between reads too, and cut a healthy stream whose reader was busy.
func TestIdleTimerCountsOnlyTimeInRead(t *testing.T) {
	src := &slowBody{chunks: []string{"event: delta\ndata: {}\n\n", "event: complete\ndata: {}\n\n"}}
	// A limit no Read comes near, however loaded the machine (with 10 ms,
	// a Read descheduled that long was taken for silence).
	body := newIdleBody(src, time.Hour)
	defer body.Close()
	sse := NewSSEReader(body)
	if _, err := sse.Next(); err != nil {
		t.Fatal(err)
	}
	// The caller is now busy elsewhere, for as long as it takes: no Read
	// is waiting, so no idle timer may be running. (Stop reports whether
	// it stopped one.)
	if body.t.Stop() {
		t.Fatal("the idle timer runs between reads: a busy caller would be taken for a silent edge")
	}
	ev, err := sse.Next()
	if err != nil || ev.Type != "complete" {
		t.Fatalf("after a busy caller: %+v, %v", ev, err)
	}
	if src.closed.Load() {
		t.Fatal("the idle timer closed the body between reads")
	}
}
