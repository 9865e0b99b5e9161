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
		c.mu.Lock()
		s := newStream(c, uint64(2+2*i))
		c.streams[s.id] = s
		c.mu.Unlock()
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
