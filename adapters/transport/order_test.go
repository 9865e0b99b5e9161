package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	ioppb "iop/proto/iop"
)

// TestDataTakenAheadOfControlWaits: a data frame the writer took while
// control frames waited (a select picks either of two ready channels) goes
// out after them — among them, maybe, the frame that opens its stream —
// except its own stream's other control frames (an end or reset queued
// right after it), which stay behind it; nothing else is taken in between.
func TestDataTakenAheadOfControlWaits(t *testing.T) {
	open1 := &ioppb.Frame{StreamId: 1, Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{RunId: "r"}}}
	beat := heartbeatFrame(time.Now())
	reset1 := resetFrame(1, "cancelled", "")
	open5 := &ioppb.Frame{StreamId: 5, Body: &ioppb.Frame_ProviderTunnelRequest{ProviderTunnelRequest: &ioppb.ProviderTunnelRequest{Provider: "p"}}}
	names := map[*ioppb.Frame]string{open1: "open 1", beat: "heartbeat", reset1: "reset 1", open5: "open 5", closeSentinel: "close"}
	for _, tc := range []struct {
		name string
		ctrl []*ioppb.Frame
		want []string
	}{
		{"nothing waits", nil, []string{"chunk 1", "later data"}},
		{"its open waits", []*ioppb.Frame{beat, open1}, []string{"heartbeat", "open 1", "chunk 1", "later data"}},
		{"its reset came after it", []*ioppb.Frame{reset1}, []string{"chunk 1", "reset 1", "later data"}},
		{"mixed", []*ioppb.Frame{open1, reset1, beat, open5}, []string{"open 1", "heartbeat", "open 5", "chunk 1", "reset 1", "later data"}},
		// CloseAfterFlush queued its close after the chunk was handed over
		// (but before the writer got to order it): the chunk is written
		// before the link closes, not dropped behind it.
		{"a close queued after it", []*ioppb.Frame{beat, closeSentinel}, []string{"heartbeat", "chunk 1", "close", "later data"}},
		{"a close and its reset", []*ioppb.Frame{closeSentinel, reset1}, []string{"chunk 1", "reset 1", "close", "later data"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConn(nil, nil, testConfig(), SideEdge, 1<<20, nopHandler{})
			for _, f := range tc.ctrl {
				c.ctrl <- f
			}
			chunk := outFrame{raw: []byte("chunk 1"), stream: 1}
			later := outFrame{raw: []byte("later data"), stream: 7}
			sent := make(chan struct{})
			go func() { c.data <- later; close(sent) }()

			var ahead []outFrame
			got := []string{}
			name := func(o outFrame) string {
				if o.f != nil {
					return names[o.f]
				}
				return string(o.raw)
			}
			got = append(got, name(c.ordered(chunk, &ahead)))
			for got[len(got)-1] != "later data" {
				o := c.nextQueued(&ahead)
				if o.f == nil && o.raw == nil {
					select {
					case o = <-c.data: // its sender may not have reached the send yet
						o = c.ordered(o, &ahead)
					case <-time.After(5 * time.Second):
						t.Fatalf("the later data frame never came; got %q", got)
					}
				}
				got = append(got, name(o))
			}
			<-sent
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("order %q, want %q", got, tc.want)
			}
		})
	}
}

// TestStreamOpenGoesOutBeforeItsFirstChunk: many senders each open a
// stream and at once send its first body chunk; the peer must see every
// stream's open frame before any of its data (a chunk ahead of its open is
// dropped by the peer as unrouted, a silent hole in a request body). The
// race is narrow — the open must land on ctrl between the writer's look at
// ctrl alone and its select over both — so this runs many rounds.
func TestStreamOpenGoesOutBeforeItsFirstChunk(t *testing.T) {
	ctx := testCtx(t)
	a, b := pipeConns(t)
	cfg := testConfig()
	cfg.HeartbeatInterval, cfg.HeartbeatTimeout = time.Minute, 2*time.Minute
	c := newConn(a, NewDecoder(a, DefaultMaxFrameSize), cfg, SideEdge, 1<<20, nopHandler{})
	c.dataFrames = true
	c.start()
	defer c.Close(nil)

	const senders, rounds = 4, 15000
	errs := make(chan error, senders)
	var wg sync.WaitGroup
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				s, err := c.Open(ctx, &ioppb.Frame{Body: &ioppb.Frame_ProviderTunnelRequest{ProviderTunnelRequest: &ioppb.ProviderTunnelRequest{Provider: "p"}}})
				if err != nil {
					errs <- err
					return
				}
				if err := s.SendBody(ctx, dataRequestBody, []byte("x")); err != nil {
					errs <- err
					return
				}
				c.remove(s)
				s.end(context.Canceled)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	dec := NewDecoder(b, DefaultMaxFrameSize)
	opened := map[uint64]bool{}
	for seen := 0; seen < senders*rounds; {
		f := new(ioppb.Frame)
		var df dataFrame
		_, isData, err := dec.next(f, &df)
		if err != nil {
			t.Fatalf("after %d chunks: %v", seen, err)
		}
		if !isData {
			if f.GetProviderTunnelRequest() != nil {
				opened[f.StreamId] = true
			}
			continue
		}
		if !opened[df.stream] {
			t.Fatalf("a body chunk of stream %d came before the stream's open frame (after %d chunks in order)", df.stream, seen)
		}
		putPayload(df.pool)
		seen++
	}
	select {
	case err := <-errs:
		t.Fatal(err)
	case <-done:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
}

// TestAbandonedSendGivesItsCreditBack: a Send whose caller gives up while
// it waits for the writer did not send its frame, so the stream's credit
// is what it was before (it used to shrink by the frame's cost for good).
func TestAbandonedSendGivesItsCreditBack(t *testing.T) {
	c := newConn(nil, nil, testConfig(), SideEdge, 1<<20, nopHandler{}) // not started: no writer takes frames
	s := addStream(c, 2)
	credit := func() int { s.mu.Lock(); defer s.mu.Unlock(); return s.credit }
	before := credit()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	f := &ioppb.Frame{Body: &ioppb.Frame_TunnelRequestBody{TunnelRequestBody: &ioppb.TunnelRequestBody{Data: make([]byte, 1<<10)}}}
	if err := s.Send(ctx, f); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send: %v, want the caller's deadline", err)
	}
	if after := credit(); after != before {
		t.Fatalf("credit %d after the abandoned send, %d before", after, before)
	}
}
