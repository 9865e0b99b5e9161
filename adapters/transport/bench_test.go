package transport

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
)

// Benchmarks over loopback TCP. The raw-TCP baselines move the same bytes
// with no framing, so ratios show the link's own cost:
//
//	go test -run=^$ -bench=. -benchmem ./adapters/transport/

const benchPayload = 1 << 20 // bytes per op in the throughput benchmarks

func benchPair(b *testing.B, setup func(n *fakeNode)) *pair {
	b.Helper()
	cfg := testConfig()
	cfg.HeartbeatTimeout = 30 * time.Second
	return newPair(b, pairOptions{server: cfg, client: ClientConfig{Transport: cfg}}, func(_ *fakeEdge, n *fakeNode) { setup(n) })
}

// benchWires compares tunnel bodies in binary data frames with the
// protobuf frames an older peer gets, in the same run.
var benchWires = []struct {
	name string
	off  bool
}{{"data-frames", false}, {"protobuf", true}}

func benchTunnelPair(b *testing.B, noData bool, setup func(n *fakeNode)) *pair {
	b.Helper()
	cfg := testConfig()
	cfg.HeartbeatTimeout = 30 * time.Second
	cfg.NoDataFrames = noData
	return newPair(b, pairOptions{server: cfg, client: ClientConfig{Transport: cfg}}, func(_ *fakeEdge, n *fakeNode) { setup(n) })
}

// BenchmarkTunnelThroughput moves benchPayload bytes per op from the node
// to the edge through one provider tunnel, in 32 KiB reads as the node's
// tunnel handler makes them.
func BenchmarkTunnelThroughput(b *testing.B) {
	for _, w := range benchWires {
		b.Run(w.name, func(b *testing.B) { benchTunnel(b, w.off, 32<<10) })
	}
}

// BenchmarkTunnelSSEChunks is BenchmarkTunnelThroughput for a token
// stream: 120-byte chunks, each its own frame.
func BenchmarkTunnelSSEChunks(b *testing.B) {
	for _, w := range benchWires {
		b.Run(w.name, func(b *testing.B) { benchTunnel(b, w.off, 120) })
	}
}

func benchTunnel(b *testing.B, noData bool, chunk int) {
	body := make([]byte, chunk)
	p := benchTunnelPair(b, noData, func(n *fakeNode) {
		n.onTunnel = func(ctx context.Context, _ domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
			if out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200}) != nil {
				return
			}
			for {
				if out.Send(domain.TunnelFrame{Kind: domain.TunnelBody, Body: body}) != nil {
					return
				}
			}
		}
	})
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "bench"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ts.Close()
	if _, err := ts.Recv(p.ctx); err != nil { // status
		b.Fatal(err)
	}
	per := benchPayload
	if chunk < 1<<10 {
		per = 64 << 10
	}
	b.SetBytes(int64(per))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for got := 0; got < per; {
			f, err := ts.Recv(p.ctx)
			if err != nil {
				b.Fatal(err)
			}
			got += len(f.Body)
		}
	}
	b.StopTimer()
}

