package eventbus_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/adapters/eventbus"
	"iop/domain"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runEvent builds a run event whose Seq identifies it.
func runEvent(seq int) domain.BusEvent {
	return domain.BusEvent{Type: domain.BusRunEvent, Run: &domain.RunEvent{RunID: "r", Seq: uint64(seq)}}
}

// within fails the test if f has not returned after d: it detects a blocked
// call without asserting anything about speed.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("%s did not return within %s: it blocked", what, d)
	}
}

// drain reads s until C is closed.
func drain(s *eventbus.Subscription) []domain.BusEvent {
	var out []domain.BusEvent
	for ev := range s.C() {
		out = append(out, ev)
	}
	return out
}

func assertSeqs(t *testing.T, who string, got []domain.BusEvent, want []int) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s received %d events, want %d", who, len(got), len(want))
	}
	for i, ev := range got {
		if ev.Run == nil || ev.Run.Seq != uint64(want[i]) {
			t.Fatalf("%s event %d = %+v, want seq %d", who, i, ev, want[i])
		}
	}
}

func seqs(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func TestFanoutInOrder(t *testing.T) {
	b := eventbus.New()
	subs := []*eventbus.Subscription{b.Subscribe(100, nil), b.Subscribe(100, nil), b.Subscribe(100, nil)}
	for i := 1; i <= 100; i++ {
		b.Publish(runEvent(i))
	}
	for _, s := range subs {
		s.Close()
	}
	for _, s := range subs {
		assertSeqs(t, "subscriber", drain(s), seqs(1, 100))
		if s.Dropped() != 0 {
			t.Errorf("Dropped() = %d, want 0", s.Dropped())
		}
	}
	if b.Dropped() != 0 {
		t.Errorf("bus Dropped() = %d, want 0", b.Dropped())
	}
}

func TestFilter(t *testing.T) {
	b := eventbus.New()
	runs := b.Subscribe(10, func(ev domain.BusEvent) bool { return ev.Type == domain.BusRunEvent })
	lifecycle := b.Subscribe(10, func(ev domain.BusEvent) bool { return ev.Type != domain.BusRunEvent })
	all := b.Subscribe(10, nil)

	b.Publish(domain.BusEvent{Type: domain.BusNodeRegistered, Node: "a"})
	b.Publish(runEvent(1))
	b.Publish(domain.BusEvent{Type: domain.BusNodeDisconnected, Node: "a", Reason: "eof"})
	b.Publish(runEvent(2))
	b.Close()

	assertSeqs(t, "runs", drain(runs), []int{1, 2})
	got := drain(lifecycle)
	if len(got) != 2 || got[0].Type != domain.BusNodeRegistered || got[1].Type != domain.BusNodeDisconnected || got[1].Reason != "eof" {
		t.Errorf("lifecycle received %+v", got)
	}
	if n := len(drain(all)); n != 4 {
		t.Errorf("unfiltered subscriber received %d events, want 4", n)
	}
	// Events a filter rejects are not drops.
	if runs.Dropped() != 0 || lifecycle.Dropped() != 0 || b.Dropped() != 0 {
		t.Errorf("dropped: runs %d, lifecycle %d, bus %d", runs.Dropped(), lifecycle.Dropped(), b.Dropped())
	}
}

func TestStalledSubscriberDoesNotBlockOthers(t *testing.T) {
	const (
		total       = 10000
		stalledSize = 16
	)
	b := eventbus.New()
	stalled := b.Subscribe(stalledSize, nil) // never read until the end
	reader := b.Subscribe(total, nil)

	var got []domain.BusEvent
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		got = drain(reader)
	}()

	within(t, 10*time.Second, "publishing 10k events with a stalled subscriber", func() {
		for i := 1; i <= total; i++ {
			b.Publish(runEvent(i))
		}
	})
	reader.Close()
	<-readDone

	assertSeqs(t, "reader", got, seqs(1, total))
	if reader.Dropped() != 0 {
		t.Errorf("reader Dropped() = %d, want 0", reader.Dropped())
	}
	if want := uint64(total - stalledSize); stalled.Dropped() != want || b.Dropped() != want {
		t.Errorf("stalled Dropped() = %d, bus Dropped() = %d, want both %d", stalled.Dropped(), b.Dropped(), want)
	}
	// The stalled subscriber kept the oldest events: the newest are the ones dropped.
	stalled.Close()
	assertSeqs(t, "stalled", drain(stalled), seqs(1, stalledSize))
}

