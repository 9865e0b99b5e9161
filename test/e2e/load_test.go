//go:build load

package e2e

// The load tool (issue 10): `make bench-compare`. It starts a local SSE
// provider, a real iop-edge and iop-node (via the harness) and, when its
// binaries are there (`make frp`), frps + frpc relaying raw TCP to the same
// provider. It measures the provider reached directly, through frp and
// through iop side by side: each round runs every measure on all three paths,
// interleaved, so they share the machine's noise; the report gives each
// measure's median over the rounds with its range, and ratios taken within
// each round. Then runs through the exec adapter, against the cost of
// spawning the same child from a Go process in the same round. It reports; it
// asserts only that the requests succeed. Figures go to docs/benchmarks.md.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"iop/internal/lockedbuf"
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
	user, sys := procTimes(t, pid)
	return user + sys
}

// procTimes is a process's own user and system CPU (fields 14 and 15).
func procTimes(t *testing.T, pid int) (user, sys time.Duration) {
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
	return time.Duration(ut) * time.Second / userHZ, time.Duration(st) * time.Second / userHZ
}

// procSys is a process's own system CPU: the kernel's work for it (its
// system calls, mostly).
func procSys(t *testing.T, pid int) time.Duration {
	_, sys := procTimes(t, pid)
	return sys
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

// The tool's shape: rounds of every measure, each cell long enough to
// average a scheduler's time slices, the whole under about 1.5 minutes per
// TLS mode on two cores.
const (
	defaultRounds = 3
	rateCell      = 2 * time.Second // one requests/s measurement of one path
	ttfbPerRound  = 200             // sequential requests per path per round
	runsCell      = 3 * time.Second // runs/s, and the spawn baseline, per round
	seqRuns       = 30              // sequential runs (and spawns) per round
	loadBulk      = 16 << 20
)

// relayPath is one way to reach the provider.
type relayPath struct {
	name string
	url  string
	// cpu is the relay processes' own CPU so far, and sys the part of it
	// in the kernel; nil for direct.
	cpu, sys func() time.Duration
}

// metric is one measure: per column, one value per round.
type metric struct {
	label string
	unit  unit
	// added: columns compare as a difference (latency), not a ratio.
	added bool
	vals  map[string][]float64
}

// loadResults keeps metrics in the order they were first recorded.
type loadResults struct {
	order []*metric
	byKey map[string]*metric
}

func (r *loadResults) add(label string, u unit, added bool, col string, v float64) {
	if r.byKey == nil {
		r.byKey = map[string]*metric{}
	}
	m := r.byKey[label]
	if m == nil {
		m = &metric{label: label, unit: u, added: added, vals: map[string][]float64{}}
		r.byKey[label] = m
		r.order = append(r.order, m)
	}
	m.vals[col] = append(m.vals[col], v)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// unit formats a value: its number (format) and what follows it (suffix).
type unit struct{ format, suffix string }

var (
	usU    = unit{"%.0f", " µs"}
	rateU  = unit{"%.0f", ""}
	mbU    = unit{"%.0f", " MB/s"}
	ratioU = unit{"%.2f", "×"}
	addedU = unit{"%+.0f", " µs"}
)

// spread is "median unit (min–max)", or the one value of a single round.
func spread(xs []float64, u unit) string {
	if len(xs) == 0 {
		return "—"
	}
	if len(xs) == 1 {
		return fmt.Sprintf(u.format, xs[0]) + u.suffix
	}
	return fmt.Sprintf(u.format+"%s ("+u.format+"–"+u.format+")", median(xs), u.suffix, slices.Min(xs), slices.Max(xs))
}

// compare is other against base, round by round: their difference for a
// latency, their ratio otherwise.
func (m *metric) compare(base, other string) string {
	a, b := m.vals[base], m.vals[other]
	if len(a) == 0 || len(b) == 0 || len(a) != len(b) {
		return "—"
	}
	per := make([]float64, len(a))
	for i := range a {
		if m.added {
			per[i] = b[i] - a[i]
		} else {
			per[i] = b[i] / a[i]
		}
	}
	if m.added {
		return spread(per, addedU)
	}
	return spread(per, ratioU)
}

// table prints one column per cols entry and one comparison per pair
// {base, other}, headed by heads.
func (r *loadResults) table(cols, heads []string, pairs [][2]string) string {
	var b strings.Builder
	b.WriteString("| measure |")
	for _, h := range heads {
		fmt.Fprintf(&b, " %s |", h)
	}
	b.WriteString("\n|---|")
	b.WriteString(strings.Repeat("---|", len(heads)))
	b.WriteString("\n")
	for _, m := range r.order {
		fmt.Fprintf(&b, "| %s |", m.label)
		for _, c := range cols {
			fmt.Fprintf(&b, " %s |", spread(m.vals[c], m.unit))
		}
		for _, p := range pairs {
			fmt.Fprintf(&b, " %s |", m.compare(p[0], p[1]))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func usOf(d time.Duration) float64 {
	return float64(d) / float64(time.Microsecond)
}

// TestLoadCompare measures with the link in its default TLS mode (auto)
// and with tls.mode off; IOP_LOAD_MODES=auto or =off picks one.
// IOP_LOAD_ROUNDS sets the number of rounds (default 3); IOP_LOAD_REPORT=FILE
// also appends each mode's report (markdown) to FILE; IOP_LOAD_PARTS=tunnel or
// =runs measures only the provider tunnel or only the runs (default both).
func TestLoadCompare(t *testing.T) {
	modes := []string{"auto", "off"}
	if m := os.Getenv("IOP_LOAD_MODES"); m != "" {
		modes = strings.Split(m, ",")
	}
	rounds := defaultRounds
	if s := os.Getenv("IOP_LOAD_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("IOP_LOAD_ROUNDS=%q: want a positive number", s)
		}
		rounds = n
	}
	switch os.Getenv("IOP_LOAD_PARTS") {
	case "", "tunnel", "runs":
	default:
		t.Fatalf("IOP_LOAD_PARTS=%q: want tunnel or runs", os.Getenv("IOP_LOAD_PARTS"))
	}
	for _, mode := range modes {
		t.Run("tls-"+mode, func(t *testing.T) { loadCompare(t, mode, rounds) })
	}
}

func loadCompare(t *testing.T, mode string, rounds int) {
	p := loadProvider(t)
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
`, testToken, p.URL, loadBulk)
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
	// IOP_LOAD_PPROF=DIR: edge and node serve --pprof (frps and frpc their
	// web server's pprof) and, after the rounds, CPU and allocation profiles
	// under chat, bulk and run load, and execution traces under sequential
	// requests, land in DIR.
	profDir := os.Getenv("IOP_LOAD_PPROF")
	var edgeProf, nodeProf string
	edgeArgs := []string{"--config", e.config}
	nodeArgs := []string{"--log-level", "info"}
	if profDir != "" {
		if err := os.MkdirAll(profDir, 0o755); err != nil {
			t.Fatalf("IOP_LOAD_PPROF: %v", err)
		}
		edgeProf, nodeProf = freeAddr(t), freeAddr(t)
		edgeArgs = append(edgeArgs, "--pprof", edgeProf)
		nodeArgs = append(nodeArgs, "--pprof", nodeProf)
	}
	e.proc = start(t, "iop-edge", relayEnv(t), edgeArgs...)
	waitHealthy(t, e.url, e.proc)
	n := startNodeOpts(t, e, testToken, nodeOptions{args: nodeArgs, env: relayEnv(t)})
	waitNode(t, e, "n1")
	edgeCPU := func() time.Duration { return procCPU(t, e.cmd.Process.Pid) }
	nodeCPU := func() time.Duration { return procCPU(t, n.cmd.Process.Pid) }

	paths := []relayPath{{name: "direct", url: p.URL}}
	// frp's link to frps uses TLS by default (since v0.50); it follows the
	// iop link's mode so both relays pay for the same thing.
	frpURL, frpProcs, frpProf, frpSkip := startFRP(t, p.URL, mode != "off", profDir != "")
	if frpSkip == "" {
		paths = append(paths, relayPath{name: "frp", url: frpURL, cpu: func() time.Duration {
			return procCPU(t, frpProcs[0].cmd.Process.Pid) + procCPU(t, frpProcs[1].cmd.Process.Pid)
		}, sys: func() time.Duration {
			return procSys(t, frpProcs[0].cmd.Process.Pid) + procSys(t, frpProcs[1].cmd.Process.Pid)
		}})
	}
	paths = append(paths, relayPath{name: "iop", url: e.url, cpu: func() time.Duration { return edgeCPU() + nodeCPU() },
		sys: func() time.Duration { return procSys(t, e.cmd.Process.Pid) + procSys(t, n.cmd.Process.Pid) }})

	// Warm every path: connections, pools, and, at 32 concurrent, the 32
	// keep-alive connections each relay carries from then on.
	for _, pa := range paths {
		for i := 0; i < 50; i++ {
			if _, _, err := loadRequest(pa.url, "chat"); err != nil {
				t.Fatalf("%s: %v", pa.name, err)
			}
		}
		hammer(t, 32, 300*time.Millisecond, func() error { _, _, err := loadRequest(pa.url, "chat"); return err })
	}

	parts := os.Getenv("IOP_LOAD_PARTS")
	tunnel, runs := &loadResults{}, &loadResults{}
	began := time.Now()
	for round := 0; round < rounds; round++ {
		// Each round starts with another path, so none is always first
		// after a pause or always last.
		order := append(slices.Clone(paths[round%len(paths):]), paths[:round%len(paths)]...)
		if parts != "runs" {
			measureTunnel(t, tunnel, order)
		}
		if parts != "tunnel" {
			measureRuns(t, runs, e.url, edgeCPU, nodeCPU, round%2 == 1)
		}
	}
	elapsed := time.Since(began)
	// IOP_LOAD_SYSCALLS=1: after the rounds, each relay's system calls per
	// request (perf stat), frp's processes and then iop's.
	var syscalls string
	if os.Getenv("IOP_LOAD_SYSCALLS") != "" && parts != "runs" {
		var relays []countedRelay
		if frpSkip == "" {
			relays = append(relays, countedRelay{"frp", frpURL, []relayProc{{"frps", frpProcs[0].cmd.Process.Pid}, {"frpc", frpProcs[1].cmd.Process.Pid}}})
		}
		relays = append(relays, countedRelay{"iop", e.url, []relayProc{{"iop-edge", e.cmd.Process.Pid}, {"iop-node", n.cmd.Process.Pid}}})
		syscalls = syscallTable(t, relays)
	}

	if profDir != "" && parts != "runs" {
		if frpSkip == "" {
			profile(t, profDir, mode+"-chat-frp", frpProf, func() {
				hammer(t, 32, time.Duration(profileSeconds()+1)*time.Second, func() error { _, _, err := loadRequest(frpURL, "chat"); return err })
			})
			profile(t, profDir, mode+"-bulk-frp", frpProf, func() {
				hammer(t, 1, time.Duration(profileSeconds()+1)*time.Second, func() error { _, _, err := loadRequest(frpURL, fmt.Sprintf("bulk-%d", loadBulk)); return err })
			})
		}
		addrs := map[string]string{"edge": edgeProf, "node": nodeProf}
		profile(t, profDir, mode+"-chat", addrs, func() {
			hammer(t, 32, time.Duration(profileSeconds()+1)*time.Second, func() error { _, _, err := loadRequest(e.url, "chat"); return err })
		})
		profile(t, profDir, mode+"-bulk", addrs, func() {
			hammer(t, 1, time.Duration(profileSeconds()+1)*time.Second, func() error { _, _, err := loadRequest(e.url, fmt.Sprintf("bulk-%d", loadBulk)); return err })
		})
		// Execution traces under sequential requests show where a
		// request's time to first byte goes (go tool trace: scheduler
		// latency and network blocking profiles).
		traces(t, profDir, mode+"-seq", addrs, func() {
			hammer(t, 1, 3*time.Second, func() error { _, _, err := loadRequest(e.url, "chat"); return err })
		})
	}
	if profDir != "" && parts != "tunnel" {
		profile(t, profDir, mode+"-runs", map[string]string{"edge": edgeProf, "node": nodeProf}, func() {
			hammer(t, 32, time.Duration(profileSeconds()+1)*time.Second, func() error { _, err := loadRun(e.url, "echo"); return err })
		})
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\niop load compare, link tls.mode %s, %s; rounds: %d (%s), each measure on every path in one round, the starting path rotating\n",
		mode, time.Now().UTC().Format(time.RFC3339), rounds, elapsed.Round(time.Second))
	b.WriteString("values: median over the rounds (min–max); comparisons: median of the per-round ratios, or for latency the per-round added µs\n")
	if env := relayEnv(t); env != nil {
		fmt.Fprintf(&b, "both relays' processes (iop-edge, iop-node, frps, frpc) run with %s\n", env[0])
	}
	if frpSkip != "" {
		fmt.Fprintf(&b, "frp column SKIPPED: %s\n", frpSkip)
	} else {
		linkTLS := map[bool]string{true: "on (its default)", false: "off"}[mode != "off"]
		fmt.Fprintf(&b, "frp: frps + frpc %s, raw TCP proxy, link TLS %s, tcpMux on (its default)\n", frpVersion, linkTLS)
	}
	b.WriteString("\n")
	if parts != "runs" {
		b.WriteString(tunnel.table([]string{"direct", "frp", "iop"},
			[]string{"direct", "frp", "iop (edge + node)", "frp vs direct", "iop vs direct", "iop vs frp"},
			[][2]string{{"direct", "frp"}, {"direct", "iop"}, {"frp", "iop"}}))
		if syscalls != "" {
			b.WriteString("\n" + syscalls)
		}
	}
	if parts != "tunnel" {
		b.WriteString("\nruns (POST /v1/runs, exec target `cat`) against spawning the same child with stdin/stdout pipes from a Go process (this test), same round\n\n")
		b.WriteString(runs.table([]string{"run", "spawn"},
			[]string{"iop run", "one spawn", "run ÷ spawn"},
			[][2]string{{"spawn", "run"}}))
	}
	fmt.Print(b.String())
	if path := os.Getenv("IOP_LOAD_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = f.WriteString(b.String())
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			t.Errorf("IOP_LOAD_REPORT: %v", err)
		}
	}
}

// measureTunnel runs one round of the provider measures on every path in
// order and records them in r.
func measureTunnel(t *testing.T, r *loadResults, order []relayPath) {
	// Sequential time to first byte, request by request across the paths.
	ttfb := map[string][]time.Duration{}
	for i := 0; i < ttfbPerRound; i++ {
		for _, pa := range order {
			d, _, err := loadRequest(pa.url, "chat")
			if err != nil {
				t.Fatalf("%s: %v", pa.name, err)
			}
			ttfb[pa.name] = append(ttfb[pa.name], d)
		}
	}
	for _, pa := range order {
		r.add("sequential TTFB p50", usU, true, pa.name, usOf(pct(ttfb[pa.name], .5)))
	}
	for _, pa := range order {
		r.add("sequential TTFB p99", usU, true, pa.name, usOf(pct(ttfb[pa.name], .99)))
	}

	for _, conc := range []int{1, 8, 32} {
		for _, pa := range order {
			var c0, s0 time.Duration
			if pa.cpu != nil {
				c0, s0 = pa.cpu(), pa.sys()
			}
			rate, cnt := hammer(t, conc, rateCell, func() error { _, _, err := loadRequest(pa.url, "chat"); return err })
			r.add(fmt.Sprintf("requests/s at %d concurrent (%d-chunk SSE)", conc, loadChunks), rateU, false, pa.name, rate)
			if pa.cpu != nil && conc == 32 {
				r.add("relay CPU per request at 32 concurrent (relay processes' user+sys)", usU, false, pa.name,
					usOf(pa.cpu()-c0)/float64(cnt))
				r.add("of which system (kernel) CPU", usU, false, pa.name, usOf(pa.sys()-s0)/float64(cnt))
			}
		}
	}

	// Bulk: best of three per path, interleaved; the relay's CPU over all three.
	best := map[string]float64{}
	cpu := map[string]time.Duration{}
	for i := 0; i < 3; i++ {
		for _, pa := range order {
			var c0 time.Duration
			if pa.cpu != nil {
				c0 = pa.cpu()
			}
			start := time.Now()
			_, got, err := loadRequest(pa.url, fmt.Sprintf("bulk-%d", loadBulk))
			if err != nil || got != loadBulk {
				t.Fatalf("%s bulk: %d bytes, %v", pa.name, got, err)
			}
			best[pa.name] = max(best[pa.name], float64(loadBulk)/time.Since(start).Seconds()/1e6)
			if pa.cpu != nil {
				cpu[pa.name] += pa.cpu() - c0
			}
		}
	}
	for _, pa := range order {
		r.add("bulk SSE body, one stream (best of 3, 16 MiB)", mbU, false, pa.name, best[pa.name])
	}
	for _, pa := range order {
		if pa.cpu != nil {
			r.add("relay CPU per MB, bulk", usU, false, pa.name, usOf(cpu[pa.name])/(3*loadBulk/1e6))
		}
	}
}

// loadRun posts one run and returns its output, prefixed with the time the
// first delta arrived ("unixnano|").
func loadRun(url, target string) (string, error) {
	body := []byte(fmt.Sprintf(`{"adapter":"exec","target":%q,"input":"hello load\n"}`, target))
	resp, err := loadClient.Post(url+"/v1/runs", "application/json", bytes.NewReader(body))
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

func echoRun(url string) error {
	got, err := loadRun(url, "echo")
	if err == nil && !strings.HasSuffix(got, "|hello load\n") {
		err = fmt.Errorf("echo run returned %q", got)
	}
	return err
}

// spawnCat is the baseline a run is held against: the same child (`cat`),
// its input on a stdin pipe and its output read from a stdout pipe, started
// with the process attributes the node's exec adapter uses
// (adapters/runtime/spawn: a session of its own, so its own process group,
// killed with its parent).
func spawnCat() error {
	cmd := exec.Command("cat")
	cmd.Stdin = strings.NewReader("hello load\n")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return err
	}
	if out.String() != "hello load\n" {
		return fmt.Errorf("cat returned %q", out.String())
	}
	return nil
}

// rusageCPU is user+system CPU of this process (RUSAGE_SELF) or of its
// waited-for children (RUSAGE_CHILDREN).
func rusageCPU(t *testing.T, who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measureRuns runs one round of the run measures and of the spawn baseline
// (spawnFirst picks which goes first) and records them in r.
func measureRuns(t *testing.T, r *loadResults, url string, edgeCPU, nodeCPU func() time.Duration, spawnFirst bool) {
	var spawnCPU float64 // parent + child, µs per spawn
	spawns := func() {
		self0, kids0 := rusageCPU(t, syscall.RUSAGE_SELF), rusageCPU(t, syscall.RUSAGE_CHILDREN)
		rate, cnt := hammer(t, 32, runsCell, spawnCat)
		self, kids := usOf(rusageCPU(t, syscall.RUSAGE_SELF)-self0)/float64(cnt), usOf(rusageCPU(t, syscall.RUSAGE_CHILDREN)-kids0)/float64(cnt)
		spawnCPU = self + kids
		r.add("runs/s vs spawns/s at 32 concurrent", rateU, false, "spawn", rate)
		r.add("spawn CPU: parent side (the Go process)", usU, false, "spawn", self)
		r.add("spawn CPU: child side (cat's exec, start, copy)", usU, false, "spawn", kids)
		var wall []time.Duration
		for i := 0; i < seqRuns; i++ {
			s := time.Now()
			if err := spawnCat(); err != nil {
				t.Fatal(err)
			}
			wall = append(wall, time.Since(s))
		}
		r.add("wall per run vs per spawn, sequential p50", usU, false, "spawn", usOf(pct(wall, .5)))
	}
	var edgePer, nodePer float64
	doRuns := func() {
		e0, n0 := edgeCPU(), nodeCPU()
		rate, cnt := hammer(t, 32, runsCell, func() error { return echoRun(url) })
		edgePer, nodePer = usOf(edgeCPU()-e0)/float64(cnt), usOf(nodeCPU()-n0)/float64(cnt)
		r.add("runs/s vs spawns/s at 32 concurrent", rateU, false, "run", rate)
		var wall []time.Duration
		for i := 0; i < seqRuns; i++ {
			s := time.Now()
			if err := echoRun(url); err != nil {
				t.Fatal(err)
			}
			wall = append(wall, time.Since(s))
		}
		r.add("wall per run vs per spawn, sequential p50", usU, false, "run", usOf(pct(wall, .5)))
	}
	if spawnFirst {
		spawns()
		doRuns()
	} else {
		doRuns()
		spawns()
	}
	// Each run's own CPU per process against one whole spawn (parent + child).
	r.add("edge CPU per run vs spawn CPU (parent + child)", usU, false, "run", edgePer)
	r.add("edge CPU per run vs spawn CPU (parent + child)", usU, false, "spawn", spawnCPU)
	r.add("node CPU per run (children excluded) vs spawn CPU", usU, false, "run", nodePer)
	r.add("node CPU per run (children excluded) vs spawn CPU", usU, false, "spawn", spawnCPU)
	r.add("edge + node CPU per run vs spawn CPU", usU, false, "run", edgePer+nodePer)
	r.add("edge + node CPU per run vs spawn CPU", usU, false, "spawn", spawnCPU)

	// Event latency: the child prints its clock; the caller notes when the
	// output event arrives (same host, same clock).
	var lat []time.Duration
	for i := 0; i < seqRuns; i++ {
		got, err := loadRun(url, "stamp")
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
	r.add("event latency p50, child prints → caller receives", usU, true, "run", usOf(pct(lat, .5)))
	r.add("event latency p99", usU, true, "run", usOf(pct(lat, .99)))
}

// frpVersion is the frp that `make frp` (scripts/frp.sh) builds.
const frpVersion = "v0.61.0"

// frpDir is where `make frp` puts frps and frpc: $IOP_FRP_DIR, or the cache
// scripts/frp.sh defaults to.
func frpDir() string {
	if d := os.Getenv("IOP_FRP_DIR"); d != "" {
		return d
	}
	cache, _ := os.UserCacheDir() // $XDG_CACHE_HOME, else $HOME/.cache, as the Makefile has it
	return filepath.Join(cache, "iop", "frp-"+frpVersion)
}

// startFRP starts frps and frpc on loopback, frpc's one "tcp" proxy carrying
// raw TCP from a frps port to provider, and returns that port's URL and the
// two processes (frps, frpc). Without the binaries it returns why instead.
// With pprof, both serve net/http/pprof on loopback (their webServer's
// pprofEnable) at the addresses in prof, keyed "frps" and "frpc".
func startFRP(t *testing.T, provider string, linkTLS, pprof bool) (url string, procs []*proc, prof map[string]string, skip string) {
	dir := frpDir()
	for _, bin := range []string{"frps", "frpc"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", nil, nil, fmt.Sprintf("no %s in %s (`make frp` builds frps and frpc %s there; IOP_FRP_DIR points elsewhere)", bin, dir, frpVersion)
		}
	}
	_, localPort, _ := net.SplitHostPort(strings.TrimPrefix(provider, "http://"))
	bind, remote := freeAddr(t), freeAddr(t)
	_, bindPort, _ := net.SplitHostPort(bind)
	_, remotePort, _ := net.SplitHostPort(remote)
	cfg := t.TempDir()
	// proxyBindAddr defaults to bindAddr: the proxy's port is loopback too.
	frps := fmt.Sprintf(`bindAddr = "127.0.0.1"
bindPort = %s
auth.token = %q
log.level = "warn"
`, bindPort, testToken)
	frpc := fmt.Sprintf(`serverAddr = "127.0.0.1"
serverPort = %s
auth.token = %q
loginFailExit = true
log.level = "warn"
transport.tls.enable = %t

[[proxies]]
name = "bench"
type = "tcp"
localIP = "127.0.0.1"
localPort = %s
remotePort = %s
`, bindPort, testToken, linkTLS, localPort, remotePort)
	if pprof {
		prof = map[string]string{"frps": freeAddr(t), "frpc": freeAddr(t)}
		web := func(addr string) string {
			_, port, _ := net.SplitHostPort(addr)
			return fmt.Sprintf("webServer.addr = \"127.0.0.1\"\nwebServer.port = %s\nwebServer.pprofEnable = true\n", port)
		}
		// Top-level keys go before the first [[proxies]] table.
		frps += web(prof["frps"])
		frpc = web(prof["frpc"]) + frpc
	}
	for name, body := range map[string]string{"frps.toml": frps, "frpc.toml": frpc} {
		if err := os.WriteFile(filepath.Join(cfg, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := startBinary(t, filepath.Join(dir, "frps"), "-c", filepath.Join(cfg, "frps.toml"))
	waitListening(t, bind, s)
	c := startBinary(t, filepath.Join(dir, "frpc"), "-c", filepath.Join(cfg, "frpc.toml"))
	url = "http://" + remote
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, _, err := loadRequest(url, "chat")
		if err == nil {
			return url, []*proc{s, c}, prof, ""
		}
		for _, p := range []*proc{s, c} {
			if p.exited() {
				t.Fatalf("%s exited: %v\n%s", p.name, p.err, p.out.String())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("frp proxy %s never answered: %v\nfrps:\n%s\nfrpc:\n%s", url, err, s.out.String(), c.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitListening(t *testing.T, addr string, p *proc) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if p.exited() {
			t.Fatalf("%s exited: %v\n%s", p.name, p.err, p.out.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never listened on %s: %v\n%s", p.name, addr, err, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startBinary starts a program that is not one of iop's (frp), the way the
// harness's start does: its own process group, output kept, stopped at
// cleanup.
func startBinary(t *testing.T, path string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), relayEnv(t)...)
	out := &lockedbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	p := &proc{name: filepath.Base(path), cmd: cmd, out: out, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM, 5*time.Second)
		if t.Failed() {
			t.Logf("---- %s output ----\n%s", p.name, out.String())
		}
	})
	return p
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
		go fetch(who+".cpu.pprof", "http://"+a+"/debug/pprof/profile?seconds="+strconv.Itoa(profileSeconds()))
	}
	load()
	wg.Wait()
	for who, a := range addrs {
		wg.Add(1)
		go fetch(who+".allocs.pprof", "http://"+a+"/debug/pprof/allocs")
	}
	wg.Wait()
}

// profileSeconds is how long a CPU profile lasts, and the load under it:
// $IOP_LOAD_PPROF_SECONDS (1–120), 4 by default (a longer one has more
// samples).
func profileSeconds() int {
	if n, err := strconv.Atoi(os.Getenv("IOP_LOAD_PPROF_SECONDS")); err == nil && n >= 1 && n <= 120 {
		return n
	}
	return 4
}

// traces saves a 2-second execution trace of each process while load runs.
func traces(t *testing.T, dir, mode string, addrs map[string]string, load func()) {
	var wg sync.WaitGroup
	for who, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(500 * time.Millisecond) // into the load
			resp, err := http.Get("http://" + a + "/debug/pprof/trace?seconds=2")
			if err != nil {
				t.Errorf("trace %s: %v", who, err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if err := os.WriteFile(fmt.Sprintf("%s/%s-%s.trace", dir, mode, who), b, 0o644); err != nil {
				t.Error(err)
			}
		}()
	}
	load()
	wg.Wait()
}

// TestLoadReportFormat checks the report's arithmetic: medians over rounds
// and comparisons taken round by round.
func TestLoadReportFormat(t *testing.T) {
	r := &loadResults{}
	for _, v := range [][2]float64{{100, 300}, {200, 500}, {400, 1200}} {
		r.add("rate", rateU, false, "direct", v[0])
		r.add("rate", rateU, false, "iop", v[1])
		r.add("ttfb", usU, true, "direct", v[0])
		r.add("ttfb", usU, true, "iop", v[1])
	}
	got := r.table([]string{"direct", "frp", "iop"}, []string{"d", "f", "i", "i vs d", "i vs f"}, [][2]string{{"direct", "iop"}, {"frp", "iop"}})
	want := "| measure | d | f | i | i vs d | i vs f |\n|---|---|---|---|---|---|\n" +
		"| rate | 200 (100–400) | — | 500 (300–1200) | 3.00× (2.50–3.00) | — |\n" +
		"| ttfb | 200 µs (100–400) | — | 500 µs (300–1200) | +300 µs (+200–+800) | — |\n"
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median of 1..4 = %v, want 2.5", m)
	}
}
