package transport

import (
	"net"
	"sync"
	"time"
)

// admission decides, before any work is spent on it, whether the edge serves
// a connection that has not registered yet. It bounds the unregistered
// connections (in total and per remote address), so that idle or hostile
// sockets can neither exhaust the edge's file descriptors nor hold the
// handshake slots real nodes need, and it throttles remote addresses that
// keep presenting wrong tokens (a token bucket per address: each failed
// registration takes a token, the bucket refills at a steady rate, and an
// address with an empty bucket is closed at once without an answer).
type admission struct {
	maxPending, maxPerAddr int
	rate                   float64 // failure tokens regained per second
	burst                  float64
	now                    func() time.Time

	mu      sync.Mutex
	pending int
	perAddr map[string]int
	fails   map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// maxFailBuckets bounds the failure table: past it, addresses whose bucket
// has refilled are forgotten, and if none has, the new address shares the
// overflow bucket (so a flood from many addresses is still throttled).
const maxFailBuckets = 16 << 10

const overflowAddr = "*"

func newAdmission(cfg Config) *admission {
	return &admission{
		maxPending: cfg.MaxPending, maxPerAddr: cfg.MaxPendingPerAddr,
		rate: cfg.RegisterFailRate, burst: float64(cfg.RegisterFailBurst),
		now: time.Now, perAddr: map[string]int{}, fails: map[string]*bucket{},
	}
}

// hostOf returns the address part of "host:port" (the whole string if it has no port).
func hostOf(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// enter admits an unregistered connection from addr, or says why not. An
// admitted connection must be released with leave.
func (a *admission) enter(addr string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b := a.bucketLocked(addr, false); b != nil && b.tokens < 1 {
		return "throttled: too many failed registrations from this address"
	}
	if a.pending >= a.maxPending {
		return "refused: too many unregistered connections"
	}
	if a.perAddr[addr] >= a.maxPerAddr {
		return "refused: too many unregistered connections from this address"
	}
	a.pending++
	a.perAddr[addr]++
	return ""
}

// leave releases what enter admitted.
func (a *admission) leave(addr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending--
	if n := a.perAddr[addr] - 1; n > 0 {
		a.perAddr[addr] = n
	} else {
		delete(a.perAddr, addr)
	}
}

// failed charges one failed registration to addr; it reports false when the
// address had no token left, in which case the edge does not answer.
func (a *admission) failed(addr string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.bucketLocked(addr, true)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// bucketLocked returns addr's bucket refilled to now; nil when it has none
// and create is false (a missing bucket is a full one).
func (a *admission) bucketLocked(addr string, create bool) *bucket {
	now := a.now()
	b := a.fails[addr]
	if b == nil {
		if !create {
			return nil
		}
		if len(a.fails) >= maxFailBuckets {
			a.pruneLocked(now)
		}
		if len(a.fails) >= maxFailBuckets {
			addr = overflowAddr
			if b = a.fails[addr]; b != nil {
				a.refill(b, now)
				return b
			}
		}
		b = &bucket{tokens: a.burst, at: now}
		a.fails[addr] = b
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

// pruneLocked forgets addresses whose bucket is full again.
func (a *admission) pruneLocked(now time.Time) {
	for k, b := range a.fails {
		if a.refill(b, now); b.tokens >= a.burst {
			delete(a.fails, k)
		}
	}
}