func TestBufferSizes(t *testing.T) {
	b := eventbus.New()
	defer b.Close()
	for _, tt := range []struct{ ask, want int }{
		{0, eventbus.DefaultBuffer},
		{-5, eventbus.DefaultBuffer},
		{1, 1},
		{1000, 1000},
		{eventbus.MaxBuffer, eventbus.MaxBuffer},
		{1 << 30, eventbus.MaxBuffer},
	} {
		if got := cap(b.Subscribe(tt.ask, nil).C()); got != tt.want {
			t.Errorf("Subscribe(%d) buffer = %d, want %d", tt.ask, got, tt.want)
		}
	}
}

func TestTimeStamp(t *testing.T) {
	fixed := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	b := eventbus.New(eventbus.WithClock(func() time.Time { return fixed }))
	s := b.Subscribe(2, nil)
	own := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	b.Publish(domain.BusEvent{Type: domain.BusConfigReloaded})
	b.Publish(domain.BusEvent{Type: domain.BusConfigReloaded, Time: own})
	b.Close()
	got := drain(s)
	if len(got) != 2 || !got[0].Time.Equal(fixed) || !got[1].Time.Equal(own) {
		t.Errorf("times = %v, want [%v %v]", got, fixed, own)
	}

	b2 := eventbus.New() // the real clock
	s3 := b2.Subscribe(1, nil)
	b2.Publish(domain.BusEvent{Type: domain.BusConfigReloaded})
	if ev := <-s3.C(); ev.Time.IsZero() {
		t.Error("Publish left Time zero")
	}
	b2.Close()
}

func TestCloseIsIdempotentAndEndsRange(t *testing.T) {
	b := eventbus.New()
	s := b.Subscribe(4, nil)
	b.Publish(runEvent(1))
	ended := make(chan []domain.BusEvent)
	go func() { ended <- drain(s) }()
	s.Close()
	s.Close()
	select {
	case got := <-ended:
		assertSeqs(t, "reader", got, []int{1})
	case <-time.After(5 * time.Second):
		t.Fatal("a reader ranging over C did not end after Close")
	}
	// Publishing after a subscriber left neither panics nor counts drops.
	b.Publish(runEvent(2))
	if b.Dropped() != 0 {
		t.Errorf("bus Dropped() = %d after publishing to no one", b.Dropped())
	}
	b.Close()
	b.Close()
}

func TestBusClose(t *testing.T) {
	b := eventbus.New()
	s1, s2 := b.Subscribe(1, nil), b.Subscribe(1, nil)
	b.Close()
	for _, s := range []*eventbus.Subscription{s1, s2} {
		if _, ok := <-s.C(); ok {
			t.Error("subscription still open after Bus.Close")
		}
		s.Close() // still idempotent after the bus closed it
	}
	b.Publish(runEvent(1)) // a no-op, not a panic
	late := b.Subscribe(1, nil)
	if _, ok := <-late.C(); ok {
		t.Error("Subscribe on a closed bus returned an open subscription")
	}
	late.Close()
}

