// Package connquota bounds the connections a listener holds, per network
// prefix and in total, and decides who makes room when the total is
// reached. The edge's node-link listener counts its unregistered
// connections with it, the HTTP listener all of its connections.
//
// A plain total cap is a lock-out: whoever fills it first (one client with a
// few source addresses, or any IPv6 host, which owns a whole /64) keeps
// everyone else out for as long as it cares to. Here a full quota makes room
// for a newcomer by closing the oldest evictable connection of the prefix
// holding the most evictable ones, unless the newcomer's own prefix already
// holds as many: then the newcomer is the one refused. A flood therefore
// displaces only itself, and a client holding one or two connections is the
// last to lose them. What is evictable is the caller's call (an
// unregistered node-link connection still waiting for its register frame,
// an idle HTTP keep-alive connection): connections doing work are never
// closed to make room.
package connquota

import (
	"container/heap"
	"container/list"
	"net"
	"net/netip"
)

// Key names the network remote ("host:port", or a bare host) belongs to:
// an IPv4 address (IPv4-mapped IPv6 included) as itself, an IPv6 address
// as its /64 ("2001:db8:1:2::/64"). An IPv6 host is routinely given a whole
// /64 (SLAAC, privacy addresses) and can pick any address in it, so counting
// per /128 would give it 2^64 separate quotas. A distinct IPv4 address
// costs an attacker real money, and many honest clients behind one NAT
// already share one, so IPv4 stays per address. Anything that does not
// parse (a Unix socket, a test's pipe) is its own key.
func Key(remote string) string {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return remote
	}
	ip = ip.WithZone("").Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, err := ip.Prefix(64)
	if err != nil {
		return remote
	}
	return p.String()
}

// Refusal says why Admit turned a connection away; "" admits.
type Refusal string

const (
	// RefusedKey: the newcomer's prefix already holds PerKey connections.
	RefusedKey Refusal = "too many connections from this address"
	// RefusedTotal: the quota is full and no room could be made (the
	// newcomer's prefix holds the most evictable connections itself, or no
	// connection is evictable).
	RefusedTotal Refusal = "too many connections"
)

// Quota counts connections per key and in total. It is not safe for
// concurrent use: its owner serializes calls (and closes victims outside
// its lock).
type Quota[T any] struct {
	total, perKey int
	n             int
	seq           uint64
	groups        map[string]*group[T]
	// ranked holds every group with an evictable member, most evictable
	// first, then the one whose oldest evictable member is oldest: its top
	// is the next victim, found in O(1) and kept in O(log groups), so a
	// flood from many prefixes costs the accept loop no scan.
	ranked groupHeap[T]
}

// Member is one admitted connection.
type Member[T any] struct {
	Value T
	g     *group[T]
	elem  *list.Element // in g.evictable while evictable
	seq   uint64        // when it last became evictable
	gone  bool
}

type group[T any] struct {
	key       string
	n         int        // members, evictable or not
	evictable *list.List // of *Member[T], oldest first
	idx       int        // in ranked, -1 when out
}

// New returns a quota of total connections, at most perKey per key.
func New[T any](total, perKey int) *Quota[T] {
	return &Quota[T]{total: max(total, 1), perKey: max(perKey, 1), groups: map[string]*group[T]{}}
}

// Admit counts a new connection from key, evictable until SetEvictable says
// otherwise. When the total is reached it removes a victim to make room:
// its owner must close victim.Value's connection, whose later Remove does
// nothing. On refusal m is nil and nothing changed.
func (q *Quota[T]) Admit(key string, v T) (m, victim *Member[T], why Refusal) {
	g := q.groups[key]
	if g != nil && g.n >= q.perKey {
		return nil, nil, RefusedKey
	}
	if q.n >= q.total {
		if len(q.ranked) == 0 {
			return nil, nil, RefusedTotal
		}
		top := q.ranked[0]
		// The newcomer's prefix holds as many evictable connections as
		// any: taking one from another prefix would only shift the
		// lock-out onto it, so the newcomer is refused instead.
		if g == top || g != nil && g.evictable.Len() >= top.evictable.Len() {
			return nil, nil, RefusedTotal
		}
		victim = top.evictable.Front().Value.(*Member[T])
		q.drop(victim)
		victim.gone = true
	}
	if g == nil {
		g = &group[T]{key: key, evictable: list.New(), idx: -1}
		q.groups[key] = g
	}
	m = &Member[T]{Value: v, g: g}
	q.n++
	g.n++
	q.setEvictable(m, true)
	return m, victim, ""
}

// SetEvictable marks m as one that may (or may no longer) be closed to make
// room. A member that becomes evictable goes to the back of its prefix's
// line: the longest-evictable is closed first. It reports false when m was
// already removed or evicted.
func (q *Quota[T]) SetEvictable(m *Member[T], on bool) bool {
	if m.gone {
		return false
	}
	q.setEvictable(m, on)
	return true
}

func (q *Quota[T]) setEvictable(m *Member[T], on bool) {
	g := m.g
	switch {
	case on && m.elem == nil:
		q.seq++
		m.seq = q.seq
		m.elem = g.evictable.PushBack(m)
	case !on && m.elem != nil:
		g.evictable.Remove(m.elem)
		m.elem = nil
	default:
		return
	}
	q.rerank(g)
}

// Remove uncounts m (its connection ended). Removing twice, or removing a
// victim Admit already took out, does nothing.
func (q *Quota[T]) Remove(m *Member[T]) {
	if m.gone {
		return
	}
	q.drop(m)
	m.gone = true
}

// Gone reports whether m was removed or evicted.
func (m *Member[T]) Gone() bool { return m.gone }

func (q *Quota[T]) drop(m *Member[T]) {
	g := m.g
	q.setEvictable(m, false)
	q.n--
	if g.n--; g.n == 0 {
		delete(q.groups, g.key)
	}
}

// rerank puts g where its evictable count now ranks it.
func (q *Quota[T]) rerank(g *group[T]) {
	switch in := g.idx >= 0; {
	case g.evictable.Len() == 0 && in:
		heap.Remove(&q.ranked, g.idx)
	case g.evictable.Len() > 0 && in:
		heap.Fix(&q.ranked, g.idx)
	case g.evictable.Len() > 0:
		heap.Push(&q.ranked, g)
	}
}

// Len is the number of connections counted.
func (q *Quota[T]) Len() int { return q.n }

// Count is the number of connections counted for key.
func (q *Quota[T]) Count(key string) int {
	if g := q.groups[key]; g != nil {
		return g.n
	}
	return 0
}

// Evictable is the number of connections of key that may be closed to make room.
func (q *Quota[T]) Evictable(key string) int {
	if g := q.groups[key]; g != nil {
		return g.evictable.Len()
	}
	return 0
}

type groupHeap[T any] []*group[T]

func (h groupHeap[T]) Len() int { return len(h) }
func (h groupHeap[T]) Less(i, j int) bool {
	a, b := h[i].evictable, h[j].evictable
	if a.Len() != b.Len() {
		return a.Len() > b.Len()
	}
	return a.Front().Value.(*Member[T]).seq < b.Front().Value.(*Member[T]).seq
}
func (h groupHeap[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *groupHeap[T]) Push(x any) {
	g := x.(*group[T])
	g.idx = len(*h)
	*h = append(*h, g)
}
func (h *groupHeap[T]) Pop() any {
	old := *h
	g := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	g.idx = -1
	return g
}
