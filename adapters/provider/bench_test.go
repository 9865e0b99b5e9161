//go:build unix

package provider_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/adapters/provider"
	"iop/domain"
)

// benchServerEnv makes the test binary a local SSE provider (the
// benchmark's child process): 50 events per request, each flushed, as a
// streaming completion. Out of process, the benchmark's CPU is the
// client's alone.
const benchServerEnv = "IOP_PROVIDER_BENCH_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(benchServerEnv) == "1" {
		serveBenchSSE()
		return
	}
	os.Exit(m.Run())
}

func serveBenchSSE() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	// The parent closes stdin when done: the server exits with it.
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); os.Exit(0) }()
	ev := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"token \"}}]}\n\n")
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := 0; i < 50; i++ {
			_, _ = w.Write(ev)
			f.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
}

var benchSrv struct {
	once  sync.Once
	addr  string
	err   error
	stdin io.WriteCloser // held open: the child exits when it closes
}

// benchProvider starts the SSE provider child once per test binary.
func benchProvider(b *testing.B) string {
	benchSrv.once.Do(func() {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), benchServerEnv+"=1")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			benchSrv.err = err
			return
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			benchSrv.err = err
			return
		}
		if benchSrv.err = cmd.Start(); benchSrv.err != nil {
			return
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			benchSrv.err = fmt.Errorf("bench provider: %v", err)
			_ = cmd.Process.Kill()
			return
		}
		benchSrv.addr = strings.TrimSpace(line)
		// Left running for the other benchmarks; it exits when this
		// process does (its stdin closes).
		benchSrv.stdin = stdin
	})
	if benchSrv.err != nil {
		b.Fatal(benchSrv.err)
	}
	return benchSrv.addr
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkProviderClientSSE compares the lean path with net/http.Transport
// on one 50-event SSE completion per op against a provider in another
// process: cpu-µs/op is this process's user+system CPU (the client's
// alone), ttfb-µs the median time from Do to the first body bytes.
// "seq" is one request at a time, "c32" 32 concurrent.
func BenchmarkProviderClientSSE(b *testing.B) {
	for _, conc := range []int{1, 32} {
		for _, p := range []struct {
			name string
			path clientPath
		}{{"lean", clientPath{}}, {"transport", clientPath{transportOnly: true}}} {
			name := fmt.Sprintf("%s/seq", p.name)
			if conc > 1 {
				name = fmt.Sprintf("%s/c%d", p.name, conc)
			}
			b.Run(name, func(b *testing.B) { benchSSE(b, p.path, conc) })
		}
	}
}

func benchSSE(b *testing.B, path clientPath, conc int) {
	addr := benchProvider(b)
	c := provider.New(provider.Options{TransportOnly: path.transportOnly})
	defer c.Close()
	p := domain.ProviderConfig{Name: "bench", Type: domain.ProviderOpenAI, BaseURL: "http://" + addr}
	req := domain.TunnelRequest{Method: http.MethodPost, Path: "/v1/chat/completions",
		Header: domain.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}]}`)}
	one := func(buf []byte) (time.Duration, error) {
		start := time.Now()
		resp, err := c.Do(context.Background(), p, req, nil)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var ttfb time.Duration
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 && ttfb == 0 {
				ttfb = time.Since(start)
			}
			if err == io.EOF {
				return ttfb, nil
			}
			if err != nil {
				return 0, err
			}
		}
	}
	// Warm: connections for every concurrent caller.
	var wg sync.WaitGroup
	for i := 0; i < conc; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = one(make([]byte, 32<<10)) }()
	}
	wg.Wait()

	ttfbs := make([][]time.Duration, conc)
	errs := make(chan error, conc)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := selfCPU()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 32<<10)
			for i := w; i < b.N; i += conc {
				d, err := one(buf)
				if err != nil {
					errs <- err
					return
				}
				ttfbs[w] = append(ttfbs[w], d)
			}
		}()
	}
	wg.Wait()
	cpu := selfCPU() - cpu0
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	all := slices.Concat(ttfbs...)
	slices.Sort(all)
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	if conc == 1 {
		b.ReportMetric(float64(all[len(all)/2].Nanoseconds())/1e3, "ttfb-µs")
	}
}
