// Package e2e drives the real iop-edge, iop-node and iop binaries as
// processes on loopback, the way a user would: HTTP, SSE, the CLI.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/lockedbuf"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "iop-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	build := exec.Command("go", "build", "-o", dir+"/", "iop/cmd/iop-edge", "iop/cmd/iop-node", "iop/cmd/iop")
	build.Dir = "../.."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building binaries:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running binary whose output is kept for failure reports.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *lockedbuf.Buffer
	done chan struct{}
	err  error
}

func start(t testing.TB, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = append(os.Environ(), env...)
	out := &lockedbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM, 5*time.Second)
		if t.Failed() {
			t.Logf("---- %s output ----\n%s", name, out.String())
		}
	})
	return p
}

// stop signals the process and waits, killing it after grace.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) waitExit(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%s did not exit within %v; output:\n%s", p.name, within, p.out.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

func freeAddr(t testing.TB) string {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		// The kernel may hand a port just closed out again; one given to
		// another caller of this process (an edge's second listener, a
		// parallel test) is not used twice.
		if _, taken := handedOut.LoadOrStore(addr, true); !taken {
			return addr
		}
	}
}

// handedOut holds every address freeAddr returned in this process.
var handedOut sync.Map

// edge is a running iop-edge with its addresses and config file.
type edge struct {
	*proc
	transport string
	url       string
	config    string
	// pin is the node-link CA pin (iop-edge --print-ca-pin) that nodes get
	// as --ca-pin; "" for an edge with transport.tls.mode off.
	pin string
}

const testToken = "e2e-token-0001"

// defaultNodes is the nodes[] section most tests use.
func defaultNodes(maxConc int) string {
	return fmt.Sprintf(`
  - id: n1
    token: %s
    adapters:
      - name: exec
        type: exec
        max_concurrency: %d
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
          count: {command: ["sh", "-c", "for i in 1 2 3 4 5; do echo line$i; sleep 0.05; done"]}
          fail: {command: ["sh", "-c", "echo partial; echo boom >&2; exit 3"]}
          sleep: {command: ["sh", "-c", "echo started; exec sleep 300"]}
  - id: n2
    token: e2e-token-0002
    adapters:
      - name: exec
        type: exec
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
`, testToken, maxConc)
}

func edgeConfig(transport, httpAddr, nodes string) string {
	return edgeConfigTLS(transport, httpAddr, "", nodes)
}

// edgeConfigTLS is edgeConfig with a transport.tls section; tls is its body
// in YAML flow form ("{mode: off}"), "" for the default (auto).
func edgeConfigTLS(transport, httpAddr, tls, nodes string) string {
	if tls != "" {
		tls = "\n  tls: " + tls
	}
	return fmt.Sprintf(`transport:
  listen: %q
  heartbeat_interval: 500ms
  heartbeat_timeout: 2s%s
http:
  listen: %q
log:
  level: debug
nodes:%s`, transport, tls, httpAddr, nodes)
}

// edgeOptions adjusts startEdgeOpts.
type edgeOptions struct {
	// tls is transport.tls in YAML flow form, e.g. "{mode: off}" or
	// "{client_ca_file: /x/ca.pem}"; "" keeps the default, auto.
	tls string
}

// startEdge starts an edge in the default TLS mode (auto) with nodes as
// its nodes[] section and waits until it is healthy.
func startEdge(t testing.TB, nodes string) *edge {
	t.Helper()
	return startEdgeOpts(t, nodes, edgeOptions{})
}

func startEdgeOpts(t testing.TB, nodes string, o edgeOptions) *edge {
	t.Helper()
	e := &edge{transport: freeAddr(t), config: filepath.Join(t.TempDir(), "edge.yaml")}
	httpAddr := freeAddr(t)
	e.url = "http://" + httpAddr
	if err := os.WriteFile(e.config, []byte(edgeConfigTLS(e.transport, httpAddr, o.tls, nodes)), 0o600); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(o.tls, "mode: off") {
		e.pin = printCAPin(t, e.config)
	}
	e.proc = startEdgeProc(t, e.config)
	waitHealthy(t, e.url, e.proc)
	return e
}

