package connquota

import (
	"fmt"
	"testing"
)

func TestKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7:4444":                    "192.0.2.7",
		"192.0.2.7":                         "192.0.2.7",
		"[::ffff:192.0.2.7]:80":             "192.0.2.7",
		"[2001:db8:1:2:aaaa::1]:7700":       "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff:ffff:ffff:1]:1": "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:7700":            "2001:db8:1:3::/64",
		"[fe80::1%eth0]:7700":               "fe80::/64",
		"[::1]:7701":                        "::/64",
		"@":                                 "@",
		"pipe":                              "pipe",
	} {
		if got := Key(in); got != want {
			t.Errorf("Key(%q) = %q; want %q", in, got, want)
		}
	}
}

// admit admits one connection named name from key and fails on refusal.
func admit(t *testing.T, q *Quota[string], key, name string) (*Member[string], *Member[string]) {
	t.Helper()
	m, victim, why := q.Admit(key, name)
	if why != "" {
		t.Fatalf("%s from %s refused: %s", name, key, why)
	}
	return m, victim
}

func TestPerKeyCap(t *testing.T) {
	q := New[string](100, 2)
	admit(t, q, "a", "a1")
	admit(t, q, "a", "a2")
	if _, _, why := q.Admit("a", "a3"); why != RefusedKey {
		t.Fatalf("third from a: %q; want %q", why, RefusedKey)
	}
	admit(t, q, "b", "b1")
	if q.Len() != 3 || q.Count("a") != 2 {
		t.Fatalf("len %d, a %d", q.Len(), q.Count("a"))
	}
}

// The reviewer's lock-out: a few prefixes fill the total. A newcomer from
// another prefix takes the place of the oldest connection of the prefix
// holding the most; a newcomer from that prefix is refused.
func TestFullQuotaEvictsFromTheLargestHolder(t *testing.T) {
	q := New[string](6, 10)
	for i := range 4 {
		admit(t, q, "big", fmt.Sprint("big", i))
	}
	admit(t, q, "mid", "mid0")
	admit(t, q, "mid", "mid1")

	if _, _, why := q.Admit("big", "big4"); why != RefusedTotal {
		t.Fatalf("newcomer from the largest holder: %q; want %q", why, RefusedTotal)
	}
	node, victim := admit(t, q, "node", "node0")
	if victim == nil || victim.Value != "big0" || !victim.Gone() {
		t.Fatalf("victim %+v; want big0, the oldest of the largest holder", victim)
	}
	if q.Len() != 6 || q.Count("big") != 3 || q.Count("node") != 1 {
		t.Fatalf("len %d, big %d, node %d", q.Len(), q.Count("big"), q.Count("node"))
	}
	// mid (2) is below big (3): it may take big's next oldest.
	if _, victim := admit(t, q, "mid", "mid2"); victim.Value != "big1" {
		t.Fatalf("victim %q; want big1", victim.Value)
	}
	// Now mid holds the most (3, big 2, node 1): mid is refused, while the
	// node's prefix still gets in at mid's expense.
	if _, _, why := q.Admit("mid", "mid3"); why != RefusedTotal {
		t.Fatalf("newcomer from the largest holder: %q", why)
	}
	if _, victim = admit(t, q, "node", "node1"); victim.Value != "mid0" {
		t.Fatalf("victim %q; want mid0", victim.Value)
	}
	// big and mid are tied at 2: the one whose oldest connection is older
	// (big2, admitted before mid1) makes room.
	if _, victim = admit(t, q, "other", "other0"); victim.Value != "big2" {
		t.Fatalf("victim %q; want big2", victim.Value)
	}
	// The evicted member's owner removes it later: nothing changes.
	q.Remove(victim)
	if q.Len() != 6 || q.Count("big") != 1 {
		t.Fatalf("removing a victim changed the counts: len %d, big %d", q.Len(), q.Count("big"))
	}
	q.Remove(node)
	q.Remove(node)
	if q.Len() != 5 || q.Count("node") != 1 {
		t.Fatalf("after removing node0 twice: len %d, node %d", q.Len(), q.Count("node"))
	}
}

// When every prefix holds one connection, the oldest one makes room: a
// newcomer's connection is the last to go.
func TestTiesEvictTheOldest(t *testing.T) {
	q := New[string](3, 10)
	admit(t, q, "a", "a")
	admit(t, q, "b", "b")
	admit(t, q, "c", "c")
	for i, want := range []string{"a", "b", "c", "new0"} {
		key := fmt.Sprint("new", i)
		if _, victim := admit(t, q, key, key); victim.Value != want {
			t.Fatalf("newcomer %d evicted %q; want %q", i, victim.Value, want)
		}
	}
}

// Connections that are not evictable (a node-link connection with its
// register frame in hand, an HTTP request in progress) are never closed to
// make room, and do not count towards a prefix's rank.
func TestBusyConnectionsAreNotEvicted(t *testing.T) {
	q := New[string](3, 10)
	busy1, _ := admit(t, q, "busy", "busy1")
	busy2, _ := admit(t, q, "busy", "busy2")
	q.SetEvictable(busy1, false)
	q.SetEvictable(busy2, false)
	admit(t, q, "idle", "idle1")
	// busy holds more connections, but none it may lose: idle1 goes.
	if _, victim := admit(t, q, "new", "new1"); victim.Value != "idle1" {
		t.Fatalf("victim %q; want idle1", victim.Value)
	}
	// Nothing evictable is left but new1, whose prefix is the newcomer's.
	if _, _, why := q.Admit("new", "new2"); why != RefusedTotal {
		t.Fatalf("%q", why)
	}
	q.SetEvictable(busy1, false)
	q.SetEvictable(busy2, true) // idle again: back in line, behind new1
	if _, victim := admit(t, q, "other", "o1"); victim.Value != "new1" {
		t.Fatalf("victim %q; want new1 (one evictable each, new1 older)", victim.Value)
	}
	if _, victim := admit(t, q, "other2", "o2"); victim.Value != "busy2" {
		t.Fatalf("victim %q; want busy2", victim.Value)
	}
	// Everything left is busy1 (busy) plus two evictable newcomers of
	// their own prefixes; a victim cannot be made evictable again.
	if q.SetEvictable(busy2, true) {
		t.Fatal("an evicted member was made evictable again")
	}
	q.SetEvictable(busy1, false)
	if q.Len() != 3 || q.Count("busy") != 1 {
		t.Fatalf("len %d, busy %d", q.Len(), q.Count("busy"))
	}
}

func TestNothingEvictable(t *testing.T) {
	q := New[string](2, 10)
	a, _ := admit(t, q, "a", "a")
	b, _ := admit(t, q, "b", "b")
	q.SetEvictable(a, false)
	q.SetEvictable(b, false)
	if _, _, why := q.Admit("c", "c"); why != RefusedTotal {
		t.Fatalf("%q", why)
	}
	q.Remove(a)
	admit(t, q, "c", "c")
}

// Groups leave the table with their last connection, so the table is
// bounded by the total whatever the number of prefixes seen.
func TestGroupsAreForgotten(t *testing.T) {
	q := New[string](4, 4)
	for i := range 1000 {
		m, _ := admit(t, q, fmt.Sprint(i), "x")
		if i%2 == 0 {
			q.Remove(m)
		}
	}
	if len(q.groups) != 4 || len(q.ranked) != 4 || q.Len() != 4 {
		t.Fatalf("groups %d, ranked %d, len %d", len(q.groups), len(q.ranked), q.Len())
	}
}
