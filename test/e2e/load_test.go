//go:build load

package e2e

// The load tool (issue 10): `make bench-compare`. It starts a local SSE
// provider, a real iop-edge and iop-node (via the harness), and measures the
// provider reached directly against the same provider through the edge, in
// the same run, then runs through the exec adapter. It reports; it asserts
// only that the requests succeed. Figures go to docs/benchmarks.md as ratios.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loadChunks is the number of SSE events of a chat response (the issue's
// 50-chunk response).
const loadChunks = 50

// loadProvider answers by X-Bench-Model: "chat" streams loadChunks small SSE
// events, one flush each; "bulk-N" streams N bytes in 32 KiB writes.
func loadProvider(t *testing.T) *httptest.Server {
	chunk := bytes.Repeat([]byte("x"), 32<<10)
	ev := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"token \"}}]}\n\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		model := r.Header.Get("X-Bench-Model")
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		if model == "chat" {
			for i := 0; i < loadChunks; i++ {
				w.Write(ev)
				f.Flush()
			}
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		n, _ := strconv.Atoi(strings.TrimPrefix(model, "bulk-"))
		for n > 0 {
			k := min(n, len(chunk))
			w.Write(chunk[:k])
			f.Flush()
			n -= k
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// loadClient keeps enough idle connections for the highest concurrency, so
// neither path pays a TCP handshake per request.
var loadClient = &http.Client{Transport: &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 128}}

func loadRequest(url, model string) (ttfb time.Duration, n int64, err error) {
	body := []byte(fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, model))
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Bench-Model", model)
	start := time.Now()
	resp, err := loadClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	one := make([]byte, 1)
	if _, err := io.ReadFull(resp.Body, one); err != nil {
		return 0, 0, err
	}
	ttfb = time.Since(start)
	rest, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return ttfb, rest + 1, err
}

// procCPU is a process's own user+system CPU (children excluded) from
// /proc/PID/stat fields 14 and 15.
func procCPU(t *testing.T, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// fields[0] is field 3 (state): utime is field 14, stime field 15.
	ut, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	const userHZ = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / userHZ
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// hammer runs work from conc goroutines for dur and returns completions/s.
func hammer(t *testing.T, conc int, dur time.Duration, work func() error) (perSec float64, n int64) {
	var done atomic.Int64
	var failed atomic.Pointer[error]
	stop := time.Now().Add(dur)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < conc; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if err := work(); err != nil {
					failed.Store(&err)
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		t.Fatalf("load request failed: %v", *p)
	}
	el := time.Since(start)
	return float64(done.Load()) / el.Seconds(), done.Load()
}

type loadReport struct {
	t    *testing.T
	rows [][4]string
}

func (r *loadReport) add(measure, direct, iop, ratio string) {
	r.rows = append(r.rows, [4]string{measure, direct, iop, ratio})
}

func (r *loadReport) print(title string) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s\n| measure | direct | through iop | ratio / added |\n|---|---|---|---|\n", title)
	for _, row := range r.rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", row[0], row[1], row[2], row[3])
	}
	fmt.Print(b.String())
}

func us(d time.Duration) string { return fmt.Sprintf("%d µs", d.Microseconds()) }

// TestLoadCompare measures with the link in its default TLS mode (auto)
// and with tls.mode off; IOP_LOAD_MODES=auto or =off picks one.
func TestLoadCompare(t *testing.T) {
	modes := []string{"auto", "off"}
	if m := os.Getenv("IOP_LOAD_MODES"); m != "" {
		modes = strings.Split(m, ",")
	}
	for _, mode := range modes {
		t.Run("tls-"+mode, func(t *testing.T) { loadCompare(t, mode) })
	}
}

func loadCompare(t *testing.T, mode string) {
	p := loadProvider(t)
	const bulk = 16 << 20
	nodes := fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: bench, type: openai, base_url: %q, models: [chat, bulk-%d]}
    adapters:
      - name: exec
        type: exec
        max_concurrency: 64
        targets:
          echo: {command: ["cat"]}
          stamp: {command: ["date", "+%%s%%N"]}
