package transport

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"iop/adapters/tlsca"
	"iop/domain"
	"iop/ports"
)

// What an idle node costs, both ends together: BenchmarkIdleNodes (issue 10,
// docs/benchmarks.md "Many idle nodes").

// defaultIdleNodes is the number of idle nodes per measurement, issue 10's
// figure; IOP_IDLE_NODES overrides it.
const defaultIdleNodes = 10000

// idleQuiet is how long a measurement waits after the last frame before it
// settles: longer than a writer lingers (it ends after one to two
// writerLinger), so what is measured is a link with no frame in flight.
const idleQuiet = 500 * time.Millisecond

// idleEdge and idleNode are the smallest handlers: the fakes record every
// call on channels of fixed capacity, which would fill over repeated runs
// and would add their own memory to the per-node figure.
// idleEdge keeps the links it admitted, so the benchmark can exchange a
// heartbeat on each.
type idleEdge struct {
	registered, disconnected atomic.Int64
	mu                       sync.Mutex
	links                    []*Conn
}

func (e *idleEdge) Register(_ context.Context, token string, _ domain.NodeInfo, _ string, link ports.NodeLink) (domain.NodeConfig, error) {
	e.mu.Lock()
	e.links = append(e.links, link.(*edgeLink).conn)
	e.mu.Unlock()
	e.registered.Add(1)
	return domain.NodeConfig{NodeID: token, Version: 1}, nil
}

// Disconnected forgets the link, so a node that reconnected (a handshake
// that timed out on a loaded machine) is not counted twice.
func (e *idleEdge) Disconnected(_ string, link ports.NodeLink, _ string) {
	e.disconnected.Add(1)
	c := link.(*edgeLink).conn
	e.mu.Lock()
	if i := slices.Index(e.links, c); i >= 0 {
		e.links = slices.Delete(e.links, i, i+1)
	}
	e.mu.Unlock()
}
func (e *idleEdge) HandshakeFailed(string, string)  {}
func (e *idleEdge) HandshakeFailedUnreported()      {}
func (e *idleEdge) Draining(string, ports.NodeLink) {}

type idleNode struct{ connected atomic.Int64 }

func (*idleNode) ApplyConfig(context.Context, domain.NodeConfig) error           { return nil }
func (*idleNode) ExecuteRun(domain.RunRequest, ports.RunOutput)                  {}
func (*idleNode) CancelRun(context.Context, string, string) error                { return nil }
func (*idleNode) TerminateSession(context.Context, string, string, string) error { return nil }
func (*idleNode) RunCommand(context.Context, string, []byte, func([]byte) error) ([]byte, error) {
	return nil, nil
}
func (*idleNode) OpenTunnel(context.Context, domain.TunnelRequest, io.Reader, ports.TunnelSink) {}

// memSnap is what one process holds at one moment.
type memSnap struct {
	heap, stack uint64
	goroutines  int
}

// snapshot settles the process (settle) and reads its heap, stacks and
// goroutines.
func snapshot() memSnap {
	settle()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memSnap{heap: m.HeapAlloc, stack: m.StackInuse, goroutines: runtime.NumGoroutine()}
}

// sideCost is what one process added for n connections, in all (not yet
// per node).
type sideCost struct {
	Heap       float64 `json:"heap"`
	Stack      float64 `json:"stack"`
	Goroutines float64 `json:"goroutines"`
}

func costBetween(before, after memSnap) sideCost {
	return sideCost{
		Heap:       float64(after.heap) - float64(before.heap),
		Stack:      float64(after.stack) - float64(before.stack),
		Goroutines: float64(after.goroutines - before.goroutines),
	}
}

// idleCost is one measurement: what the edge's process and the nodes'
// process added (the same process in the in-process mode: all of it is
// counted as edge).
type idleCost struct{ edge, node sideCost }

// settle runs the garbage collector several times. Each cycle also halves
// goroutine stacks that use under a quarter of their size, as a live
// process's periodic collections do over the minutes an idle link lasts:
// what the stacks settle at is the idle cost, not what the handshake needed
// for a moment (a 32 KiB stack takes three cycles to come down to 4 KiB).
func settle() {
	for range 5 {
		runtime.GC()
	}
}

