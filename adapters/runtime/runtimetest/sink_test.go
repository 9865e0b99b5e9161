package runtimetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/adapters/runtime/runtimetest"
	"iop/domain"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestSinkRecords(t *testing.T) {
	s := &runtimetest.Sink{}
	for _, ev := range []domain.RunEvent{
		{Type: domain.EventMetadata, Metadata: []byte(`{"pid":1}`)},
		{Type: domain.EventDelta, Text: "a"},
		{Type: domain.EventDelta, Text: "b"},
		{Type: domain.EventComplete},
	} {
		if err := s.Emit(ev); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Text(); got != "ab" {
		t.Errorf("Text = %q", got)
	}
	if got := len(s.Events()); got != 4 {
		t.Errorf("%d events", got)
	}
	if ev, ok := s.Terminal(); !ok || ev.Type != domain.EventComplete {
		t.Errorf("Terminal = %v, %v", ev, ok)
	}
}

func TestSinkFailsAfter(t *testing.T) {
	errGone := errors.New("gone")
	s := &runtimetest.Sink{Err: errGone, FailAfter: 1}
	if err := s.Emit(domain.RunEvent{Type: domain.EventDelta, Text: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Emit(domain.RunEvent{Type: domain.EventDelta, Text: "b"}); !errors.Is(err, errGone) {
		t.Fatalf("err = %v", err)
	}
	if got := s.Text(); got != "a" {
		t.Errorf("Text = %q", got)
	}
}

func TestSinkBlockAndWaitFor(t *testing.T) {
	block := make(chan struct{})
	s := &runtimetest.Sink{Block: block}
	emitted := make(chan error, 1)
	go func() { emitted <- s.Emit(domain.RunEvent{Type: domain.EventDelta, Text: "x"}) }()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.WaitFor(ctx, func(evs []domain.RunEvent) bool { return len(evs) > 0 }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitFor while blocked = %v, want deadline exceeded", err)
	}
	close(block)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, func(evs []domain.RunEvent) bool { return len(evs) > 0 }); err != nil {
		t.Fatal(err)
	}
	if err := <-emitted; err != nil {
		t.Fatal(err)
	}
}
