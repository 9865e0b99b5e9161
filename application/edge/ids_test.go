package edge

import (
	"regexp"
	"testing"
	"time"
)

func TestTimeOrderedID(t *testing.T) {
	format := regexp.MustCompile(`^run_[0-9a-f]{24}$`)
	t0 := time.UnixMilli(1_780_000_000_000)
	seen := map[string]bool{}
	prev := ""
	for i := range 10000 {
		id := timeOrderedID("run", t0.Add(time.Duration(i/10)*time.Millisecond))
		if !format.MatchString(id) {
			t.Fatalf("id %q", id)
		}
		if seen[id] {
			t.Fatalf("id %q made twice", id)
		}
		seen[id] = true
		if i%10 == 0 && id <= prev {
			t.Fatalf("id %q of a later millisecond sorts before %q", id, prev)
		}
		prev = id
	}
	if id := NewRunID(); !format.MatchString(id) {
		t.Fatalf("NewRunID = %q", id)
	}
	if id := newTunnelID(); !regexp.MustCompile(`^tun_[0-9a-f]{24}$`).MatchString(id) {
		t.Fatalf("newTunnelID = %q", id)
	}
}