// writeProfiles writes the heap profile (PREFIX-name.heap; go tool pprof
// -sample_index=inuse_space) and the goroutine stacks (PREFIX-name.goroutines)
// when IOP_IDLE_PROFILE=PREFIX is set.
func writeProfiles(name string) error {
	prefix := os.Getenv("IOP_IDLE_PROFILE")
	if prefix == "" {
		return nil
	}
	for _, p := range []struct {
		kind, ext string
		debug     int
	}{{"heap", "heap", 0}, {"goroutine", "goroutines", 1}} {
		f, err := os.Create(prefix + "-" + name + "." + p.ext)
		if err != nil {
			return err
		}
		err = pprof.Lookup(p.kind).WriteTo(f, p.debug)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// profileEveryAllocation makes the heap profile record every allocation,
// not a sample of one per 512 KiB, when profiles are asked for.
func profileEveryAllocation() {
	if os.Getenv("IOP_IDLE_PROFILE") != "" {
		runtime.MemProfileRate = 1
	}
}

func reportIdle(b *testing.B, n int, runs []idleCost) {
	var edge, node sideCost
	for _, r := range runs {
		edge.Heap += r.edge.Heap
		edge.Stack += r.edge.Stack
		edge.Goroutines += r.edge.Goroutines
		node.Heap += r.node.Heap
		node.Stack += r.node.Stack
		node.Goroutines += r.node.Goroutines
	}
	per := float64(len(runs)) * float64(n)
	b.ReportMetric((edge.Heap+node.Heap)/per, "heap-B/node")
	b.ReportMetric((edge.Stack+node.Stack)/per, "stack-B/node")
	b.ReportMetric((edge.Heap+node.Heap+edge.Stack+node.Stack)/per, "total-B/node")
	b.ReportMetric((edge.Goroutines+node.Goroutines)/per, "goroutines/node")
	b.ReportMetric(float64(n), "nodes")
	if node != (sideCost{}) {
		b.ReportMetric(edge.Heap/per, "edge-heap-B/node")
		b.ReportMetric(edge.Stack/per, "edge-stack-B/node")
		b.ReportMetric(node.Heap/per, "node-heap-B/node")
		b.ReportMetric(node.Stack/per, "node-stack-B/node")
		b.ReportMetric(edge.Goroutines/per, "edge-goroutines/node")
		b.ReportMetric(node.Goroutines/per, "node-goroutines/node")
	}
}

// raiseFileLimit raises the open-file limit to need if it can and returns
// the limit in force.
func raiseFileLimit(need uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= need {
		return lim.Cur, nil
	}
	raised := lim
	raised.Cur, raised.Max = need, max(lim.Max, need)
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
		return need, nil
	}
	raised.Cur, raised.Max = min(need, lim.Max), lim.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised)
	err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return lim.Cur, err
}

// idleNodeCount is defaultIdleNodes or IOP_IDLE_NODES, fitted to the
// open-file limit: each process holds socketsPerNode sockets per node (one
// when the nodes run in a child process, two in the in-process mode). It
// measures fewer nodes, saying so, when the limit cannot be raised.
func idleNodeCount(b *testing.B, socketsPerNode int) int {
	n := defaultIdleNodes
	if s := os.Getenv("IOP_IDLE_NODES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("IOP_IDLE_NODES=%q: want a positive number", s)
		}
		n = v
	}
	need := uint64(socketsPerNode*n + 64)
	lim, err := raiseFileLimit(need)
	if err != nil {
		b.Logf("open-file limit unknown (%v); measuring %d nodes", err, n)
		return n
	}
	if lim < need {
		fit := max(int(lim)-64, 20) / socketsPerNode
		b.Logf("open-file limit %d (cannot raise it to %d): measuring %d nodes instead of %d", lim, need, fit, n)
		n = fit
	}
	return n
}

