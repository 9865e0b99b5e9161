package node

import (
	"fmt"
	"testing"
	"time"
)

// Missed cancels are bounded in time and number: an id is honoured within
// missedCancelTTL only, at most maxMissedCancels are kept (oldest out
// first), and a flood of cancels for unknown runs costs no more.
func TestMissedCancelsAreBounded(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	var c missedCancels
	c.add("a", "", t0)
	if c.take("a", t0.Add(missedCancelTTL)) != nil {
		t.Fatal("a missed cancel was honoured past its TTL")
	}
	c.add("b", "", t0)
	if c.take("b", t0.Add(missedCancelTTL-time.Millisecond)) == nil || c.take("b", t0) != nil {
		t.Fatal("a missed cancel within its TTL must be honoured once")
	}

	for i := range 3 * maxMissedCancels {
		c.add(fmt.Sprintf("x%d", i), "", t0.Add(time.Duration(i)*time.Microsecond))
	}
	if len(c.at) > maxMissedCancels || len(c.queue) > maxMissedCancels {
		t.Fatalf("%d ids (%d queued) kept, want at most %d", len(c.at), len(c.queue), maxMissedCancels)
	}
	now := t0.Add(time.Second)
	if c.take("x0", now) != nil || c.take(fmt.Sprintf("x%d", 3*maxMissedCancels-1), now) == nil {
		t.Fatal("the oldest id must go first, the newest stay")
	}

	// Expired ids leave with the next add, however few there are.
	c.add("late", "", t0.Add(time.Hour))
	if len(c.at) != 1 || len(c.queue) != 1 {
		t.Fatalf("after expiry %d ids (%d queued) kept, want only the new one", len(c.at), len(c.queue))
	}
	// A cancel repeated for the same id keeps its newest time.
	c.add("r", "", t0.Add(2*time.Hour))
	c.add("r", "", t0.Add(2*time.Hour+missedCancelTTL/2))
	if c.take("r", t0.Add(2*time.Hour+missedCancelTTL)) == nil {
		t.Fatal("a repeated cancel did not renew the id")
	}
}
