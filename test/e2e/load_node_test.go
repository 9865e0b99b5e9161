//go:build load

package e2e

// A before/after comparison of the node alone, for changes on the node's
// side of the provider tunnel (docs/benchmarks.md, "What the profiles
// showed", item 11): one edge, two nodes serving the same provider, node
// "after" built from this tree and node "before" from
// IOP_LOAD_NODE_BEFORE (an iop-node binary built from an earlier commit).
// Requests pin their node with X-IOP-Node, so both share the edge, the
// provider and the machine's noise; each round measures both, the first
// alternating. Run:
//
//	git archive <commit> | tar -x -C /tmp/before && (cd /tmp/before && go build -o bin/ ./cmd/iop-node)
//	IOP_LOAD_NODE_BEFORE=/tmp/before/bin/iop-node go test -tags load -run TestLoadNodeBeforeAfter -v ./test/e2e/
//
// IOP_LOAD_ROUNDS (default 5) and IOP_LOAD_MODES=auto (link TLS; default
// off) apply as in the load tool.

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLoadNodeBeforeAfter(t *testing.T) {
	before := os.Getenv("IOP_LOAD_NODE_BEFORE")
	if before == "" {
		t.Skip("IOP_LOAD_NODE_BEFORE (an iop-node binary to compare with) is not set")
	}
	b, err := os.ReadFile(before)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(binDir, "iop-node-before"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	rounds := 5
	if s := os.Getenv("IOP_LOAD_ROUNDS"); s != "" {
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			t.Fatalf("IOP_LOAD_ROUNDS=%q: want a positive number", s)
		}
	}
	tls := "{mode: off}"
	if os.Getenv("IOP_LOAD_MODES") == "auto" {
		tls = ""
	}

	p := loadProvider(t)
	var nodes strings.Builder
	for _, id := range []string{"after", "before"} {
		fmt.Fprintf(&nodes, `
  - id: %s
    token: %s-%s
    providers:
      - {name: bench, type: openai, base_url: %q, models: [chat]}`, id, testToken, id, p.URL)
	}
	e := &edge{transport: freeAddr(t), config: t.TempDir() + "/edge.yaml"}
	httpAddr := freeAddr(t)
	e.url = "http://" + httpAddr
	cfg := strings.Replace(edgeConfigTLS(e.transport, httpAddr, tls, nodes.String()), "level: debug", "level: info", 1)
	if err := os.WriteFile(e.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	e.proc = start(t, "iop-edge", nil, "--config", e.config)
	waitHealthy(t, e.url, e.proc)
	procs := map[string]*node{
		"after":  startNodeOpts(t, e, testToken+"-after", nodeOptions{args: []string{"--log-level", "info"}}),
		"before": startNodeOpts(t, e, testToken+"-before", nodeOptions{args: []string{"--log-level", "info"}, bin: "iop-node-before"}),
	}
	waitNode(t, e, "after")
	waitNode(t, e, "before")
	names := []string{"before", "after"}
	req := func(id string) error { _, err := pinnedRequest(e.url, id); return err }
	for _, id := range names {
		for i := 0; i < 50; i++ {
			if err := req(id); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
		}
		hammer(t, 32, 300*time.Millisecond, func() error { return req(id) })
	}

	type measure struct{ ttfb, cpu, edgeCPU, rps []float64 }
	m := map[string]*measure{"before": {}, "after": {}}
	var ttfbRatio, cpuRatio []float64
	for round := 0; round < rounds; round++ {
		order := names
		if round%2 == 1 {
			order = []string{"after", "before"}
		}
		seq := map[string][]time.Duration{}
		for i := 0; i < 300; i++ {
			for _, id := range order {
				d, err := pinnedRequest(e.url, id)
				if err != nil {
					t.Fatalf("%s: %v", id, err)
				}
				seq[id] = append(seq[id], d)
			}
		}
		cpu := map[string]float64{}
		for _, id := range order {
			pid := procs[id].cmd.Process.Pid
			c0, e0 := procCPU(t, pid), procCPU(t, e.cmd.Process.Pid)
			rps, n := hammer(t, 32, 3*time.Second, func() error { return req(id) })
			cpu[id] = usOf(procCPU(t, pid)-c0) / float64(n)
			m[id].edgeCPU = append(m[id].edgeCPU, usOf(procCPU(t, e.cmd.Process.Pid)-e0)/float64(n))
			m[id].rps = append(m[id].rps, rps)
			m[id].cpu = append(m[id].cpu, cpu[id])
			m[id].ttfb = append(m[id].ttfb, usOf(pct(seq[id], .5)))
		}
		ttfbRatio = append(ttfbRatio, usOf(pct(seq["after"], .5))-usOf(pct(seq["before"], .5)))
		cpuRatio = append(cpuRatio, cpu["after"]/cpu["before"])
	}
	med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	span := func(v []float64) string {
		return fmt.Sprintf("%.0f (%.0f–%.0f)", med(v), slices.Min(v), slices.Max(v))
	}
	var r strings.Builder
	fmt.Fprintf(&r, "\nnode before/after, link tls %s, %s; %d rounds; one edge, both nodes, X-IOP-Node pins each request; medians (min–max)\n\n",
		map[bool]string{true: "off", false: "auto"}[tls != ""], time.Now().UTC().Format(time.RFC3339), rounds)
	r.WriteString("| measure | before | after | after vs before (median per round) |\n|---|---|---|---|\n")
	fmt.Fprintf(&r, "| sequential TTFB p50 through the edge (µs) | %s | %s | %+.0f µs |\n", span(m["before"].ttfb), span(m["after"].ttfb), med(ttfbRatio))
	fmt.Fprintf(&r, "| node CPU per request at 32 concurrent (µs) | %s | %s | %.2f× |\n", span(m["before"].cpu), span(m["after"].cpu), med(cpuRatio))
	fmt.Fprintf(&r, "| edge CPU per request, same edge (µs) | %s | %s | — |\n", span(m["before"].edgeCPU), span(m["after"].edgeCPU))
	fmt.Fprintf(&r, "| requests/s at 32 concurrent | %s | %s | — |\n", span(m["before"].rps), span(m["after"].rps))
	fmt.Print(r.String())
}

// pinnedRequest is loadRequest's chat request pinned to node id.
func pinnedRequest(url, id string) (time.Duration, error) {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
		bytes.NewReader([]byte(`{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}]}`)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Bench-Model", "chat")
	req.Header.Set("X-IOP-Node", id)
	start := time.Now()
	resp, err := loadClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.ReadFull(resp.Body, make([]byte, 1)); err != nil {
		return 0, err
	}
	d := time.Since(start)
	_, err = io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return d, err
}
