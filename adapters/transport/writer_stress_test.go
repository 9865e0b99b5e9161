package transport

import (
	"context"
	"testing"
	"time"

	ioppb "iop/proto/iop"
)

// TestWriterStartEndRacesLoseNoFrame has writers end as often as possible
// (a linger of a nanosecond, and at once after a batch of heartbeats) while
// control and data senders keep offering frames from many goroutines, so a
// sender's offer races a writer's end over and over. Every frame must reach
// the peer: a frame announced while a writer ended, left in a queue with no
// writer to take it (a lost wake-up), would stall the count below.
func TestWriterStartEndRacesLoseNoFrame(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), 20*time.Second)
	defer cancel()
	a, b := pipeConns(t)
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = time.Minute, 2*time.Minute // only the frames sent here
	cfg.writerLinger = time.Nanosecond
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideNode, 1<<30, nopHandler{})
	c.start()
	defer c.Close(nil)

	const ctrlSenders, dataSenders, frames = 4, 4, 300
	errs := make(chan error, ctrlSenders+dataSenders)
	for i := range ctrlSenders {
		go func() {
			for j := range frames {
				f := &ioppb.Frame{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{SentUnixNano: 1}}}
				if i%2 == 1 && j%3 == 0 {
					f = &ioppb.Frame{Body: &ioppb.Frame_WindowUpdate{WindowUpdate: &ioppb.WindowUpdate{Increment: 1}}}
				}
				if err := c.sendControl(ctx, f); err != nil {
					errs <- err
					return
				}
				if j%7 == 0 {
					time.Sleep(time.Duration(j%5) * time.Microsecond)
				}
			}
			errs <- nil
		}()
	}
	for i := range dataSenders {
		s := addStream(c, uint64(2+2*i))
		go func() {
			for j := range frames {
				f := &ioppb.Frame{Body: &ioppb.Frame_TunnelRequestBody{TunnelRequestBody: &ioppb.TunnelRequestBody{Data: []byte("x")}}}
				if err := s.Send(ctx, f); err != nil {
					errs <- err
					return
				}
				if j%5 == 0 {
					time.Sleep(time.Duration(j%3) * time.Microsecond)
				}
			}
			errs <- nil
		}()
	}
	got := make(chan int, 1)
	go func() {
		dec := NewDecoder(b, DefaultMaxFrameSize)
		n := 0
		for n < (ctrlSenders+dataSenders)*frames {
			if _, err := dec.Decode(new(ioppb.Frame)); err != nil {
				break
			}
			n++
		}
		got <- n
	}()
	for range ctrlSenders + dataSenders {
		if err := recv(t, ctx, errs, "a sender to finish"); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case n := <-got:
		if want := (ctrlSenders + dataSenders) * frames; n != want {
			t.Fatalf("peer got %d frames, want %d", n, want)
		}
	case <-ctx.Done():
		t.Fatalf("frames left unsent: %d in the control queue, writer state %#x, writers %d",
			len(c.ctrl), c.ws.Load(), len(writers()))
	}
}

// TestHeartbeatTimerRacesClose closes links at every point of their
// heartbeat timer's cycle (a beat every 200 µs, a reader draining the
// peer): a beat that fires as Close runs starts no writer after it, so
// Close leaves no writer behind, and the timer re-arms no more.
func TestHeartbeatTimerRacesClose(t *testing.T) {
	for i := range 100 {
		a, b := pipeConns(t)
		cfg := testConfig()
		cfg.HeartbeatInterval = 200 * time.Microsecond
		c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideNode, 0, nopHandler{})
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			dec := NewDecoder(b, DefaultMaxFrameSize)
			for {
				if _, err := dec.Decode(new(ioppb.Frame)); err != nil {
					return
				}
			}
		}()
		c.start()
		time.Sleep(time.Duration(i%10) * 50 * time.Microsecond)
		c.Close(nil)
		_ = b.Close()
		<-drained
		// A writer past its wg.Done may still be on its way out.
		eventually(t, testCtx(t), "no writer after Close", func() bool { return len(writers()) == 0 })
		// A timer still firing would queue beats that no writer takes (one
		// beat may still land from a callback that had fired as Close ran).
		beats, queued := c.framesOut.Load(), len(c.ctrl)
		time.Sleep(2 * time.Millisecond) // ten intervals
		if n := len(writers()); n != 0 || c.framesOut.Load() != beats || len(c.ctrl) > queued+1 {
			t.Fatalf("round %d: after Close, %d writers, %d more frames out, %d more queued",
				i, n, c.framesOut.Load()-beats, len(c.ctrl)-queued)
		}
	}
}