func TestCloseDuringConcurrentPublish(t *testing.T) {
	b := eventbus.New()
	stop := make(chan struct{})
	var publishers, subscribers sync.WaitGroup
	for p := range 4 {
		publishers.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				b.Publish(domain.BusEvent{Type: domain.BusRunEvent, Run: &domain.RunEvent{RunID: string(rune('a' + p)), Seq: uint64(i)}})
			}
		})
	}
	for range 8 {
		subscribers.Go(func() {
			for i := range 200 {
				s := b.Subscribe(1+i%8, nil)
				switch i % 3 {
				case 0: // close while a reader ranges
					done := make(chan struct{})
					go func() { drain(s); close(done) }()
					s.Close()
					<-done
				case 1: // two concurrent Closes
					var wg sync.WaitGroup
					wg.Go(s.Close)
					wg.Go(s.Close)
					wg.Wait()
					drain(s)
				default: // read a little, then close
					<-s.C()
					s.Close()
				}
			}
		})
	}
	within(t, 30*time.Second, "subscribe/close churn during publishing", subscribers.Wait)
	close(stop)
	publishers.Wait()

	// Per-publisher order holds for a subscriber that joins mid-stream.
	b2 := eventbus.New()
	s := b2.Subscribe(eventbus.MaxBuffer, nil)
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := 1; i <= 1000; i++ {
				b2.Publish(domain.BusEvent{Type: domain.BusRunEvent, Run: &domain.RunEvent{RunID: string(rune('a' + p)), Seq: uint64(i)}})
			}
		})
	}
	wg.Wait()
	b2.Close()
	last := map[string]uint64{}
	n := 0
	for ev := range s.C() {
		if ev.Run.Seq != last[ev.Run.RunID]+1 {
			t.Fatalf("publisher %s: seq %d after %d", ev.Run.RunID, ev.Run.Seq, last[ev.Run.RunID])
		}
		last[ev.Run.RunID] = ev.Run.Seq
		n++
	}
	if n != 4000 {
		t.Errorf("received %d events, want 4000", n)
	}
	b.Close()
}

// Every subscriber sees the same global order, even with concurrent publishers.
func TestSameOrderForEverySubscriber(t *testing.T) {
	b := eventbus.New()
	a, c := b.Subscribe(eventbus.MaxBuffer, nil), b.Subscribe(eventbus.MaxBuffer, nil)
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := 1; i <= 500; i++ {
				b.Publish(domain.BusEvent{Type: domain.BusRunEvent, Run: &domain.RunEvent{RunID: string(rune('a' + p)), Seq: uint64(i)}})
			}
		})
	}
	wg.Wait()
	b.Close()
	ga, gc := drain(a), drain(c)
	if len(ga) != 2000 || len(gc) != 2000 {
		t.Fatalf("received %d and %d events, want 2000 each", len(ga), len(gc))
	}
	for i := range ga {
		if ga[i].Run != gc[i].Run {
			t.Fatalf("event %d differs between subscribers", i)
		}
	}
}

// A SubscribeBytes subscription holds at most its bound of run output, however
// deep its buffer: a stalled subscriber kept 1,024 output chunks (32 MiB)
// alive before. What it takes and gives back (Taken) makes room again.
func TestSubscribeBytesBoundsBufferedOutput(t *testing.T) {
	b := eventbus.New()
	chunk := domain.BusEvent{Type: domain.BusRunEvent, Run: &domain.RunEvent{Type: domain.EventDelta, Text: strings.Repeat("x", 32<<10)}}
	w := eventbus.Weight(chunk)
	bounded := b.SubscribeBytes(1024, 4*w, nil)
	plain := b.Subscribe(1024, nil)
	for range 10 {
		b.Publish(chunk)
	}
	if got := len(bounded.C()); got != 4 {
		t.Fatalf("bounded subscription buffered %d chunks of %d bytes, want 4 (bound %d bytes)", got, w, 4*w)
	}
	if bounded.Dropped() != 6 || plain.Dropped() != 0 || len(plain.C()) != 10 {
		t.Fatalf("dropped: bounded %d (want 6), plain %d (want 0, buffered %d of 10)", bounded.Dropped(), plain.Dropped(), len(plain.C()))
	}
	// One Taken makes room for one chunk, not two.
	bounded.Taken(<-bounded.C())
	b.Publish(chunk)
	b.Publish(chunk)
	if got := len(bounded.C()); got != 4 || bounded.Dropped() != 7 {
		t.Fatalf("after one Taken: buffered %d (want 4), dropped %d (want 7)", got, bounded.Dropped())
	}
	for len(bounded.C()) > 0 {
		bounded.Taken(<-bounded.C())
	}
	for range 4 {
		b.Publish(chunk)
	}
	if got := len(bounded.C()); got != 4 || bounded.Dropped() != 7 {
		t.Fatalf("after draining: buffered %d (want 4), dropped %d (want 7)", got, bounded.Dropped())
	}
}