// nodePin is e.pin, or for an edge a test assembled itself (an edge{}
// literal and startEdgeProc) the pin read from its config, so its nodes
// trust it like those of startEdge; "" for a tls.mode off edge.
func (e *edge) nodePin(t testing.TB) string {
	t.Helper()
	if e.pin != "" || e.config == "" {
		return e.pin
	}
	if b, err := os.ReadFile(e.config); err == nil && !strings.Contains(string(b), "mode: off") {
		e.pin = printCAPin(t, e.config)
	}
	return e.pin
}

// printCAPin runs iop-edge --print-ca-pin, as an operator (or make run) does
// before starting nodes; in auto mode it creates the CA the edge will use.
func printCAPin(t testing.TB, config string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "iop-edge"), "--config", config, "--print-ca-pin").CombinedOutput()
	pin := strings.TrimSpace(string(out))
	if err != nil || !strings.HasPrefix(pin, "sha256:") || len(pin) != len("sha256:")+64 {
		t.Fatalf("iop-edge --print-ca-pin: %v: %q", err, out)
	}
	return pin
}

func startEdgeProc(t testing.TB, config string) *proc {
	return start(t, "iop-edge", nil, "--config", config)
}

func waitHealthy(t testing.TB, url string, p *proc) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if p.exited() {
			t.Fatalf("%s exited early:\n%s", p.name, p.out.String())
		}
		resp, err := http.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("edge not healthy at %s:\n%s", url, p.out.String())
}

type node struct {
	*proc
	db string
}

// startNode starts a node for e that trusts it by its pin (--insecure for
// a plaintext edge). The token goes in IOP_NODE_TOKEN, never on the command
// line; extraEnv comes after it and may override it.
func startNode(t testing.TB, e *edge, token string, extraEnv ...string) *node {
	t.Helper()
	return startNodeOpts(t, e, token, nodeOptions{env: extraEnv})
}

// nodeOptions adjusts startNodeOpts.
type nodeOptions struct {
	env []string
	// trust replaces the default trust flags (--ca-pin e.pin); a non-nil
	// empty slice passes none.
	trust []string
	// edge replaces e.transport as the address dialed (a proxy).
	edge string
	// args are appended (--cert, --key, …).
	args []string
	// db replaces a fresh database file (a node restarted on its own).
	db string
	// bin replaces "iop-node": another build of the node, copied into
	// binDir under this name (the load tool's before/after comparison).
	bin string
}

func startNodeOpts(t testing.TB, e *edge, token string, o nodeOptions) *node {
	t.Helper()
	db := o.db
	if db == "" {
		db = filepath.Join(t.TempDir(), "node.db")
	}
	addr := e.transport
	if o.edge != "" {
		addr = o.edge
	}
	args := []string{"--edge", addr, "--db", "file:" + db + "?cache=shared&mode=rwc", "--log-level", "debug"}
	switch pin := e.nodePin(t); {
	case o.trust != nil:
		args = append(args, o.trust...)
	case pin != "":
		args = append(args, "--ca-pin", pin)
	default:
		args = append(args, "--insecure")
	}
	args = append(args, o.args...)
	env := append([]string{"IOP_NODE_TOKEN=" + token}, o.env...)
	bin := "iop-node"
	if o.bin != "" {
		bin = o.bin
	}
	p := start(t, bin, env, args...)
	return &node{proc: p, db: db}
}

type nodeList struct {
	Nodes []struct {
		ID string `json:"id"`
		// Connected is false for a node of the config that is not connected.
		Connected bool `json:"connected"`
		Draining  bool `json:"draining"`
		Adapters  []struct {
			Name     string `json:"name"`
			InFlight int    `json:"in_flight"`
		} `json:"adapters"`
	} `json:"nodes"`
}

