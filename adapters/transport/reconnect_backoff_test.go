package transport

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// Failed attempts never restart the backoff, however long each took (a
// handshake timing out against a saturated edge takes the whole handshake
// timeout, as long as HealthyAfter by default): only a link that
// registered and stayed up HealthyAfter does.
func TestSlowFailedAttemptsDoNotResetTheBackoff(t *testing.T) {
	c := NewClient(ClientConfig{Addr: "x", MinBackoff: time.Millisecond, MaxBackoff: time.Hour,
		HealthyAfter: 20 * time.Millisecond, Transport: Config{Logger: quietLogger()}}, newFakeNode())
	var r retryState
	for range 6 {
		r.begin(c)
		time.Sleep(25 * time.Millisecond) // the failed handshake took its whole timeout
		if stop, _ := c.retry(context.Background(), errors.New("read register response: i/o timeout"), &r); stop {
			t.Fatal("stopped")
		}
	}
	if r.attempt != 6 {
		t.Fatalf("after 6 failed attempts the backoff counter is %d, want 6", r.attempt)
	}
	// A link that registered and lasted restarts it.
	r.begin(c)
	at := time.Now().Add(-time.Second)
	c.linkedAt.Store(&at)
	if stop, _ := c.retry(context.Background(), errors.New("link lost"), &r); stop {
		t.Fatal("stopped")
	}
	if r.attempt != 1 {
		t.Fatalf("after a healthy link the counter is %d, want 1 (restarted, then this failure)", r.attempt)
	}
}

// Against an edge that takes connections and never answers, the node backs
// off further and further instead of retrying within MinBackoff forever.
func TestBackoffGrowsAgainstASilentEdge(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustf(t, err, "listen")
	var accepts atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		var held []net.Conn
		defer func() {
			for _, nc := range held {
				_ = nc.Close()
			}
		}()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			held = append(held, nc)
		}
	}()
	tc := testConfig()
	tc.HandshakeTimeout = 200 * time.Millisecond
	cl := startClient(t, ClientConfig{Addr: ln.Addr().String(), Token: testToken, Transport: tc,
		MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Minute, HealthyAfter: 200 * time.Millisecond}, newFakeNode())
	time.Sleep(4 * time.Second)
	_ = cl.stop(t)
	_ = ln.Close()
	<-done
	// A growing backoff fits about 6 attempts in 4 s; one reset after every
	// timed-out handshake about 16.
	if n := accepts.Load(); n > 11 {
		t.Fatalf("%d connection attempts in 4 s against an edge that never answers: the backoff never grew", n)
	}
}