// BenchmarkIdleNodes measures what an idle node costs, both ends together:
// heap bytes, goroutine stack bytes and goroutines per node, after the
// collector has settled. rawTCP is the baseline from the same run: plain TCP
// connection pairs with one reader goroutine per side (a 4 KiB bufio.Reader
// each) that read one byte. plain is the link without TLS, tls the default
// mode (TLS 1.3, the edge's auto CA, pinned by the node).
//
// The nodes run in a child process (this test binary again, IOP_IDLE_CHILD
// set), so each process holds one socket per node: 10,000 nodes fit under
// an open-file limit of 20,000. Each process measures its own delta; the
// edge-* and node-* metrics are the two processes, the others their sum.
// IOP_IDLE_SAME_PROCESS=1 runs both ends in this process instead (two
// sockets per node, one delta). ns/op is the time to connect and tear down
// all the nodes, not a figure to compare.
//
//	go test -run '^$' -bench BenchmarkIdleNodes ./adapters/transport/
//	IOP_IDLE_NODES=1000 go test -run '^$' -bench BenchmarkIdleNodes ./adapters/transport/
func BenchmarkIdleNodes(b *testing.B) {
	sameProcess := os.Getenv("IOP_IDLE_SAME_PROCESS") != ""
	socketsPerNode := 1
	if sameProcess {
		socketsPerNode = 2
	}
	n := idleNodeCount(b, socketsPerNode)
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	profileEveryAllocation()
	run := func(name string, measure func(b *testing.B, name string, n int) idleCost) {
		b.Run(name, func(b *testing.B) {
			var runs []idleCost
			for b.Loop() {
				runs = append(runs, measure(b, name, n))
			}
			reportIdle(b, n, runs)
		})
	}
	m := edgeCA(b)
	if sameProcess {
		run("rawTCP", func(b *testing.B, name string, n int) idleCost {
			return measureSameProcess(b, name, func() func() { return connectRawPairs(b, n) })
		})
		run("plain", func(b *testing.B, name string, n int) idleCost {
			return measureSameProcess(b, name, func() func() { return connectIdleNodes(b, n, nil) })
		})
		run("tls", func(b *testing.B, name string, n int) idleCost {
			return measureSameProcess(b, name, func() func() { return connectIdleNodes(b, n, m) })
		})
		return
	}
	run("rawTCP", measureRawSplit)
	run("plain", func(b *testing.B, name string, n int) idleCost { return measureLinkSplit(b, name, n, nil) })
	run("tls", func(b *testing.B, name string, n int) idleCost { return measureLinkSplit(b, name, n, m) })
}

// ---- in-process mode ----------------------------------------------------------

// measureSameProcess snapshots the process, calls connect (which returns
// once all the connections are up, and a teardown), lets things settle,
// snapshots again and tears down.
func measureSameProcess(b *testing.B, name string, connect func() (teardown func())) idleCost {
	b.Helper()
	before := snapshot()
	teardown := connect()
	time.Sleep(idleQuiet) // writers ended, last goroutines started, handshake garbage dropped
	after := snapshot()
	if err := writeProfiles(name); err != nil {
		b.Fatal(err)
	}
	teardown()
	return idleCost{edge: costBetween(before, after)}
}

// connectRawPairs opens n loopback TCP pairs, each end with a goroutine
// blocked in Read.
func connectRawPairs(b *testing.B, n int) (teardown func()) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var rs rawReaders
	teardown = func() { _ = ln.Close(); rs.close() }
	for range n {
		c1, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			teardown()
			b.Fatal(err)
		}
		c2, err := ln.Accept()
		if err != nil {
			_ = c1.Close()
			teardown()
			b.Fatal(err)
		}
		for _, c := range []net.Conn{c1, c2} {
			if err := rs.add(c); err != nil {
				teardown()
				b.Fatal(err)
			}
		}
	}
	return teardown
}

// rawReaders are the baseline's connections: each has a goroutine reading
// it through a 4 KiB bufio.Reader, and has sent one byte (as a link
// exchanges one heartbeat).
type rawReaders struct {
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func (r *rawReaders) add(c net.Conn) error {
	r.mu.Lock()
	r.conns = append(r.conns, c)
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		br := bufio.NewReader(c)
		for {
			if _, err := br.ReadByte(); err != nil {
				return
			}
		}
	}()
	_, err := c.Write([]byte{1})
	return err
}

