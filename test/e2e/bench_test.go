package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// benchProvider answers /v1/chat/completions by model: "bench-first" sends
// one small SSE event (time to first byte), "bench-bulk-N" streams N bytes
// in 32 KiB writes (throughput).
func benchProvider(b *testing.B) *httptest.Server {
	chunk := bytes.Repeat([]byte("x"), 32<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		model := r.Header.Get("X-Bench-Model")
		w.Header().Set("Content-Type", "text/event-stream")
		if model == "bench-first" {
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
			return
		}
		n, _ := strconv.Atoi(model[len("bench-bulk-"):])
		f := w.(http.Flusher)
		for n > 0 {
			k := min(n, len(chunk))
			w.Write(chunk[:k])
			f.Flush()
			n -= k
		}
	}))
	b.Cleanup(srv.Close)
	return srv
}

const bulkBytes = 8 << 20

func benchRequest(b *testing.B, url, model string) (ttfb time.Duration, n int64) {
	body := []byte(fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, model))
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Bench-Model", model)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	one := make([]byte, 1)
	if _, err := io.ReadFull(resp.Body, one); err != nil {
		b.Fatal(err)
	}
	ttfb = time.Since(start)
	rest, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("status %d, %v", resp.StatusCode, err)
	}
	return ttfb, rest + 1
}

// BenchmarkTunnelOverhead compares the provider reached directly with the
// same provider reached through a real iop-edge and iop-node on loopback,
// in one run: docs/benchmarks.md reports the ratios.
func BenchmarkTunnelOverhead(b *testing.B) {
	p := benchProvider(b)
	nodes := fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: bench, type: openai, base_url: %q, models: [bench-first, bench-bulk-%d]}
`, testToken, p.URL, bulkBytes)
	e := startEdge(b, nodes)
	startNode(b, e, testToken)
	waitNode(b, e, "n1")
	for _, path := range []struct{ name, url string }{{"direct", p.URL}, {"edge", e.url}} {
		b.Run("ttfb/"+path.name, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				d, _ := benchRequest(b, path.url, "bench-first")
				total += d
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N), "ttfb-µs/op")
		})
		b.Run("throughput/"+path.name, func(b *testing.B) {
			b.SetBytes(bulkBytes)
			for i := 0; i < b.N; i++ {
				if _, n := benchRequest(b, path.url, fmt.Sprintf("bench-bulk-%d", bulkBytes)); n != bulkBytes {
					b.Fatalf("got %d bytes", n)
				}
			}
		})
	}
}
