package transport

import (
	"net"
	"sync"
	"time"

	"iop/adapters/internal/connquota"
)

// admission decides, before any work is spent on it, whether the edge serves
// a connection that has not registered yet. It bounds the unregistered
// connections (in total and per network prefix: connquota.Key, an IPv4
// address or an IPv6 /64), so that idle or hostile sockets can neither
// exhaust the edge's file descriptors nor hold the handshake slots real
// nodes need, and it throttles prefixes that keep presenting wrong tokens
// (a token bucket per prefix: each failed registration takes a token, the
// bucket refills at a steady rate, and a prefix with an empty bucket is
// closed at once without an answer).
//
// When the total is reached, a newcomer takes the place of the oldest
// connection of the prefix holding the most that are still waiting for
// their register frame, unless its own prefix holds as many (connquota):
// idle sockets from a handful of addresses, or from one IPv6 host, can no
// longer lock every node out. A connection whose whole register frame has
// arrived is no longer closed to make room: its peer has sent everything
// it can before authentication, and from there it either registers or is
// charged a failed registration within the handshake timeout, so such
// connections cannot pile up for free. One mid-TLS-handshake or mid-frame
// is not protected: a peer can stall there at no cost.
type admission struct {
	rate  float64 // failure tokens regained per second
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	pending *connquota.Quota[net.Conn]
	fails   map[string]*bucket
}

// ticket is an admitted connection's place in the quota.
type ticket = connquota.Member[net.Conn]

type bucket struct {
	tokens float64
	at     time.Time
}

// maxFailBuckets bounds the failure table: past it, prefixes whose bucket
// has refilled are forgotten, and if none has, the new prefix shares the
// overflow bucket (so a flood from many prefixes is still throttled).
const maxFailBuckets = 16 << 10

const overflowAddr = "*"

func newAdmission(cfg Config) *admission {
	return &admission{
		rate: cfg.RegisterFailRate, burst: float64(cfg.RegisterFailBurst), now: time.Now,
		pending: connquota.New[net.Conn](cfg.MaxPending, cfg.MaxPendingPerAddr), fails: map[string]*bucket{},
	}
}

// enter admits nc, an unregistered connection from the prefix key, or says
// why not. An admitted connection must be released with leave. victim, if
// not nil, is a connection taken out to make room: the caller closes it.
func (a *admission) enter(key string, nc net.Conn) (t *ticket, victim net.Conn, why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b := a.bucketLocked(key, false); b != nil && b.tokens < 1 {
		return nil, nil, "throttled: too many failed registrations from this address"
	}
	t, v, refused := a.pending.Admit(key, nc)
	switch refused {
	case "":
	case connquota.RefusedKey:
		return nil, nil, "refused: too many unregistered connections from this address"
	default:
		return nil, nil, "refused: too many unregistered connections"
	}
	if v != nil {
		victim = v.Value
	}
	return t, victim, ""
}

// authenticating says t's register frame has arrived: it is no longer
// closed to make room. It reports false when t was closed to make room
// already, in which case the handshake ends.
func (a *admission) authenticating(t *ticket) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pending.SetEvictable(t, false)
}

// evicted reports whether t was closed to make room for another
// connection: its handshake then ends quietly, without charging its prefix
// a failure (the edge closed it, not the peer).
func (a *admission) evicted(t *ticket) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return t.Gone()
}

// leave releases what enter admitted (nothing if t was evicted).
func (a *admission) leave(t *ticket) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending.Remove(t)
}

// counts reports the unregistered connections in total and from key.
func (a *admission) counts(key string) (total, fromKey int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pending.Len(), a.pending.Count(key)
}

// failed charges one failed registration to the prefix key; it reports
// false when the prefix had no token left, in which case the edge does not answer.
func (a *admission) failed(key string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.bucketLocked(key, true)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// bucketLocked returns key's bucket refilled to now; nil when it has none
// and create is false (a missing bucket is a full one).
func (a *admission) bucketLocked(key string, create bool) *bucket {
	now := a.now()
	b := a.fails[key]
	if b == nil {
		if !create {
			return nil
		}
		if len(a.fails) >= maxFailBuckets {
			a.pruneLocked(now)
		}
		if len(a.fails) >= maxFailBuckets {
			key = overflowAddr
			if b = a.fails[key]; b != nil {
				a.refill(b, now)
				return b
			}
		}
		b = &bucket{tokens: a.burst, at: now}
		a.fails[key] = b
		return b
	}
	a.refill(b, now)
	return b
}

func (a *admission) refill(b *bucket, now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(a.burst, b.tokens+d.Seconds()*a.rate)
		b.at = now
	}
}

// pruneLocked forgets prefixes whose bucket is full again.
func (a *admission) pruneLocked(now time.Time) {
	for k, b := range a.fails {
		if a.refill(b, now); b.tokens >= a.burst {
			delete(a.fails, k)
		}
	}
}
