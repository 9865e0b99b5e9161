package transport

import (
	"context"
	"encoding/binary"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
)

// BenchmarkStalledReader (issue 10): 1,000 concurrent tunnels on one link,
// each delivering small timestamped chunks, measured twice per op in the same
// run: alone, and next to one more tunnel whose reader never reads while its
// node side pushes 16 KiB chunks as fast as credit allows. It reports each
// p99 of chunk latency (node send → edge Recv) and their ratio; the goal is
// stalled ÷ alone ≤ 1.10. No assertion: it reports.
//
//	go test -run '^$' -bench BenchmarkStalledReader -benchtime 3x ./adapters/transport/
func BenchmarkStalledReader(b *testing.B) {
	const streams, chunks = 1000, 20
	cfg := testConfig()
	cfg.HeartbeatTimeout = 30 * time.Second
	cfg.MaxStreams = 2 * streams
	p := newPair(b, pairOptions{server: cfg, client: ClientConfig{Transport: cfg}}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(ctx context.Context, req domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
			if out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200}) != nil {
				return
			}
			if req.Provider == "stall" {
				big := make([]byte, 16<<10)
				for out.Send(domain.TunnelFrame{Kind: domain.TunnelBody, Body: big}) == nil {
				}
				return
			}
			for i := 0; i < chunks; i++ {
				buf := make([]byte, 64)
				binary.LittleEndian.PutUint64(buf, uint64(time.Now().UnixNano()))
				if out.Send(domain.TunnelFrame{Kind: domain.TunnelBody, Body: buf}) != nil {
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelEnd})
		}
	})
	measure := func(stall bool) time.Duration {
		if stall {
			ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "stall"}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer ts.Close()
			if _, err := ts.Recv(p.ctx); err != nil { // status; then never read again
				b.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // its window fills
		}
		var mu sync.Mutex
		lat := make([]time.Duration, 0, streams*chunks)
		var wg sync.WaitGroup
		errs := make(chan error, streams)
		for i := 0; i < streams; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "p"}, nil)
				if err != nil {
					errs <- err
					return
				}
				defer ts.Close()
				var mine []time.Duration
				for {
					f, err := ts.Recv(p.ctx)
					if err != nil {
						errs <- err
						return
					}
					switch f.Kind {
					case domain.TunnelBody:
						mine = append(mine, time.Duration(time.Now().UnixNano()-int64(binary.LittleEndian.Uint64(f.Body))))
					case domain.TunnelEnd:
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
						return
					}
				}
			}()
		}
		wg.Wait()
		select {
		case err := <-errs:
			b.Fatal(err)
		default:
		}
		if len(lat) != streams*chunks {
			b.Fatalf("got %d chunks, want %d", len(lat), streams*chunks)
		}
		slices.Sort(lat)
		return lat[len(lat)*99/100]
	}
	var alone, stalled time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		alone += measure(false)
		stalled += measure(true)
	}
	b.ReportMetric(float64(alone.Microseconds())/float64(b.N), "p99-alone-µs")
	b.ReportMetric(float64(stalled.Microseconds())/float64(b.N), "p99-stalled-µs")
	b.ReportMetric(float64(stalled)/float64(alone), "stalled/alone")
}
