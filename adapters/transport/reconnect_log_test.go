package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// records keeps the log records a test's client writes.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// take returns the records since the last take.
func (r *records) take() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.recs
	r.recs = nil
	return out
}

func attrOf(rec slog.Record, key string) string {
	var v string
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

func warnings(recs []slog.Record) []slog.Record {
	var w []slog.Record
	for _, r := range recs {
		if r.Level >= slog.LevelWarn {
			w = append(w, r)
		}
	}
	return w
}

// refused is a failed dial's error, from local port port when it is not 0
// (the local address changes with every attempt).
func refused(port int) error {
	op := &net.OpError{Op: "read", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7700}, Err: errors.New("connection reset by peer")}
	if port != 0 {
		op.Source = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}
	}
	return fmt.Errorf("read register response: %w", op)
}

// A node that keeps failing to reach its edge warns at the first failure,
// for each new reason, and then once per RepeatWarning with the attempts
// since and the last error; every other attempt is at debug. It used to
// warn at every attempt, for as long as the edge stayed away.
func TestReconnectFailuresWarnRateLimited(t *testing.T) {
	logs := &records{}
	c := NewClient(ClientConfig{Addr: "edge:7700", MinBackoff: time.Nanosecond, MaxBackoff: time.Nanosecond,
		RepeatWarning: 5 * time.Minute, Transport: Config{Logger: slog.New(logs)}}, newFakeNode())
	clock := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	r := retryState{now: func() time.Time { return clock }}
	fail := func(err error) {
		t.Helper()
		r.begin(c)
		if stop, _ := c.retry(context.Background(), err, &r); stop {
			t.Fatal("stopped")
		}
	}

	// 200 attempts over 200 s, the local port different each time: one warning.
	for i := range 200 {
		fail(refused(40000 + i))
		clock = clock.Add(time.Second)
	}
	recs := logs.take()
	w := warnings(recs)
	if len(w) != 1 || len(recs) != 200 || w[0].Message != "cannot connect to the edge; retrying" {
		t.Fatalf("200 failures gave %d warnings of %d lines: %v", len(w), len(recs), w)
	}
	for _, rec := range recs[1:] {
		if rec.Level != slog.LevelDebug || rec.Message != "cannot connect to the edge; retrying" {
			t.Fatalf("a repeated failure logged %v %q", rec.Level, rec.Message)
		}
	}

	// Past five minutes since that warning: one more, counting the
	// attempts since and naming the last error.
	for i := range 200 {
		fail(refused(50000 + i))
		clock = clock.Add(time.Second)
	}
	w = warnings(logs.take())
	if len(w) != 1 || w[0].Message != "still cannot connect to the edge; retrying" {
		t.Fatalf("the next 200 s gave warnings %v, want one saying it still cannot connect", w)
	}
	if got := attrOf(w[0], "attempts"); got != "300" {
		t.Fatalf("the repeated warning counts %s attempts, want 300 (those since the first warning)", got)
	}
	if got := attrOf(w[0], "down_for"); got != "5m0s" {
		t.Fatalf("down_for %s, want 5m0s", got)
	}
	if got := attrOf(w[0], "err"); !strings.Contains(got, "connection reset by peer") {
		t.Fatalf("err %q, want the last error", got)
	}

	// A new reason warns at once; reasons alternating after that do not.
	fail(errors.New("tls: handshake failure"))
	if w := warnings(logs.take()); len(w) != 1 || !strings.Contains(attrOf(w[0], "err"), "tls") {
		t.Fatalf("a new reason gave warnings %v, want one", w)
	}
	for i := range 20 {
		fail(refused(60000 + i))
		fail(errors.New("tls: handshake failure"))
	}
	if w := warnings(logs.take()); len(w) != 0 {
		t.Fatalf("alternating between two reasons already reported warned %d times", len(w))
	}
	// A refusal's detail does not make a new reason.
	fail(&RejectedError{Reason: "at_capacity: 10 nodes"})
	fail(&RejectedError{Reason: "at_capacity: 11 nodes"})
	if w := warnings(logs.take()); len(w) != 1 {
		t.Fatalf("two refusals of one code gave %d warnings, want 1", len(w))
	}

	// The registration that ends the outage says how long it lasted.
	attrs := r.registered()
	if fmt.Sprint(attrs) != fmt.Sprint([]any{"down_for", 400 * time.Second, "failed_attempts", 443}) {
		t.Fatalf("registered adds %v", attrs)
	}
	if r.registered() != nil {
		t.Fatal("a registration without an outage added attributes")
	}

	// A lost link opens the next outage; the loss is no attempt.
	at := clock
	c.linkedAt.Store(&at)
	if stop, _ := c.retry(context.Background(), errors.New("heartbeat timeout"), &r); stop {
		t.Fatal("stopped")
	}
	clock = clock.Add(3 * time.Second)
	fail(refused(1))
	fail(refused(2))
	w = warnings(logs.take())
	if len(w) != 2 || w[0].Message != "link to edge lost; reconnecting" || w[1].Message != "cannot connect to the edge; retrying" {
		t.Fatalf("a lost link, then two refused attempts, gave warnings %v", w)
	}
	if attrs := r.registered(); fmt.Sprint(attrs) != fmt.Sprint([]any{"down_for", 3 * time.Second, "failed_attempts", 2}) {
		t.Fatalf("registered after a lost link adds %v", attrs)
	}
}
