package deadline

import (
	"testing"
	"time"
)

func TestLazyMovesOncePerSlack(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := Quarter(8 * time.Second)
	d, due := l.Next(t0)
	if !due || !d.Equal(t0.Add(8*time.Second)) {
		t.Fatalf("first call: %v, %v; want due at t0+8s", d, due)
	}
	if _, due := l.Next(t0.Add(2*time.Second - 1)); due {
		t.Fatal("moved again within a quarter of the timeout")
	}
	d, due = l.Next(t0.Add(2 * time.Second))
	if !due || !d.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("after a quarter: %v, %v; want due at t0+10s", d, due)
	}
}

func TestLazyWithoutTimeoutNeverDue(t *testing.T) {
	var l Lazy
	if _, due := l.Next(time.Now()); due {
		t.Fatal("a zero timeout reported a deadline")
	}
}
