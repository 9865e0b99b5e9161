// Package runtimetest holds helpers for testing runtime adapters: a
// recording ports.EventSink that can also simulate a slow or closed stream,
// and a check that a process group has died.
package runtimetest

import (
	"context"
	"strings"
	"sync"

	"iop/domain"
	"iop/ports"
)

// Sink is a ports.EventSink that records every event it accepts. The zero
// value is ready to use; set the exported fields before the first Emit.
type Sink struct {
	// Block, when non-nil, makes Emit wait until it is closed before doing
	// anything else, to simulate a receiver applying back-pressure.
	Block chan struct{}
	// Err, when non-nil, is returned by Emit once FailAfter events have been
	// accepted, to simulate a stream that is gone. Failed events are not
	// recorded.
	Err error
	// FailAfter is how many events Emit accepts before it starts returning Err.
	FailAfter int
	// FinishErr, when non-nil, is what Finish returns: the run manager's
	// answer when the run is being cancelled (see ports.Finisher).
	FinishErr error

	mu      sync.Mutex
	events  []domain.RunEvent
	changed chan struct{} // closed and replaced on every accepted event
}

var (
	_ ports.EventSink = (*Sink)(nil)
	_ ports.Finisher  = (*Sink)(nil)
)

// Finish returns FinishErr.
func (s *Sink) Finish() error { return s.FinishErr }

// Emit records ev, or returns Err as configured.
func (s *Sink) Emit(ev domain.RunEvent) error {
	if s.Block != nil {
		<-s.Block
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Err != nil && len(s.events) >= s.FailAfter {
		return s.Err
	}
	ev.Metadata = append([]byte(nil), ev.Metadata...)
	s.events = append(s.events, ev)
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	return nil
}

// Events returns a copy of the events accepted so far, in order.
func (s *Sink) Events() []domain.RunEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]domain.RunEvent(nil), s.events...)
}

// Types returns the types of the events accepted so far, in order.
func (s *Sink) Types() []domain.EventType {
	s.mu.Lock()
	defer s.mu.Unlock()
	types := make([]domain.EventType, len(s.events))
	for i, ev := range s.events {
		types[i] = ev.Type
	}
	return types
}

// Text concatenates the text of the delta events accepted so far.
func (s *Sink) Text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, ev := range s.events {
		if ev.Type == domain.EventDelta {
			b.WriteString(ev.Text)
		}
	}
	return b.String()
}

// Terminal returns the first terminal event accepted, if any.
func (s *Sink) Terminal() (domain.RunEvent, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range s.events {
		if ev.Type.Terminal() {
			return ev, true
		}
	}
	return domain.RunEvent{}, false
}

// WaitFor blocks until cond holds for the events accepted so far, or ctx is
// done. cond gets a snapshot it may keep.
func (s *Sink) WaitFor(ctx context.Context, cond func([]domain.RunEvent) bool) error {
	for {
		s.mu.Lock()
		snapshot := append([]domain.RunEvent(nil), s.events...)
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		changed := s.changed
		s.mu.Unlock()
		if cond(snapshot) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
