package httpapi_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"iop/domain"
)

// stalledRequest sends a request on a raw connection with a tiny receive
// buffer, reads the response head, and then never reads again.
func stalledRequest(t *testing.T, base, method, path, body string) net.Conn {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", method, path, u.Host, len(body), body)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 1<<10), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	return conn
}

// A caller that keeps its connection open but stops reading must not hold a
// foreground run (and its node slot) forever: the stream gives up after
// WriteIdleTimeout and the run is cancelled as if the caller had left.
func TestRunStreamStalledReaderIsCut(t *testing.T) {
	big := strings.Repeat("x", 512<<10)
	var script []domain.RunEvent
	script = append(script, domain.RunEvent{Type: domain.EventStart})
	for range 60 {
		script = append(script, domain.RunEvent{Type: domain.EventDelta, Text: big})
	}
	link := newFakeLink(script...) // no terminal event: the run waits for a cancel
	e := newEnv(t, testNode{"n1", link})
	e.api.WriteIdleTimeout = 200 * time.Millisecond

	stalledRequest(t, e.srv.URL, "POST", "/v1/runs", `{"adapter":"exec","target":"t"}`)
	select {
	case <-link.cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("a stalled reader held the run: it was never cancelled")
	}
	waitFor(t, "the run's slot to be released", func() bool {
		n, _ := e.reg.Get("n1")
		return n.RunsInFlight == 0
	})
}

// The event feed gives up on a subscriber that stops reading, too.
func TestEventFeedStalledReaderIsCut(t *testing.T) {
	e := newEnv(t)
	e.api.WriteIdleTimeout = 200 * time.Millisecond
	stalledRequest(t, e.srv.URL, "GET", "/v1/events", "")
	big := strings.Repeat("y", 256<<10)
	ev := domain.BusEvent{Type: domain.BusRunEvent, Node: "n1", Run: &domain.RunEvent{Type: domain.EventDelta, Text: big}}
	// While the feed's handler is stuck, its buffer stays full and every
	// publish counts a drop; once it has given up and unsubscribed, none do.
	deadline := time.Now().Add(5 * time.Second)
	quiet := 0
	for quiet < 50 {
		if time.Now().After(deadline) {
			t.Fatal("a stalled reader kept its event feed (and its handler) forever")
		}
		before := e.bus.Dropped()
		e.bus.Publish(ev)
		if before > 0 && e.bus.Dropped() == before {
			quiet++
		} else {
			quiet = 0
		}
		if before == 0 {
			continue // fill the buffer quickly
		}
		time.Sleep(time.Millisecond)
	}
}

// A stalled feed holds a bounded amount of run output until it is cut, not
// its buffer's 1,024 events: of 400 output chunks of 64 KiB (25 MiB)
// published past a feed that stopped reading, all were buffered for it
// (1,024 deep), and 16 such feeds of one key held 400 MiB alive for the
// minute of their write deadline.
func TestEventFeedStalledReaderHoldsBoundedOutput(t *testing.T) {
	e := newEnv(t)
	e.api.WriteIdleTimeout = time.Minute
	stalledRequest(t, e.srv.URL, "GET", "/v1/events", "")
	chunk := domain.BusEvent{Type: domain.BusRunEvent, Node: "n1", Run: &domain.RunEvent{Type: domain.EventDelta, Text: strings.Repeat("z", 64<<10)}}
	const n = 400
	for range n {
		e.bus.Publish(chunk)
	}
	// What was not dropped is buffered, in the handler's hands, or in the
	// two sockets' buffers (a few MiB on loopback at most).
	if kept := n - int(e.bus.Dropped()); kept > 100 {
		t.Fatalf("a stalled feed kept %d of %d output chunks of 64 KiB (%d MiB); want at most 100", kept, n, kept/16)
	}
}