`, testToken, p.URL, bulk)
	tls := ""
	if mode == "off" {
		tls = "{mode: off}"
	}
	e := &edge{transport: freeAddr(t), config: t.TempDir() + "/edge.yaml"}
	httpAddr := freeAddr(t)
	e.url = "http://" + httpAddr
	// Info, not the harness's debug: a log line per request is not what is measured.
	cfg := strings.Replace(edgeConfigTLS(e.transport, httpAddr, tls, nodes), "level: debug", "level: info", 1)
	if err := os.WriteFile(e.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// IOP_LOAD_PPROF=DIR: both processes serve --pprof and CPU and
	// allocation profiles of the 32-concurrent tunnel load land in DIR.
	profDir := os.Getenv("IOP_LOAD_PPROF")
	var edgeProf, nodeProf string
	edgeArgs := []string{"--config", e.config}
	nodeArgs := []string{"--log-level", "info"}
	if profDir != "" {
		edgeProf, nodeProf = freeAddr(t), freeAddr(t)
		edgeArgs = append(edgeArgs, "--pprof", edgeProf)
		nodeArgs = append(nodeArgs, "--pprof", nodeProf)
	}
	e.proc = start(t, "iop-edge", nil, edgeArgs...)
	waitHealthy(t, e.url, e.proc)
	n := startNodeOpts(t, e, testToken, nodeOptions{args: nodeArgs})
	waitNode(t, e, "n1")
	relayCPU := func() time.Duration { return procCPU(t, e.cmd.Process.Pid) + procCPU(t, n.cmd.Process.Pid) }

	r := &loadReport{t: t}
	// Warm both paths (connections, pools).
	for i := 0; i < 50; i++ {
		for _, u := range []string{p.URL, e.url} {
			if _, _, err := loadRequest(u, "chat"); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Sequential time to first byte, interleaved so both see the same noise.
	var dT, iT []time.Duration
	for i := 0; i < 400; i++ {
		for j, u := range []string{p.URL, e.url} {
			d, _, err := loadRequest(u, "chat")
			if err != nil {
				t.Fatal(err)
			}
			if j == 0 {
				dT = append(dT, d)
			} else {
				iT = append(iT, d)
			}
		}
	}
	r.add("sequential TTFB p50", us(pct(dT, .5)), us(pct(iT, .5)), "+"+us(pct(iT, .5)-pct(dT, .5)))
	r.add("sequential TTFB p99", us(pct(dT, .99)), us(pct(iT, .99)), "+"+us(pct(iT, .99)-pct(dT, .99)))

	for _, conc := range []int{1, 8, 32} {
		dr, _ := hammer(t, conc, 2*time.Second, func() error { _, _, err := loadRequest(p.URL, "chat"); return err })
		c0 := relayCPU()
		ir, cnt := hammer(t, conc, 2*time.Second, func() error { _, _, err := loadRequest(e.url, "chat"); return err })
		cpu := relayCPU() - c0
		r.add(fmt.Sprintf("requests/s at %d concurrent (%d-chunk SSE)", conc, loadChunks),
			fmt.Sprintf("%.0f", dr), fmt.Sprintf("%.0f", ir), fmt.Sprintf("%.2f×", ir/dr))
		if conc == 32 {
			r.add("relay CPU per request at 32 (edge+node user+sys)", "—",
				us(cpu/time.Duration(cnt)), fmt.Sprintf("%d requests", cnt))
		}
	}

	if profDir != "" {
		addrs := map[string]string{"edge": edgeProf, "node": nodeProf}
		profile(t, profDir, mode+"-chat", addrs, func() {
			hammer(t, 32, 5*time.Second, func() error { _, _, err := loadRequest(e.url, "chat"); return err })
		})
		profile(t, profDir, mode+"-bulk", addrs, func() {
			hammer(t, 1, 5*time.Second, func() error { _, _, err := loadRequest(e.url, fmt.Sprintf("bulk-%d", bulk)); return err })
		})
	}

	bulkRate := func(u string) float64 {
		var best float64
		for i := 0; i < 3; i++ {
			start := time.Now()
			_, got, err := loadRequest(u, fmt.Sprintf("bulk-%d", bulk))
			if err != nil || got != bulk {
				t.Fatalf("bulk: %d bytes, %v", got, err)
			}
			best = max(best, float64(bulk)/time.Since(start).Seconds()/1e6)
		}
		return best
	}
	db, ib := bulkRate(p.URL), bulkRate(e.url)
	r.add("bulk SSE body, one stream (best of 3, 16 MiB)", fmt.Sprintf("%.0f MB/s", db), fmt.Sprintf("%.0f MB/s", ib), fmt.Sprintf("%.2f×", ib/db))

	// Runs: exec "echo" (cat) at 32 concurrent.
	run := func(target string) (string, error) {
		body := []byte(fmt.Sprintf(`{"adapter":"exec","target":%q,"input":"hello load\n"}`, target))
		resp, err := loadClient.Post(e.url+"/v1/runs", "application/json", bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			return "", fmt.Errorf("run: %d %s", resp.StatusCode, b)
		}
		var out strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "data:") {
				continue
			}
			var ev runEvent
			if json.Unmarshal([]byte(strings.TrimSpace(line[5:])), &ev) == nil {
				switch ev.Type {
				case "delta":
					if out.Len() == 0 {
						out.WriteString(fmt.Sprintf("%d|", time.Now().UnixNano()))
					}
					out.WriteString(ev.Text)
				case "error", "cancelled":
					return "", fmt.Errorf("run failed: %s", line)
				}
			}
		}
		return out.String(), sc.Err()
	}
	c0 := relayCPU()
	rr, cnt := hammer(t, 32, 3*time.Second, func() error {
		got, err := run("echo")
		if err == nil && !strings.HasSuffix(got, "hello load\n") {
			err = fmt.Errorf("echo run returned %q", got)
		}
		return err
	})
	cpu := relayCPU() - c0
	r.add("runs/s at 32 concurrent (exec cat)", "—", fmt.Sprintf("%.0f", rr), "")
	r.add("edge+node CPU per run (children excluded)", "—", us(cpu/time.Duration(cnt)), fmt.Sprintf("%d runs", cnt))

	// Event latency: the child prints its clock; the caller notes when the
	// output event arrives (same host, same clock).
	var lat []time.Duration
	for i := 0; i < 50; i++ {
		got, err := run("stamp")
		if err != nil {
			t.Fatal(err)
		}
		recv, stamp, _ := strings.Cut(strings.TrimSpace(got), "|")
		a, _ := strconv.ParseInt(recv, 10, 64)
		b, err := strconv.ParseInt(stamp, 10, 64)
		if err != nil {
			t.Fatalf("stamp output %q", got)
		}
		lat = append(lat, time.Duration(a-b))
	}
	r.add("event latency, child prints → caller receives, p50 / p99", "—",
		us(pct(lat, .5))+" / "+us(pct(lat, .99)), "")
	r.print(fmt.Sprintf("iop load compare, link tls.mode %s (%s)", mode, time.Now().UTC().Format(time.RFC3339)))
}

// profile runs load while fetching a CPU profile of each process, then an
// allocation profile of each, into dir.
func profile(t *testing.T, dir, mode string, addrs map[string]string, load func()) {
	var wg sync.WaitGroup
	fetch := func(name, url string) {
		defer wg.Done()
		resp, err := http.Get(url)
		if err != nil {
			t.Errorf("pprof %s: %v", url, err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if err := os.WriteFile(fmt.Sprintf("%s/%s-%s", dir, mode, name), b, 0o644); err != nil {
			t.Error(err)
		}
	}
	for who, a := range addrs {
		wg.Add(1)
		go fetch(who+".cpu.pprof", "http://"+a+"/debug/pprof/profile?seconds=4")
	}
	load()
	wg.Wait()
	for who, a := range addrs {
		wg.Add(1)
		go fetch(who+".allocs.pprof", "http://"+a+"/debug/pprof/allocs")
	}
	wg.Wait()
}
