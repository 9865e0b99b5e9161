// Package eventbus is the edge's in-process event bus: it fans each
// domain.BusEvent out to every subscriber whose filter accepts it.
//
// Overflow policy: every subscriber has its own bounded buffer. When an event
// does not fit in a subscriber's buffer, that event is dropped for that
// subscriber only and counted in its Subscription.Dropped and in the bus-wide
// Bus.Dropped. Publish therefore never blocks, and a slow or stalled
// subscriber never delays Publish or any other subscriber. Subscribers that
// must not miss events need a buffer sized for their worst burst; a gap can be
// detected by watching Dropped. A subscription made with SubscribeBytes is
// also bounded in bytes (see Weight): an event that would take its buffered
// total past the bound is dropped the same way, so a stalled subscriber holds
// at most that much run output alive, not its buffer's depth of events of
// up to 32 KiB (a run event's metadata; its text up to 16 KiB).
//
// Ordering: Publish calls are serialized, so every subscriber sees the events
// it receives in one global order, and events published by one goroutine
// arrive in the order they were published.
//
// Events are passed by value, but their Run and Tunnel pointers are shared by
// all subscribers: receivers must treat what they point to as read-only.
package eventbus

import (
	"sync"
	"sync/atomic"
	"time"

	"iop/domain"
	"iop/ports"
)

// Buffer sizes of a subscription, in events.
const (
	DefaultBuffer = 256
	MaxBuffer     = 65536
)

var _ ports.EventPublisher = (*Bus)(nil)

// Bus fans events out to subscribers. The zero value is not usable; call New.
type Bus struct {
	now func() time.Time

	// mu guards subs and closed, and is held for every send so that a
	// subscription's channel is never closed while Publish may send on it.
	mu     sync.Mutex
	subs   map[*Subscription]struct{}
	closed bool

	dropped atomic.Uint64
}

// Option configures a Bus.
type Option func(*Bus)

// WithClock sets the clock Publish uses to stamp events that have no Time.
func WithClock(now func() time.Time) Option {
	return func(b *Bus) { b.now = now }
}

// New returns an empty, open bus.
func New(opts ...Option) *Bus {
	b := &Bus{now: time.Now, subs: map[*Subscription]struct{}{}}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Publish delivers ev to every subscriber whose filter accepts it, stamping
// ev.Time with the bus clock if it is zero. It never blocks: a subscriber
// whose buffer is full loses this event (see the package doc). It is safe
// for concurrent use and is a no-op once the bus is closed.
func (b *Bus) Publish(ev domain.BusEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	// Stamped under the lock so that Time never goes backwards in delivery
	// order (given a monotonic clock).
	if ev.Time.IsZero() {
		ev.Time = b.now()
	}
	for s := range b.subs {
		if s.filter != nil && !s.filter(ev) {
			continue
		}
		var w int64
		if s.maxBytes > 0 {
			// Counted before the send, so that Taken never runs first.
			if w = Weight(ev); s.queued.Add(w) > s.maxBytes {
				s.queued.Add(-w)
				s.dropped.Add(1)
				b.dropped.Add(1)
				continue
			}
		}
		select {
		case s.ch <- ev:
		default:
			s.queued.Add(-w)
			s.dropped.Add(1)
			b.dropped.Add(1)
		}
	}
}

// eventOverhead is what Weight counts for an event besides its text: the
// event, its RunEvent and their strings, roughly.
const eventOverhead = 256

// Weight is what a buffered event counts against a SubscribeBytes bound:
// the bytes its payload holds alive (run output, metadata, error messages,
// a rejection's or disconnection's reason) plus a fixed overhead, so a
// flood of empty events is bounded too.
func Weight(ev domain.BusEvent) int64 {
	n := eventOverhead + len(ev.Reason)
	if r := ev.Run; r != nil {
		n += len(r.Text) + len(r.Metadata)
		if r.Error != nil {
			n += len(r.Error.Message)
		}
	}
	if t := ev.Tunnel; t != nil {
		n += len(t.Error)
	}
	return int64(n)
}

// Subscribe registers a subscriber with its own buffer of the given size
// (DefaultBuffer if buffer <= 0, at most MaxBuffer) that receives the events
// for which filter returns true, or every event if filter is nil. filter runs
// inside Publish with the bus locked: it must be fast, must not block, and
// must not call the Bus or a Subscription. On a closed bus the subscription
// is returned already closed.
func (b *Bus) Subscribe(buffer int, filter func(domain.BusEvent) bool) *Subscription {
	return b.SubscribeBytes(buffer, 0, filter)
}

// SubscribeBytes is Subscribe with a bound of maxBytes (none if <= 0) on the
// Weight of the events buffered at once. The subscriber must pass every
// event it takes from C to Taken, which gives its weight back to the bound.
func (b *Bus) SubscribeBytes(buffer int, maxBytes int64, filter func(domain.BusEvent) bool) *Subscription {
	switch {
	case buffer <= 0:
		buffer = DefaultBuffer
	case buffer > MaxBuffer:
		buffer = MaxBuffer
	}
	s := &Subscription{bus: b, ch: make(chan domain.BusEvent, buffer), filter: filter, maxBytes: maxBytes}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		s.closed = true
		close(s.ch)
		return s
	}
	b.subs[s] = struct{}{}
	return s
}

// Dropped returns how many events were dropped across all subscribers, ever.
func (b *Bus) Dropped() uint64 { return b.dropped.Load() }

// Close closes every subscription, so ranging readers end, and turns later
// Publish calls into no-ops. It is idempotent.
func (b *Bus) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	for s := range b.subs {
		s.closeLocked()
	}
}

// Subscription is one subscriber's view of the bus.
type Subscription struct {
	bus     *Bus
	ch      chan domain.BusEvent
	filter  func(domain.BusEvent) bool
	dropped atomic.Uint64
	closed  bool // guarded by bus.mu

	maxBytes int64        // SubscribeBytes's bound; 0: none
	queued   atomic.Int64 // Weight of the events in ch (added by Publish, taken back by Taken)
}

// C returns the channel the subscriber reads. It is closed after Close (of
// the subscription or the bus), once the events already buffered have been
// read.
func (s *Subscription) C() <-chan domain.BusEvent { return s.ch }

// Taken gives back to a SubscribeBytes bound the weight of ev, an event the
// subscriber has received from C. It is a no-op on a Subscribe subscription.
func (s *Subscription) Taken(ev domain.BusEvent) {
	if s.maxBytes > 0 {
		s.queued.Add(-Weight(ev))
	}
}

// Dropped returns how many events this subscriber lost to a full buffer.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Close unsubscribes and then closes C. It is idempotent and safe to call
// concurrently with Publish.
func (s *Subscription) Close() {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	s.closeLocked()
}

func (s *Subscription) closeLocked() {
	if s.closed {
		return
	}
	s.closed = true
	delete(s.bus.subs, s)
	close(s.ch)
}
