package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A node whose edge is not there retries at every backoff step but warns
// once (it used to warn at every attempt, for as long as the edge stayed
// away): the attempts after the first go to debug. When the edge comes,
// the registration line says how long the node was without one and how
// many attempts failed.
func TestNodeWarnsOnceWhileItsEdgeIsAway(t *testing.T) {
	t.Parallel()
	e := &edge{transport: freeAddr(t), config: filepath.Join(t.TempDir(), "edge.yaml")}
	httpAddr := freeAddr(t)
	e.url = "http://" + httpAddr
	if err := os.WriteFile(e.config, []byte(edgeConfig(e.transport, httpAddr, defaultNodes(1))), 0o600); err != nil {
		t.Fatal(err)
	}
	e.pin = printCAPin(t, e.config)
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(cfg, []byte("reconnect: {min: 1ms, max: 5ms}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Nothing listens at e.transport yet: every attempt is refused.
	n := startNodeOpts(t, e, testToken, nodeOptions{args: []string{"--config", cfg}})
	const attempts = 100
	failed := func() int {
		return strings.Count(n.out.String(), `msg="cannot connect to the edge; retrying"`)
	}
	for deadline := time.Now().Add(30 * time.Second); failed() < attempts; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) || n.exited() {
			t.Fatalf("fewer than %d failed attempts logged:\n%s", attempts, n.out.String())
		}
	}
	var warns []string
	for _, line := range strings.Split(n.out.String(), "\n") {
		if strings.Contains(line, "level=WARN") {
			warns = append(warns, line)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "cannot connect to the edge") || !strings.Contains(warns[0], "connection refused") {
		t.Fatalf("%d warnings over %d+ failed attempts, want one:\n%s", len(warns), attempts, strings.Join(warns, "\n"))
	}

	e.proc = startEdgeProc(t, e.config)
	waitHealthy(t, e.url, e.proc)
	waitNode(t, e, "n1")
	m := regexp.MustCompile(`msg="registered with edge" .*down_for=\S+ failed_attempts=(\d+)`).FindStringSubmatch(n.out.String())
	if m == nil {
		t.Fatalf("no registration line saying how long the node was away:\n%s", n.out.String())
	}
	if k, _ := strconv.Atoi(m[1]); k < attempts {
		t.Fatalf("the registration counts %d failed attempts, want at least %d:\n%s", k, attempts, m[0])
	}
}