// connected returns the ids of the connected nodes.
func (l nodeList) connected() []string {
	var ids []string
	for _, n := range l.Nodes {
		if n.Connected {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

func waitNode(t testing.TB, e *edge, id string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		var nl nodeList
		if getJSON(e.url+"/v1/nodes", &nl) == nil {
			if slices.Contains(nl.connected(), id) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("node %s never connected; edge output:\n%s", id, e.out.String())
}

func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func postJSON(t *testing.T, url string, body any) (*http.Response, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp, out
}

// sseEvent is one parsed server-sent event.
type sseEvent struct {
	Event string
	Data  string
}

// runEvent is the JSON of a run event on the API.
type runEvent struct {
	RunID    string          `json:"run_id"`
	Node     string          `json:"node"`
	Seq      uint64          `json:"seq"`
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	Metadata json.RawMessage `json:"metadata"`
	Usage    *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// sseReader reads events from a text/event-stream body.
type sseReader struct {
	r *bufio.Reader
}

func newSSE(r io.Reader) *sseReader { return &sseReader{r: bufio.NewReader(r)} }

func (s *sseReader) Next() (sseEvent, error) {
	var ev sseEvent
	var data []string
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if ev.Event != "" || len(data) > 0 {
				ev.Data = strings.Join(data, "\n")
				return ev, nil
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event:"):
			ev.Event = strings.TrimSpace(line[len("event:"):])
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(line[len("data:"):], " "))
		}
	}
}

// startRun posts a run and returns the open SSE response.
func startRun(t *testing.T, ctx context.Context, e *edge, body map[string]any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/runs", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/runs: %v", err)
	}
	return resp
}

// collectRun reads run events until the stream ends.
func collectRun(t *testing.T, resp *http.Response) []runEvent {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("run: status %d: %s", resp.StatusCode, b)
	}
	var evs []runEvent
	r := newSSE(resp.Body)
	for {
		ev, err := r.Next()
		if err != nil {
			return evs
		}
		var re runEvent
		if err := json.Unmarshal([]byte(ev.Data), &re); err != nil {
			t.Fatalf("bad event data %q: %v", ev.Data, err)
		}
		if re.Type != ev.Event {
			t.Fatalf("event name %q but type %q", ev.Event, re.Type)
		}
		evs = append(evs, re)
	}
}

// checkWellFormed asserts seq 1..n, start first, exactly one terminal, last.
func checkWellFormed(t *testing.T, evs []runEvent) {
	t.Helper()
	if len(evs) == 0 {
		t.Fatal("no events")
	}
	terminals := 0
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d: %+v", i, ev.Seq, evs)
		}
		switch ev.Type {
		case "complete", "error", "cancelled":
			terminals++
			if i != len(evs)-1 {
				t.Fatalf("terminal %s is not last: %+v", ev.Type, evs)
			}
		}
	}
	if terminals != 1 {
		t.Fatalf("%d terminal events: %+v", terminals, evs)
	}
}

// busWatcher collects /v1/events in the background.
type busWatcher struct {
	mu     sync.Mutex
	events []map[string]any
	cancel context.CancelFunc
	done   chan struct{}
}

func watchBus(t *testing.T, e *edge) *busWatcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET /v1/events: %v", err)
	}
	w := &busWatcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer resp.Body.Close()
		r := newSSE(resp.Body)
		for {
			ev, err := r.Next()
			if err != nil {
				return
			}
			var m map[string]any
			if json.Unmarshal([]byte(ev.Data), &m) == nil {
				w.mu.Lock()
				w.events = append(w.events, m)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// waitFor polls the collected bus events until match finds one.
func (w *busWatcher) waitFor(t *testing.T, within time.Duration, what string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	return w.waitFrom(t, 0, within, what, match)
}

// waitFrom is waitFor over the events after the first from. match runs
// under the watcher's lock and must not call back into it.
func (w *busWatcher) waitFrom(t *testing.T, from int, within time.Duration, what string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		for _, ev := range w.events[min(from, len(w.events)):] {
			if match(ev) {
				w.mu.Unlock()
				return ev
			}
		}
		w.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no bus event %s within %v", what, within)
	return nil
}

// cli runs the iop CLI against e and returns stdout, stderr and exit code.
func cli(t *testing.T, e *edge, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "iop"), args...)
	cmd.Env = append(os.Environ(), "IOP_EDGE="+e.url)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("iop %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return stdout.String(), stderr.String(), code
}

func (w *busWatcher) snapshot() []map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]map[string]any(nil), w.events...)
}