// BenchmarkRunEvents sends one small delta event per op through one run.
func BenchmarkRunEvents(b *testing.B) {
	const text = "a small delta of about sixty-four bytes, like one token or two.."
	p := benchPair(b, func(n *fakeNode) {
		n.onRun = func(req domain.RunRequest, out ports.RunOutput) {
			ev := domain.RunEvent{RunID: req.RunID, Type: domain.EventDelta, Text: text}
			for seq := uint64(1); ; seq++ {
				ev.Seq = seq
				if out.Emit(context.Background(), ev) != nil {
					return
				}
			}
		}
	})
	rs, err := p.link.StartRun(p.ctx, runReq("bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer rs.Close()
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := rs.Recv(p.ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
}

// rawTCPPair returns both ends of a loopback TCP connection.
func rawTCPPair(b *testing.B) (net.Conn, net.Conn) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	r := <-accepted
	if r == nil {
		b.Fatal("accept failed")
	}
	b.Cleanup(func() { _ = w.Close(); _ = r.Close() })
	return w, r
}

// BenchmarkRawTCPThroughput is the baseline for BenchmarkTunnelThroughput:
// benchPayload bytes per op over a bare loopback socket, written in 32 KiB
// slices like the tunnel's chunks.
func BenchmarkRawTCPThroughput(b *testing.B) {
	w, r := rawTCPPair(b)
	chunk := make([]byte, maxDataChunk)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	b.SetBytes(benchPayload)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for got := 0; got < benchPayload; {
			n, err := r.Read(buf[:min(len(buf), benchPayload-got)])
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
	b.StopTimer()
	_ = r.Close()
	_ = w.Close()
	<-done
}

// BenchmarkRawTCPSmallMessages is the baseline for BenchmarkRunEvents:
// length-prefixed 64-byte messages over a bare loopback socket, read
// through a bufio.Reader of the link's read buffer size.
func BenchmarkRawTCPSmallMessages(b *testing.B) {
	w, r := rawTCPPair(b)
	msg := binary.AppendUvarint(nil, 64)
	msg = append(msg, make([]byte, 64)...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		batch := make([]byte, 0, 64<<10)
		for len(batch)+len(msg) <= cap(batch) {
			batch = append(batch, msg...)
		}
		for {
			if _, err := w.Write(batch); err != nil {
				return
			}
		}
	}()
	br := bufio.NewReaderSize(r, readBufferSize)
	b.SetBytes(64)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n, err := binary.ReadUvarint(br)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := br.Discard(int(n)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	_ = r.Close()
	_ = w.Close()
	<-done
}

// BenchmarkTunnelFirstByte is one sequential tunnel exchange per op: the
// edge opens a tunnel, the node answers status, header, one small body
// chunk and end, and the op ends when the edge has read the end. It is the
// link's share of a request's time to first byte (both ends in this
// process). The timer is never stopped: stopping it with ReportAllocs on
// reads memory statistics, a stop-the-world pause that would put every
// exchange behind cold threads.
func BenchmarkTunnelFirstByte(b *testing.B) {
	for _, w := range benchWires {
		b.Run(w.name, func(b *testing.B) {
			chunk := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
			p := benchTunnelPair(b, w.off, func(n *fakeNode) {
				n.onTunnel = func(ctx context.Context, _ domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
					for _, f := range []domain.TunnelFrame{
						{Kind: domain.TunnelStatus, Status: 200},
						{Kind: domain.TunnelHeader, Header: domain.Header{"Content-Type": {"text/event-stream"}}},
						{Kind: domain.TunnelBody, Body: chunk},
						{Kind: domain.TunnelEnd},
					} {
						if out.Send(f) != nil {
							return
						}
					}
				}
			})
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "bench", Method: "POST", Path: "/v1/chat/completions"}, nil)
				if err != nil {
					b.Fatal(err)
				}
				body := false
				for {
					f, err := ts.Recv(p.ctx)
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					body = body || f.Kind == domain.TunnelBody
				}
				if !body {
					b.Fatal("no body chunk")
				}
				ts.Close()
			}
		})
	}
}

// BenchmarkTunnelFirstByteAfterIdle is BenchmarkTunnelFirstByte for an
// exchange on a link that was idle: before each one, both ends' writers
// have ended (writer-ended; a link's writer runs only while there is
// something to write), so the exchange starts them again; writer-running
// is the same with writers that never end, the baseline in the same run.
// exchange-ns is the mean time of one exchange; ns/op also counts the wait
// for the writers to end, and is not a figure to compare.
//
//	go test -run '^$' -bench BenchmarkTunnelFirstByteAfterIdle -benchtime 2000x ./adapters/transport/
func BenchmarkTunnelFirstByteAfterIdle(b *testing.B) {
	for _, v := range []struct {
		name   string
		linger time.Duration
	}{{"writer-ended", time.Millisecond}, {"writer-running", time.Hour}} {
		b.Run(v.name, func(b *testing.B) {
			cfg := testConfig()
			cfg.HeartbeatInterval, cfg.HeartbeatTimeout = time.Minute, 2*time.Minute
			cfg.writerLinger = v.linger
			cfg.writerStays = v.linger > time.Minute
			chunk := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
			p := newPair(b, pairOptions{server: cfg, client: ClientConfig{Transport: cfg}}, func(_ *fakeEdge, n *fakeNode) {
				n.onTunnel = func(ctx context.Context, _ domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
					for _, f := range []domain.TunnelFrame{
						{Kind: domain.TunnelStatus, Status: 200},
						{Kind: domain.TunnelBody, Body: chunk},
						{Kind: domain.TunnelEnd},
					} {
						if out.Send(f) != nil {
							return
						}
					}
				}
			})
			ends := []*Conn{p.link.conn, p.cli.currentConn()}
			idle := func() bool {
				for _, c := range ends {
					if c.ws.Load()&writerRunning != 0 {
						return false
					}
				}
				return true
			}
			var spent time.Duration
			for i := 0; i < b.N; i++ {
				if v.linger < time.Minute {
					for !idle() {
						time.Sleep(200 * time.Microsecond)
					}
				} else {
					time.Sleep(2 * time.Millisecond) // the same pause, writers running
				}
				t0 := time.Now()
				ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "bench", Method: "POST", Path: "/v1/chat/completions"}, nil)
				if err != nil {
					b.Fatal(err)
				}
				for {
					_, err := ts.Recv(p.ctx)
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				spent += time.Since(t0)
				ts.Close()
			}
			b.ReportMetric(float64(spent.Nanoseconds())/float64(b.N), "exchange-ns")
		})
	}
}

// BenchmarkLargeRunRequest starts one run per op whose request frame
// carries 4 MiB of input, and waits for its terminal event: a large control
// frame written and read whole (in pieces, each moving the deadlines).
func BenchmarkLargeRunRequest(b *testing.B) {
	cfg := testConfig()
	cfg.HeartbeatTimeout = 30 * time.Second
	cfg.MaxFrameSize = 8 << 20
	p := newPair(b, pairOptions{server: cfg, client: ClientConfig{Transport: cfg}}, func(_ *fakeEdge, n *fakeNode) {
		n.onRun = func(req domain.RunRequest, out ports.RunOutput) {
			_ = out.Emit(context.Background(), domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventComplete})
			out.Close()
		}
	})
	req := runReq("bench")
	req.Input = make([]byte, 4<<20)
	b.SetBytes(int64(len(req.Input)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rs, err := p.link.StartRun(p.ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if ev, err := rs.Recv(p.ctx); err != nil || !ev.Type.Terminal() {
			b.Fatalf("run: %v %v", ev.Type, err)
		}
		rs.Close()
	}
	b.StopTimer()
}