func (r *rawReaders) close() {
	r.mu.Lock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// idleLinkConfig is the link's configuration in the benchmark: the spec's
// liveness settings (30 s heartbeat, 45 s wait).
func idleLinkConfig() Config {
	cfg := DefaultConfig()
	cfg.Logger = quietLogger()
	return cfg
}

// startIdleEdge starts a Server over TLS with ca's certificate when ca is
// set, plaintext otherwise.
func startIdleEdge(b *testing.B, ca *tlsca.Manager) (*Server, *idleEdge) {
	b.Helper()
	cfg := idleLinkConfig()
	if ca != nil {
		cfg.TLS = NewServerTLS(ca.GetCertificate, nil)
	}
	edge := &idleEdge{}
	srv := NewServer("127.0.0.1:0", cfg, edge)
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	return srv, edge
}

func stopIdleEdge(b *testing.B, srv *Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Stop(ctx); err != nil {
		b.Errorf("server stop: %v", err)
	}
}

// startIdleNodes starts n Clients against the edge at addr (pinning the
// edge's CA when pin is set) and returns once every one has registered, or
// an error; stop stops them all.
func startIdleNodes(n int, addr, pin string) (stop func(), err error) {
	cfg := idleLinkConfig()
	if pin != "" {
		if cfg.TLS, err = NewClientTLS(ClientTLS{CAPin: pin}, addr); err != nil {
			return nil, err
		}
	}
	node := &idleNode{}
	cc := ClientConfig{
		Addr: addr, Transport: cfg,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		OnRegistered: func(string) { node.connected.Add(1) },
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop = func() {
		cancel()
		wg.Wait()
	}
	wait := func(target int64) error {
		deadline := time.Now().Add(60 * time.Second)
		for node.connected.Load() < target {
			if time.Now().After(deadline) {
				return fmt.Errorf("only %d of %d nodes registered", node.connected.Load(), target)
			}
			time.Sleep(2 * time.Millisecond)
		}
		return nil
	}
	// In batches, so the measurement is of idle nodes, not of a dial storm.
	const batch = 100
	for i := 0; i < n; i++ {
		c := cc
		c.Token = scaleToken(i)
		cli := NewClient(c, node)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = cli.Run(ctx)
		}()
		if (i+1)%batch == 0 || i == n-1 {
			if err := wait(int64(i + 1)); err != nil {
				stop()
				return nil, err
			}
		}
	}
	return stop, nil
}

// waitRegistered waits until the edge has n links, and says so when nodes
// had to register more than once.
func waitRegistered(b *testing.B, edge *idleEdge, n int) {
	deadline := time.Now().Add(60 * time.Second)
	links := func() int {
		edge.mu.Lock()
		defer edge.mu.Unlock()
		return len(edge.links)
	}
	for links() < n {
		if time.Now().After(deadline) {
			b.Fatalf("the edge has only %d links of %d nodes", links(), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if r := edge.registered.Load(); r > int64(n) {
		b.Logf("%d registrations for %d nodes: some reconnected", r, n)
	}
}

// connectIdleNodes starts an edge and n nodes in this process, over TLS
// with ca's certificate when ca is set, and returns once every node is
// registered on both ends and has exchanged a heartbeat with the edge.
func connectIdleNodes(b *testing.B, n int, ca *tlsca.Manager) (teardown func()) {
	b.Helper()
	srv, edge := startIdleEdge(b, ca)
	pin := ""
	if ca != nil {
		pin = ca.Pin()
	}
	stopNodes, err := startIdleNodes(n, srv.Addr().String(), pin)
	if err != nil {
		stopIdleEdge(b, srv)
		b.Fatal(err)
	}
	teardown = func() {
		stopNodes()
		stopIdleEdge(b, srv)
	}
	waitRegistered(b, edge, n)
	heartbeatRound(b, edge)
	return teardown
}

// heartbeatRound has every edge link send a heartbeat and waits for each
// reply: the readers and writers on both ends then sit where a link that
// has been idle for a while sits (their stacks have grown to what decoding
// and encoding a frame takes), not where a link that never carried a frame
// after its handshake does.
func heartbeatRound(b *testing.B, edge *idleEdge) {
	edge.mu.Lock()
	links := edge.links
	edge.mu.Unlock()
	for _, c := range links {
		for !c.trySendCtrl(heartbeatFrame(time.Now())) {
			time.Sleep(time.Millisecond)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, c := range links {
		for c.rtt.Load() == 0 {
			if time.Now().After(deadline) {
				b.Fatal("heartbeat replies missing after 60 s")
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// ---- nodes in a child process ---------------------------------------------------

// The child is this test binary run again with idleChildEnv set to raw,
// plain or tls (TestMain hands it to idleChild). It connects the nodes to
// IOP_IDLE_CHILD_ADDR, says so on stdout, measures itself when a line
// arrives on stdin, reports its delta on stdout (one JSON line each) and
// stops when stdin closes.
const idleChildEnv = "IOP_IDLE_CHILD"

// childMsg is one line from the child.
type childMsg struct {
	Connected bool      `json:"connected,omitempty"`
	Cost      *sideCost `json:"cost,omitempty"`
	Err       string    `json:"err,omitempty"`
}

// idleChild runs the child's side and returns its exit code.
func idleChild(kind string) int {
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = out.Encode(childMsg{Err: err.Error()})
		return 1
	}
	n, err := strconv.Atoi(os.Getenv(idleChildEnv + "_NODES"))
	if err != nil {
		return fail(fmt.Errorf("%s_NODES: %w", idleChildEnv, err))
	}
	addr := os.Getenv(idleChildEnv + "_ADDR")
	if lim, err := raiseFileLimit(uint64(n + 64)); err != nil || lim < uint64(n+64) {
		return fail(fmt.Errorf("open-file limit %d below %d (%v)", lim, n+64, err))
	}
	profileEveryAllocation()
	in := bufio.NewReader(os.Stdin)

	before := snapshot()
	var stop func()
	switch kind {
	case "raw":
		var rs rawReaders
		stop = rs.close
		for range n {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				err = rs.add(c)
			}
			if err != nil {
				stop()
				return fail(err)
			}
		}
	case "plain", "tls":
		pin := ""
		if kind == "tls" {
			pin = os.Getenv(idleChildEnv + "_PIN")
		}
		if stop, err = startIdleNodes(n, addr, pin); err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("unknown kind %q", kind))
	}
	defer stop()
	if err := out.Encode(childMsg{Connected: true}); err != nil {
		return 1
	}
	if _, err := in.ReadString('\n'); err != nil {
		return fail(fmt.Errorf("waiting for the word to measure: %w", err))
	}
	time.Sleep(idleQuiet)
	cost := costBetween(before, snapshot())
	if err := writeProfiles(kind + "-node"); err != nil {
		return fail(err)
	}
	if err := out.Encode(childMsg{Cost: &cost}); err != nil {
		return 1
	}
	_, _ = io.Copy(io.Discard, in) // until the parent closes stdin
	return 0
}

// idleChildProc is a running child, seen from the benchmark.
type idleChildProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *json.Decoder
}

// startIdleChild starts the child for kind with n nodes against addr.
func startIdleChild(b *testing.B, kind string, n int, addr, pin string) *idleChildProc {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(),
		idleChildEnv+"="+kind, idleChildEnv+"_NODES="+strconv.Itoa(n), idleChildEnv+"_ADDR="+addr, idleChildEnv+"_PIN="+pin)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return &idleChildProc{cmd: cmd, stdin: stdin, lines: json.NewDecoder(stdout)}
}

// next reads the child's next line.
func (c *idleChildProc) next() (childMsg, error) {
	var m childMsg
	if err := c.lines.Decode(&m); err != nil {
		return m, fmt.Errorf("child: %w", err)
	}
	if m.Err != "" {
		return m, errors.New("child: " + m.Err)
	}
	return m, nil
}

// stop closes the child's stdin (it stops its nodes and exits) and waits
// for it.
func (c *idleChildProc) stop() error {
	_ = c.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(60 * time.Second):
		_ = c.cmd.Process.Kill()
		return fmt.Errorf("child did not stop within 60 s: %w", <-done)
	}
}

// measureSplit runs one measurement with the nodes in a child: this process
// is snapshotted before start (which starts the edge side and returns its
// address), the child connects, ready (if set) runs once it has, then both
// processes wait, settle and measure at once.
func measureSplit(b *testing.B, name, kind string, n int, pin string, start func() (addr string, ready func(), teardown func())) idleCost {
	b.Helper()
	before := snapshot()
	addr, ready, teardown := start()
	defer teardown()
	child := startIdleChild(b, kind, n, addr, pin)
	defer func() {
		if err := child.stop(); err != nil {
			b.Error(err)
		}
	}()
	if m, err := child.next(); err != nil || !m.Connected {
		b.Fatalf("child not connected: %v", err)
	}
	if ready != nil {
		ready()
	}
	if _, err := io.WriteString(child.stdin, "measure\n"); err != nil {
		b.Fatal(err)
	}
	time.Sleep(idleQuiet)
	after := snapshot()
	if err := writeProfiles(name); err != nil {
		b.Fatal(err)
	}
	m, err := child.next()
	if err != nil || m.Cost == nil {
		b.Fatalf("child's measurement: %v", err)
	}
	return idleCost{edge: costBetween(before, after), node: *m.Cost}
}

// measureRawSplit is the raw TCP baseline with the dialling ends in a child.
func measureRawSplit(b *testing.B, name string, n int) idleCost {
	return measureSplit(b, name, "raw", n, "", func() (string, func(), func()) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		var rs rawReaders
		var accepted atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if rs.add(c) == nil {
					accepted.Add(1)
				}
			}
		}()
		ready := func() {
			deadline := time.Now().Add(60 * time.Second)
			for accepted.Load() < int64(n) {
				if time.Now().After(deadline) {
					b.Fatalf("accepted only %d of %d connections", accepted.Load(), n)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		return ln.Addr().String(), ready, func() {
			_ = ln.Close()
			<-done
			rs.close()
		}
	})
}

// measureLinkSplit is the link (over TLS with ca's certificate when ca is
// set) with the nodes in a child; every link exchanges a heartbeat before
// the measurement.
func measureLinkSplit(b *testing.B, name string, n int, ca *tlsca.Manager) idleCost {
	kind, pin := "plain", ""
	if ca != nil {
		kind, pin = "tls", ca.Pin()
	}
	return measureSplit(b, name, kind, n, pin, func() (string, func(), func()) {
		srv, edge := startIdleEdge(b, ca)
		ready := func() {
			waitRegistered(b, edge, n)
			heartbeatRound(b, edge)
		}
		return srv.Addr().String(), ready, func() { stopIdleEdge(b, srv) }
	})
}

// BenchmarkIdleHeartbeatCPU is the CPU an idle link's heartbeats cost
// when each one starts the sender's writer (writer-ends: a writer that sent
// only heartbeats ends at once, as on any idle link) against writers that
// never end (writer-stays, as before writers ran on demand), in the same
// run: 300 nodes with both ends in this process, 200 ms heartbeats, this
// process's CPU over 3 s per frame received by either end (each beat and
// each reply).
//
//	go test -run '^$' -bench BenchmarkIdleHeartbeatCPU -benchtime 1x -count 3 ./adapters/transport/
func BenchmarkIdleHeartbeatCPU(b *testing.B) {
	const nodes, hold = 300, 3 * time.Second
	for _, stays := range []bool{false, true} {
		name := "writer-ends"
		if stays {
			name = "writer-stays"
		}
		b.Run(name, func(b *testing.B) {
			cfg := testConfig()
			cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 200*time.Millisecond, 5*time.Second
			cfg.writerStays = stays
			edge := &idleEdge{}
			srv := startServer(b, "", cfg, edge)
			for i := range nodes {
				startClient(b, ClientConfig{Addr: srv.Addr().String(), Token: scaleToken(i), Transport: cfg}, &idleNode{})
			}
			waitRegistered(b, edge, nodes)
			edge.mu.Lock()
			links := edge.links
			edge.mu.Unlock()
			frames := func() (n int64) {
				for _, c := range links {
					s := c.Stats()
					n += s.FramesIn + s.FramesOut
				}
				return n
			}
			time.Sleep(500 * time.Millisecond)
			var perFrame time.Duration
			for b.Loop() {
				f0, cpu0 := frames(), cpuTime()
				time.Sleep(hold)
				perFrame = (cpuTime() - cpu0) / time.Duration(max(frames()-f0, 1))
			}
			if n := edge.disconnected.Load(); n != 0 {
				b.Fatalf("%d links dropped", n)
			}
			b.ReportMetric(float64(perFrame.Nanoseconds())/1e3, "cpu-µs/frame")
		})
	}
}
