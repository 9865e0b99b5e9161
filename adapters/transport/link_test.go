package transport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// ---- runs --------------------------------------------------------------------

func TestRunEventsArriveInOrder(t *testing.T) {
	now := time.Unix(1700000000, 42)
	script := func(req domain.RunRequest) []domain.RunEvent {
		return []domain.RunEvent{
			{RunID: req.RunID, Seq: 1, Type: domain.EventStart, Time: now},
			{RunID: req.RunID, Seq: 2, Type: domain.EventReasoningDelta, Text: "thinking"},
			{RunID: req.RunID, Seq: 3, Type: domain.EventDelta, Text: "hel"},
			{RunID: req.RunID, Seq: 4, Type: domain.EventDelta, Text: "lo"},
			{RunID: req.RunID, Seq: 5, Type: domain.EventMetadata, Metadata: []byte(`{"tool":"x"}`)},
			{RunID: req.RunID, Seq: 6, Type: domain.EventComplete, Usage: &domain.Usage{PromptTokens: 2, CompletionTokens: 3, TotalTokens: 5, Model: "m"}, Time: now},
		}
	}
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) { n.runScript = script })
	req := domain.RunRequest{RunID: "run-1", Adapter: "sh", Target: "echo", Input: []byte("hi"), SessionID: "s1", Background: true, Options: []byte(`{"a":1}`)}
	rs, err := p.link.StartRun(p.ctx, req)
	mustf(t, err, "StartRun")
	defer rs.Close()

	if got := recv(t, p.ctx, p.node.runStarted, "ExecuteRun"); !reflect.DeepEqual(got, req) {
		t.Errorf("node got request %+v", got)
	}
	for _, want := range script(req) {
		ev, err := rs.Recv(p.ctx)
		mustf(t, err, "Recv seq %d", want.Seq)
		if !reflect.DeepEqual(ev, want) {
			t.Fatalf("got %+v, want %+v", ev, want)
		}
	}
	for i := 0; i < 2; i++ {
		if _, err := rs.Recv(p.ctx); err != io.EOF {
			t.Fatalf("Recv after terminal: %v, want io.EOF", err)
		}
	}
	if o := recv(t, p.ctx, p.node.runEnded, "run end"); o.Outcome != "completed" {
		t.Errorf("node outcome %+v", o)
	}
	// Both ends forgot the stream.
	eventually(t, p.ctx, "streams released", func() bool {
		return p.link.Stats().Streams == 0 && p.cli.currentConn().Stats().Streams == 0
	})
}

func TestRunCloseTellsNode(t *testing.T) {
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.runScript = func(req domain.RunRequest) []domain.RunEvent {
			return []domain.RunEvent{{RunID: req.RunID, Seq: 1, Type: domain.EventStart}}
		}
		n.holdRuns = true
	})
	rs, err := p.link.StartRun(p.ctx, runReq("r-close"))
	mustf(t, err, "StartRun")
	ev, err := rs.Recv(p.ctx)
	mustf(t, err, "Recv")
	if ev.Type != domain.EventStart {
		t.Fatalf("first event %+v", ev)
	}
	rs.Close()
	rs.Close() // idempotent
	if o := recv(t, p.ctx, p.node.runEnded, "node sees the caller leave"); o.Outcome != "abandoned" {
		t.Errorf("node outcome %+v", o)
	}
	if _, err := rs.Recv(p.ctx); err != io.EOF {
		t.Errorf("Recv after Close: %v", err)
	}
	eventually(t, p.ctx, "streams released", func() bool {
		return p.link.Stats().Streams == 0 && p.cli.currentConn().Stats().Streams == 0
	})
}

// Emit after the edge left fails, so an adapter that ignores Done still stops.
func TestRunEmitFailsAfterClose(t *testing.T) {
	emitted := make(chan error, 1)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onRun = func(req domain.RunRequest, out ports.RunOutput) {
			_ = out.Emit(context.Background(), domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventStart})
			<-out.Done()
			emitted <- out.Emit(context.Background(), domain.RunEvent{RunID: req.RunID, Seq: 2, Type: domain.EventDelta, Text: "late"})
		}
	})
	rs, err := p.link.StartRun(p.ctx, runReq("r"))
	mustf(t, err, "StartRun")
	_, err = rs.Recv(p.ctx)
	mustf(t, err, "Recv")
	rs.Close()
	if err := recv(t, p.ctx, emitted, "late Emit"); err == nil {
		t.Error("Emit after the edge closed the run succeeded")
	}
}

func TestRunLargeEventStreamUsesCredit(t *testing.T) {
	const n = 4000
	text := strings.Repeat("d", 600) // 4000 × ~650 B ≈ 2.5 MiB, ten windows
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, node *fakeNode) {
		node.runScript = func(req domain.RunRequest) []domain.RunEvent {
			evs := make([]domain.RunEvent, 0, n+2)
			evs = append(evs, domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventStart})
			for i := 0; i < n; i++ {
				evs = append(evs, domain.RunEvent{RunID: req.RunID, Seq: uint64(i + 2), Type: domain.EventDelta, Text: text})
			}
			return append(evs, domain.RunEvent{RunID: req.RunID, Seq: n + 2, Type: domain.EventComplete})
		}
	})
	rs, err := p.link.StartRun(p.ctx, runReq("big"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	var seq uint64
	var bytesIn int
	for {
		ev, err := rs.Recv(p.ctx)
		if err == io.EOF {
			break
		}
		mustf(t, err, "Recv after %d events", seq)
		seq++
		if ev.Seq != seq {
			t.Fatalf("event %d has seq %d", seq, ev.Seq)
		}
		bytesIn += len(ev.Text)
	}
	if seq != n+2 || bytesIn != n*len(text) {
		t.Fatalf("got %d events, %d bytes", seq, bytesIn)
	}
	if bytesIn < 2<<20 {
		t.Fatalf("test moved only %d bytes", bytesIn)
	}
	if o := recv(t, p.ctx, p.node.runEnded, "run end"); o.Outcome != "completed" {
		t.Errorf("node outcome %+v", o)
	}
}

// Many runs started at once on one link all complete: stream ids reach the
// peer in increasing order, whatever the scheduling of the openers.
func TestConcurrentRunsAllComplete(t *testing.T) {
	p := newPair(t, pairOptions{}, nil)
	const runs = 200
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for i := 0; i < runs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
			defer cancel()
			rs, err := p.link.StartRun(ctx, runReq(fmt.Sprintf("c%d", i)))
			if err != nil {
				errs <- err
				return
			}
			defer rs.Close()
			for {
				ev, err := rs.Recv(ctx)
				if err == io.EOF {
					return
				}
				if err != nil {
					errs <- fmt.Errorf("run c%d: %w", i, err)
					return
				}
				if ev.RunID != fmt.Sprintf("c%d", i) {
					errs <- fmt.Errorf("run c%d got event of %s", i, ev.RunID)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A node handler that returns without a terminal event must not leave the
// edge waiting forever, nor leak the stream on the node.
func TestRunHandlerReturnsWithoutTerminal(t *testing.T) {
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onRun = func(req domain.RunRequest, out ports.RunOutput) {
			_ = out.Emit(context.Background(), domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventStart})
		}
	})
	rs, err := p.link.StartRun(p.ctx, runReq("r"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	_, err = rs.Recv(p.ctx)
	mustf(t, err, "first Recv")
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	if _, err = rs.Recv(ctx); !errors.Is(err, &domain.Error{Code: domain.CodeStreamReset}) {
		t.Fatalf("Recv after the handler returned: %v; want stream_reset", err)
	}
	eventually(t, p.ctx, "node stream released", func() bool { return p.cli.currentConn().Stats().Streams == 0 })
}

// ---- commands ----------------------------------------------------------------

func TestCommandProgressAndLargeResult(t *testing.T) {
	result := make([]byte, 100<<10+123)
	for i := range result {
		result[i] = byte('a' + rand.IntN(26))
	}
	progress := [][]byte{[]byte(`{"pct":10}`), []byte(`{"pct":50}`), []byte(`{"pct":100}`)}
	gotArgs := make(chan []byte, 1)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onCommand = func(ctx context.Context, name string, args []byte, prog func([]byte) error) ([]byte, error) {
			if name != "ollama.pull" {
				return nil, domain.ErrUnknownCommand
			}
			gotArgs <- args
			for _, p := range progress {
				if err := prog(p); err != nil {
					return nil, err
				}
			}
			return result, nil
		}
	})
	cs, err := p.link.Command(p.ctx, "ollama.pull", []byte(`{"model":"x"}`))
	mustf(t, err, "Command")
	defer cs.Close()
	for i, want := range progress {
		r, err := cs.Recv(p.ctx)
		mustf(t, err, "progress %d", i)
		if r.Final || !bytes.Equal(r.Progress, want) {
			t.Fatalf("reply %d: %+v", i, r)
		}
	}
	r, err := cs.Recv(p.ctx)
	mustf(t, err, "final")
	if !r.Final || r.Err != nil || !bytes.Equal(r.Result, result) {
		t.Fatalf("final reply: final=%v err=%v result %d bytes (want %d)", r.Final, r.Err, len(r.Result), len(result))
	}
	if _, err := cs.Recv(p.ctx); err != io.EOF {
		t.Errorf("after final: %v", err)
	}
	if a := recv(t, p.ctx, gotArgs, "args"); string(a) != `{"model":"x"}` {
		t.Errorf("args %q", a)
	}
}

func TestCommandErrorMapsToDomain(t *testing.T) {
	p := newPair(t, pairOptions{}, nil) // the fake node knows no commands
	cs, err := p.link.Command(p.ctx, "nope", nil)
	mustf(t, err, "Command")
	r, err := cs.Recv(p.ctx)
	mustf(t, err, "Recv")
	if !r.Final || !errors.Is(r.Err, domain.ErrUnknownCommand) || !strings.Contains(r.Err.Error(), `no command "nope"`) {
		t.Fatalf("reply %+v", r)
	}

	// A wrapped error keeps its code; an error carrying a partial result keeps both.
	p.node.onCommand = func(context.Context, string, []byte, func([]byte) error) ([]byte, error) {
		return []byte(`{"partial":true}`), fmt.Errorf("pull: %w", domain.ErrModelNotFound)
	}
	cs, err = p.link.Command(p.ctx, "x", nil)
	mustf(t, err, "Command")
	r, err = cs.Recv(p.ctx)
	mustf(t, err, "Recv")
	if !errors.Is(r.Err, domain.ErrModelNotFound) || string(r.Result) != `{"partial":true}` {
		t.Fatalf("reply %+v", r)
	}
}

func TestCommandCloseCancelsNode(t *testing.T) {
	cancelled := make(chan error, 1)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onCommand = func(ctx context.Context, _ string, _ []byte, prog func([]byte) error) ([]byte, error) {
			_ = prog([]byte(`{"pct":1}`))
			<-ctx.Done()
			cancelled <- context.Cause(ctx)
			return nil, ctx.Err()
		}
	})
	cs, err := p.link.Command(p.ctx, "slow", nil)
	mustf(t, err, "Command")
	_, err = cs.Recv(p.ctx)
	mustf(t, err, "progress")
	cs.Close()
	cause := recv(t, p.ctx, cancelled, "node ctx cancelled")
	var re *ResetError
	if !errors.As(cause, &re) || re.Code != "cancel" {
		t.Errorf("node saw cause %v; want a cancel reset", cause)
	}
}

// ---- cancel / terminate ------------------------------------------------------

func TestCancelAndTerminate(t *testing.T) {
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.cancelErr = func(id string) error {
			if id == "known" {
				return nil
			}
			return domain.Errorf(domain.CodeRunNotFound, "run %s", id)
		}
		n.terminateFn = func(c terminateCall) error {
			if c.SessionID == "busy" {
				return fmt.Errorf("terminate: %w", domain.ErrSessionBusy)
			}
			return nil
		}
	})
	mustf(t, p.link.CancelRun(p.ctx, "known", ""), "CancelRun known")
	if id := recv(t, p.ctx, p.node.cancels, "CancelRun"); id != "known" {
		t.Errorf("node cancelled %q", id)
	}
	err := p.link.CancelRun(p.ctx, "ghost", "")
	if !errors.Is(err, domain.ErrRunNotFound) || !strings.Contains(err.Error(), "run ghost") {
		t.Errorf("CancelRun ghost: %v", err)
	}
	recv(t, p.ctx, p.node.cancels, "CancelRun")

	// The edge's reason (why it cancels: the caller left, ...) reaches the
	// node, which records it as the run's message; none is a cancel by
	// request.
	mustf(t, p.link.CancelRun(p.ctx, "known", "caller left before the run ended"), "CancelRun known with a reason")
	recv(t, p.ctx, p.node.cancels, "CancelRun")
	p.node.mu.Lock()
	reasons := slices.Clone(p.node.reasons)
	p.node.mu.Unlock()
	if want := []string{"", "", "caller left before the run ended"}; !slices.Equal(reasons, want) {
		t.Errorf("the node got reasons %q, want %q", reasons, want)
	}

	mustf(t, p.link.TerminateSession(p.ctx, "sh", "echo", "s1"), "TerminateSession")
	if c := recv(t, p.ctx, p.node.terminates, "TerminateSession"); c != (terminateCall{"sh", "echo", "s1"}) {
		t.Errorf("node got %+v", c)
	}
	if err := p.link.TerminateSession(p.ctx, "sh", "echo", "busy"); !errors.Is(err, domain.ErrSessionBusy) {
		t.Errorf("TerminateSession busy: %v", err)
	}
	eventually(t, p.ctx, "streams released", func() bool {
		return p.link.Stats().Streams == 0 && p.cli.currentConn().Stats().Streams == 0
	})
}

func TestCancelTimesOut(t *testing.T) {
	release := make(chan struct{})
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.cancelErr = func(string) error { <-release; return nil }
	})
	defer close(release)
	ctx, cancel := context.WithTimeout(p.ctx, 100*time.Millisecond)
	defer cancel()
	if err := p.link.CancelRun(ctx, "slow", ""); !errors.Is(err, domain.ErrTimeout) {
		t.Errorf("got %v, want ErrTimeout", err)
	}
}

// ---- config push -------------------------------------------------------------

// A report asked for while one is being taken is sent after it: the one
// under way may predate what changed.
func TestStatsNowDuringAReportSendsAnother(t *testing.T) {
	taking := make(chan struct{})
	release := make(chan struct{})
	var calls atomic.Int64
	stats := func() domain.NodeStats {
		if calls.Add(1) == 1 {
			close(taking)
			<-release
		}
		return domain.NodeStats{ChildProcesses: int(calls.Load())}
	}
	p := newPair(t, pairOptions{}, nil)
	r := reportStats(p.ctx, p.cli.currentConn(), stats, time.Hour)
	defer r.stop()
	recv(t, p.ctx, taking, "the first report under way")
	r.now()
	close(release)
	eventually(t, p.ctx, "a second report", func() bool {
		s, ok := p.link.NodeStats()
		return ok && s.ChildProcesses == 2
	})
}

// A node sends its stats right after it applies a config, so the edge's
// metrics show the adapters' new slots at once: they used to wait for the
// next report (15 s by default; an hour here).
func TestStatsSentRightAfterAConfigIsApplied(t *testing.T) {
	var node *fakeNode
	stats := func() domain.NodeStats {
		node.mu.Lock()
		defer node.mu.Unlock()
		var s domain.NodeStats
		if n := len(node.configs); n > 0 {
			for _, a := range node.configs[n-1].Adapters {
				s.Adapters = append(s.Adapters, domain.AdapterSlots{Name: a.Name, Max: a.MaxConcurrency})
			}
		}
		return s
	}
	p := newPair(t, pairOptions{client: ClientConfig{Stats: stats, StatsInterval: time.Hour}}, func(_ *fakeEdge, n *fakeNode) { node = n })
	slots := func() int {
		s, ok := p.link.NodeStats()
		if !ok || len(s.Adapters) == 0 {
			return -1
		}
		return s.Adapters[0].Max
	}
	eventually(t, p.ctx, "the report at register", func() bool { return slots() == testNodeConfig().Adapters[0].MaxConcurrency })
	for i, max := range []int{1, 7, 3} {
		cfg := testNodeConfig()
		cfg.Version = uint64(10 + i)
		cfg.Adapters[0].MaxConcurrency = max
		mustf(t, p.link.PushConfig(p.ctx, cfg), "PushConfig")
		eventually(t, p.ctx, fmt.Sprintf("max_concurrency %d in the node's stats", max), func() bool { return slots() == max })
	}
}

func TestPushConfig(t *testing.T) {
	p := newPair(t, pairOptions{}, nil)
	recv(t, p.ctx, p.node.applied, "config at register")
	cfg := testNodeConfig()
	cfg.Version = 8
	mustf(t, p.link.PushConfig(p.ctx, cfg), "PushConfig")
	if got := recv(t, p.ctx, p.node.applied, "refreshed config"); !reflect.DeepEqual(got, cfg) {
		t.Errorf("node applied %+v", got)
	}
	p.node.mu.Lock()
	p.node.applyErr = func(domain.NodeConfig) error { return errors.New("adapter x: bad base_url") }
	p.node.mu.Unlock()
	cfg.Version = 9
	err := p.link.PushConfig(p.ctx, cfg)
	if !errors.Is(err, domain.ErrConfig) || !strings.Contains(err.Error(), "bad base_url") {
		t.Errorf("PushConfig with a failing node: %v", err)
	}
	// A config too large for one frame is refused at once, saying why: the
	// writer dropped it, and the push waited out its timeout for an answer.
	cfg.Version = 10
	cfg.Adapters[0].Targets["big"] = domain.ExecTarget{Command: []string{"echo", strings.Repeat("x", DefaultMaxFrameSize)}}
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	if err := p.link.PushConfig(ctx, cfg); !errors.Is(err, domain.ErrConfig) || !strings.Contains(err.Error(), "max_frame_size in edge.yaml and restart the edge") {
		t.Errorf("PushConfig of a config larger than a frame: %v, want config_error saying raising max_frame_size takes a restart", err)
	}
}

// A push whose wait is cancelled (the edge stopping a SIGHUP reload) says
// it was cancelled; only one whose time ran out is a timeout. Both used to
// read "timeout: waiting for config ack: …".
func TestPushConfigCancelledIsNotATimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	p := newPair(t, pairOptions{}, nil)
	recv(t, p.ctx, p.node.applied, "config at register")
	p.node.mu.Lock()
	p.node.applyErr = func(domain.NodeConfig) error {
		<-release // the node never answers a refresh
		return nil
	}
	p.node.mu.Unlock()
	cfg := testNodeConfig()
	cfg.Version = 20
	ctx, cancel := context.WithCancel(p.ctx)
	errc := make(chan error, 1)
	go func() { errc <- p.link.PushConfig(ctx, cfg) }()
	recv(t, p.ctx, p.node.applied, "the refresh at the node")
	cancel()
	if err := recv(t, p.ctx, errc, "PushConfig"); domain.CodeOf(err) != domain.CodeCancelled || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("cancelled push: %v (code %s), want cancelled", err, domain.CodeOf(err))
	}
	cfg.Version = 21
	ctx, cancel = context.WithTimeout(p.ctx, 50*time.Millisecond)
	defer cancel()
	if err := p.link.PushConfig(ctx, cfg); domain.CodeOf(err) != domain.CodeTimeout {
		t.Fatalf("unanswered push: %v (code %s), want timeout", err, domain.CodeOf(err))
	}
}

// ---- tunnels -----------------------------------------------------------------

func randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

type tunnelSeen struct {
	req  domain.TunnelRequest
	body []byte
	err  error
}

// echoTunnel reads the whole request body and answers with a fixed response.
func echoTunnel(seen chan<- tunnelSeen, respBody []byte) func(context.Context, domain.TunnelRequest, io.Reader, ports.TunnelSink) {
	return func(ctx context.Context, req domain.TunnelRequest, body io.Reader, out ports.TunnelSink) {
		all := append([]byte(nil), req.Body...)
		var err error
		if body != nil {
			var rest []byte
			rest, err = io.ReadAll(body)
			all = append(all, rest...)
		}
		seen <- tunnelSeen{req: req, body: all, err: err}
		half := len(respBody) / 2
		head := []domain.TunnelFrame{
			{Kind: domain.TunnelStatus, Status: 200},
			{Kind: domain.TunnelHeader, Header: domain.Header{"Content-Type": {"application/octet-stream"}}},
			{Kind: domain.TunnelBody, Body: respBody[:half]},
		}
		tail := []domain.TunnelFrame{
			{Kind: domain.TunnelUsage, Usage: &domain.Usage{TotalTokens: 42}},
			{Kind: domain.TunnelMetadata, Metadata: []byte(`{"model":"m"}`)},
			{Kind: domain.TunnelEnd},
		}
		for _, f := range head {
			if err := out.Send(f); err != nil {
				return
			}
		}
		// The rest goes out as the node's tunnel handler sends it: pieces
		// of one read buffer, overwritten as soon as Send returns (the
		// sink must have copied what it keeps).
		scratch := make([]byte, 10<<10)
		for rest := respBody[half:]; len(rest) > 0; {
			n := copy(scratch, rest)
			rest = rest[n:]
			if err := out.Send(domain.TunnelFrame{Kind: domain.TunnelBody, Body: scratch[:n]}); err != nil {
				return
			}
			for i := range scratch {
				scratch[i] = 0xEE
			}
		}
		for _, f := range tail {
			if err := out.Send(f); err != nil {
				return
			}
		}
	}
}

// A body frame's bytes stay intact until the next Recv on its own stream,
// while other streams receive (and recycle buffers) in between.
func TestTunnelBodyValidUntilNextRecv(t *testing.T) {
	a, b := randomBytes(512<<10), randomBytes(512<<10)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(ctx context.Context, req domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
			body := a
			if req.Path == "/b" {
				body = b
			}
			echoTunnel(make(chan tunnelSeen, 1), body)(ctx, req, nil, out)
		}
	})
	ta, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Method: "GET", Path: "/a"}, nil)
	mustf(t, err, "OpenTunnel a")
	defer ta.Close()
	tb, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Method: "GET", Path: "/b"}, nil)
	mustf(t, err, "OpenTunnel b")
	defer tb.Close()
	var gotA, gotB []byte
	doneA, doneB := false, false
	for !doneA || !doneB {
		var held []byte // a's last body, checked after b's Recv
		if !doneA {
			f, err := ta.Recv(p.ctx)
			doneA = err == io.EOF
			if !doneA {
				mustf(t, err, "a Recv")
				if f.Kind == domain.TunnelBody {
					held = f.Body
					gotA = append(gotA, f.Body...)
				}
			}
		}
		if !doneB {
			f, err := tb.Recv(p.ctx)
			doneB = err == io.EOF
			if !doneB {
				mustf(t, err, "b Recv")
				gotB = append(gotB, f.Body...)
			}
		}
		if held != nil && !bytes.Equal(held, gotA[len(gotA)-len(held):]) {
			t.Fatalf("a's body chunk changed before a's next Recv (at byte %d)", len(gotA)-len(held))
		}
	}
	if !bytes.Equal(gotA, a) || !bytes.Equal(gotB, b) {
		t.Fatalf("bodies differ: a %d/%d bytes, b %d/%d", len(gotA), len(a), len(gotB), len(b))
	}
}

func TestTunnelRequestBodies(t *testing.T) {
	for _, m := range wireModes {
		t.Run(m.name, func(t *testing.T) { testTunnelRequestBodies(t, m) })
	}
}

func testTunnelRequestBodies(t *testing.T, m wireMode) {
	seen := make(chan tunnelSeen, 4)
	p := newPairIn(t, m, func(_ *fakeEdge, n *fakeNode) { n.onTunnel = echoTunnel(seen, []byte("ok")) })
	body := randomBytes(200 << 10)
	cases := []struct {
		name   string
		inline []byte
		rest   []byte // sent through the io.Reader, if non-nil
		wrap   func(io.Reader) io.Reader
	}{
		{"small inline", body[:100], nil, nil},
		{"large inline", body, nil, nil},
		{"reader only", nil, body, nil},
		{"inline and reader", body[:50<<10], body[50<<10:], nil},
		{"one-byte reads", body[:10], body[10 : 40<<10], func(r io.Reader) io.Reader { return &oneByteReader{r: r} }},
		{"empty reader", nil, []byte{}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := append(append([]byte(nil), tc.inline...), tc.rest...)
			var r io.Reader
			if tc.rest != nil {
				r = bytes.NewReader(tc.rest)
				if tc.wrap != nil {
					r = tc.wrap(r)
				}
			}
			req := domain.TunnelRequest{Provider: "oa", Method: "POST", Path: "/v1/chat/completions", Query: "x=1",
				Header: domain.Header{"Authorization": {"Bearer t"}, "X-Two": {"a", "b"}}, Body: tc.inline}
			ts, err := p.link.OpenTunnel(p.ctx, req, r)
			mustf(t, err, "OpenTunnel")
			defer ts.Close()
			got := recv(t, p.ctx, seen, "node tunnel")
			if got.err != nil {
				t.Fatalf("node body read: %v", got.err)
			}
			if !bytes.Equal(got.body, want) {
				t.Fatalf("node got %d body bytes (sha %x), want %d (sha %x)", len(got.body), sha256.Sum256(got.body), len(want), sha256.Sum256(want))
			}
			if got.req.Provider != "oa" || got.req.Method != "POST" || got.req.Path != "/v1/chat/completions" || got.req.Query != "x=1" ||
				!reflect.DeepEqual(got.req.Header, req.Header) {
				t.Errorf("node got request %+v", got.req)
			}
			drainTunnel(t, p.ctx, ts)
		})
	}
}

type oneByteReader struct{ r io.Reader }

func (o *oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

// drainTunnel reads a tunnel to its end and returns the frames and body.
func drainTunnel(t *testing.T, ctx context.Context, ts ports.TunnelStream) ([]domain.TunnelFrameKind, []byte) {
	t.Helper()
	var kinds []domain.TunnelFrameKind
	var body []byte
	for {
		f, err := ts.Recv(ctx)
		if err == io.EOF {
			return kinds, body
		}
		mustf(t, err, "tunnel Recv after %v", kinds)
		if len(kinds) == 0 || kinds[len(kinds)-1] != f.Kind || f.Kind != domain.TunnelBody {
			kinds = append(kinds, f.Kind)
		}
		body = append(body, f.Body...)
	}
}

func TestTunnelResponseFramesInOrder(t *testing.T) {
	for _, m := range wireModes {
		t.Run(m.name, func(t *testing.T) { testTunnelResponseFramesInOrder(t, m) })
	}
}

func testTunnelResponseFramesInOrder(t *testing.T, m wireMode) {
	seen := make(chan tunnelSeen, 1)
	resp := randomBytes(1 << 20)
	p := newPairIn(t, m, func(_ *fakeEdge, n *fakeNode) { n.onTunnel = echoTunnel(seen, resp) })
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Method: "GET", Path: "/v1/models"}, nil)
	mustf(t, err, "OpenTunnel")
	defer ts.Close()

	var kinds []domain.TunnelFrameKind
	var body []byte
	var usage *domain.Usage
	chunks := 0
	for {
		f, err := ts.Recv(p.ctx)
		if err == io.EOF {
			break
		}
		mustf(t, err, "Recv")
		switch f.Kind {
		case domain.TunnelStatus:
			if f.Status != 200 {
				t.Errorf("status %d", f.Status)
			}
		case domain.TunnelHeader:
			if f.Header.Get("Content-Type") != "application/octet-stream" {
				t.Errorf("header %v", f.Header)
			}
		case domain.TunnelBody:
			chunks++
			if len(f.Body) > maxDataChunk {
				t.Errorf("body chunk of %d bytes exceeds %d", len(f.Body), maxDataChunk)
			}
			body = append(body, f.Body...)
		case domain.TunnelUsage:
			usage = f.Usage
		}
		if len(kinds) == 0 || kinds[len(kinds)-1] != f.Kind {
			kinds = append(kinds, f.Kind)
		}
	}
	want := []domain.TunnelFrameKind{domain.TunnelStatus, domain.TunnelHeader, domain.TunnelBody, domain.TunnelUsage, domain.TunnelMetadata, domain.TunnelEnd}
	if !reflect.DeepEqual(kinds, want) {
		t.Errorf("frame order %v, want %v", kinds, want)
	}
	if sha256.Sum256(body) != sha256.Sum256(resp) {
		t.Errorf("body differs: %d bytes, want %d", len(body), len(resp))
	}
	if chunks < len(resp)/maxDataChunk {
		t.Errorf("1 MiB body came in %d chunks; bodies must be split", chunks)
	}
	if usage == nil || usage.TotalTokens != 42 {
		t.Errorf("usage %+v", usage)
	}
	if _, err := ts.Recv(p.ctx); err != io.EOF {
		t.Errorf("after end: %v", err)
	}
}

func TestTunnelErrorFrameEnds(t *testing.T) {
	p := newPair(t, pairOptions{}, nil) // the fake node answers with provider_not_found
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "ghost"}, nil)
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	f, err := ts.Recv(p.ctx)
	mustf(t, err, "Recv")
	if f.Kind != domain.TunnelError || f.Error == nil || f.Error.Code != domain.CodeProviderNotFound {
		t.Fatalf("frame %+v", f)
	}
	if _, err := ts.Recv(p.ctx); err != io.EOF {
		t.Errorf("after error frame: %v", err)
	}
}

func TestTunnelCloseCancelsNode(t *testing.T) {
	type result struct {
		cause   error
		sendErr error
	}
	done := make(chan result, 1)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(ctx context.Context, _ domain.TunnelRequest, body io.Reader, out ports.TunnelSink) {
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200})
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelBody, Body: []byte("first")})
			<-ctx.Done()
			done <- result{cause: context.Cause(ctx), sendErr: out.Send(domain.TunnelFrame{Kind: domain.TunnelBody, Body: []byte("late")})}
		}
	})
	// An endless request body: Close must also stop the uploader.
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Method: "POST"}, endlessReader{})
	mustf(t, err, "OpenTunnel")
	f, err := ts.Recv(p.ctx)
	mustf(t, err, "status")
	if f.Kind != domain.TunnelStatus {
		t.Fatalf("first frame %+v", f)
	}
	f, err = ts.Recv(p.ctx)
	mustf(t, err, "body")
	if string(f.Body) != "first" {
		t.Fatalf("second frame %+v", f)
	}
	closed := make(chan struct{})
	go func() { ts.Close(); close(closed) }()
	recv(t, p.ctx, closed, "Close to return")
	r := recv(t, p.ctx, done, "node ctx cancelled")
	var re *ResetError
	if !errors.As(r.cause, &re) || re.Code != "cancel" {
		t.Errorf("node ctx cause %v", r.cause)
	}
	if r.sendErr == nil {
		t.Error("Send after Close succeeded")
	}
	if _, err := ts.Recv(p.ctx); err != io.EOF {
		t.Errorf("Recv after Close: %v", err)
	}
	eventually(t, p.ctx, "streams released", func() bool {
		return p.link.Stats().Streams == 0 && p.cli.currentConn().Stats().Streams == 0
	})
}

type endlessReader struct{}

func (endlessReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// failingReader gives after bytes, then err (by default "client went
// away").
type failingReader struct {
	after int
	err   error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.after <= 0 {
		if r.err != nil {
			return 0, r.err
		}
		return 0, errors.New("client went away")
	}
	n := min(len(p), r.after)
	r.after -= n
	return n, nil
}

func TestTunnelBodyReadErrorResetsStream(t *testing.T) {
	seen := make(chan tunnelSeen, 1)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) { n.onTunnel = echoTunnel(seen, nil) })
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa"}, &failingReader{after: 70 << 10})
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	got := recv(t, p.ctx, seen, "node tunnel")
	if got.err == nil {
		t.Fatalf("node read a complete body (%d bytes) from a failed upload", len(got.body))
	}
	// The tunnel says why it ended — the caller's body — rather than a bare
	// "stream closed" that its relay would answer as an internal error.
	if _, err := ts.Recv(p.ctx); domain.CodeOf(err) != domain.CodeInvalidRequest || !strings.Contains(err.Error(), "client went away") {
		t.Errorf("Recv after the upload failed: %v, want invalid_request naming the body's error", err)
	}
}

// A caller's body cut short reads as io.ErrUnexpectedEOF (net/http's
// request body, before its declared length or its last chunk): the node
// must see a failed body, not a finished one it would send to the
// provider as a complete request.
func TestTunnelBodyCutShortIsNotAnEnd(t *testing.T) {
	seen := make(chan tunnelSeen, 1)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) { n.onTunnel = echoTunnel(seen, nil) })
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa"}, &failingReader{after: 70 << 10, err: io.ErrUnexpectedEOF})
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	if got := recv(t, p.ctx, seen, "node tunnel"); got.err == nil {
		t.Fatalf("node read a complete body (%d bytes) from an upload cut short", len(got.body))
	}
	if _, err := ts.Recv(p.ctx); domain.CodeOf(err) != domain.CodeInvalidRequest || !strings.Contains(err.Error(), "unexpected EOF") {
		t.Errorf("Recv after the upload was cut: %v, want invalid_request naming it", err)
	}
}

// A body streams to the node as the caller sends it: a first piece
// reaches the node's handler while the caller has not sent the rest.
func TestTunnelBodyStreamsAsSent(t *testing.T) {
	first := make(chan []byte, 1)
	rest := make(chan []byte, 1)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(_ context.Context, _ domain.TunnelRequest, body io.Reader, out ports.TunnelSink) {
			buf := make([]byte, 64)
			k, _ := body.Read(buf)
			first <- buf[:k]
			all, _ := io.ReadAll(body)
			rest <- all
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 204})
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelEnd})
		}
	})
	pr, pw := io.Pipe()
	defer pw.Close()
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa"}, pr)
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	go func() { _, _ = pw.Write([]byte(`{"model":"m"`)) }()
	// The rest is sent only once the node has the first piece: held back
	// until a full buffer, it never would be.
	if got := recv(t, p.ctx, first, "first piece"); string(got) != `{"model":"m"` {
		t.Fatalf("first piece %q", got)
	}
	go func() {
		_, _ = pw.Write([]byte(`,"x":1}`))
		_ = pw.Close()
	}()
	if got := recv(t, p.ctx, rest, "rest"); string(got) != `,"x":1}` {
		t.Fatalf("rest %q", got)
	}
}

// Response headers larger than one frame may be (a quarter of the edge's
// window) are refused by the node's sink before anything is sent, with the
// sizes, and the stream stays usable: the node's error frame reaches the
// edge, instead of a reset that tells the caller nothing.
func TestTunnelHeadersTooLargeForAFrame(t *testing.T) {
	refused := make(chan error, 1)
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(_ context.Context, _ domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200})
			err := out.Send(domain.TunnelFrame{Kind: domain.TunnelHeader, Header: domain.Header{"X-Big": {strings.Repeat("x", 100<<10)}}})
			refused <- err
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderError, Message: "headers too large"}})
		}
	})
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa"}, nil)
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	var tooBig *ports.FrameTooLargeError
	if err := recv(t, p.ctx, refused, "header send"); !errors.As(err, &tooBig) {
		t.Fatalf("header send: %v, want a FrameTooLargeError", err)
	}
	if max := int(p.cli.currentConn().peerWindow) / 4; tooBig.Max != max || tooBig.Size <= max || tooBig.Size < 100<<10 {
		t.Fatalf("refusal %+v, want a size over 100 KiB and at most %d", tooBig, max)
	}
	f, err := ts.Recv(p.ctx)
	mustf(t, err, "status")
	if f.Kind != domain.TunnelStatus {
		t.Fatalf("first frame %+v", f)
	}
	f, err = ts.Recv(p.ctx)
	mustf(t, err, "error frame")
	if f.Kind != domain.TunnelError || f.Error.Code != domain.CodeProviderError {
		t.Fatalf("second frame %+v, want the node's error", f)
	}
}

// A tunnel handler that returns without end or error must not leave the
// edge waiting forever.
func TestTunnelHandlerReturnsWithoutEnd(t *testing.T) {
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(_ context.Context, _ domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 502})
		}
	})
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa"}, nil)
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	_, err = ts.Recv(p.ctx)
	mustf(t, err, "status")
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	if _, err := ts.Recv(ctx); !errors.Is(err, &domain.Error{Code: domain.CodeStreamReset}) {
		t.Fatalf("Recv after the handler returned: %v; want stream_reset", err)
	}
}

// A caller polling with an already-ended context (nothing ready? then do
// something else) gets a ready frame, or its context's error with the
// stream still open, or the stream's own failure — never that failure
// disguised as its context's error.
func TestRecvWithEndedContext(t *testing.T) {
	release := make(chan struct{})
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(_ context.Context, _ domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200})
			<-release // then return without an end frame: the node resets the stream
		}
	})
	ended, cancel := context.WithCancel(p.ctx)
	cancel()
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa"}, nil)
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	var f domain.TunnelFrame
	eventually(t, p.ctx, "status ready", func() bool {
		f, err = ts.Recv(ended)
		return err == nil
	})
	if f.Kind != domain.TunnelStatus {
		t.Fatalf("first frame %+v", f)
	}
	if _, err := ts.Recv(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("nothing ready: %v, want context.Canceled", err)
	}
	close(release)
	eventually(t, p.ctx, "reset seen", func() bool {
		_, err = ts.Recv(ended)
		return !errors.Is(err, context.Canceled)
	})
	if !errors.Is(err, &domain.Error{Code: domain.CodeStreamReset}) {
		t.Fatalf("after the reset: %v, want stream_reset", err)
	}
	if _, err := ts.Recv(p.ctx); err != io.EOF {
		t.Fatalf("after the failure: %v, want io.EOF", err)
	}
}

// Sending a frame larger than a quarter of the window is refused locally
// instead of breaking the peer's credit accounting.
func TestSendRefusesFramesOverQuarterWindow(t *testing.T) {
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onRun = func(req domain.RunRequest, out ports.RunOutput) {
			err := out.Emit(context.Background(), domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventDelta, Text: strings.Repeat("x", 100<<10)})
			if err == nil {
				_ = out.Emit(context.Background(), domain.RunEvent{RunID: req.RunID, Seq: 2, Type: domain.EventComplete})
			} else {
				_ = out.Emit(context.Background(), domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventError, Error: &domain.ErrorInfo{Code: "internal", Message: err.Error()}})
			}
			out.Close()
		}
	})
	rs, err := p.link.StartRun(p.ctx, runReq("huge"))
	mustf(t, err, "StartRun")
	ev, err := rs.Recv(p.ctx)
	mustf(t, err, "Recv")
	if ev.Type != domain.EventError || !strings.Contains(ev.Error.Message, ErrStreamFrameTooBig.Error()) {
		t.Errorf("event %+v", ev)
	}
}

// orderedApplyNode records the config version in force after each
// ApplyConfig returns; applying v1 is slow.
type orderedApplyNode struct {
	*fakeNode
	mu        sync.Mutex
	inForce   uint64
	v2Applied chan struct{}
}

func (n *orderedApplyNode) ApplyConfig(ctx context.Context, cfg domain.NodeConfig) error {
	if cfg.Version == 1 {
		// Slow: give a later refresh every chance to overtake this one.
		select {
		case <-n.v2Applied:
		case <-time.After(300 * time.Millisecond):
		}
	}
	n.mu.Lock()
	n.inForce = cfg.Version
	n.mu.Unlock()
	if cfg.Version == 2 {
		close(n.v2Applied)
	}
	return nil
}

// Config refreshes are applied in the order the edge sent them: the last
// one sent is the one in force, even when an earlier one is slow to apply.
func TestConfigRefreshesApplyInOrder(t *testing.T) {
	ctx := testCtx(t)
	redge := listenRawEdge(t)
	node := &orderedApplyNode{fakeNode: newFakeNode(), v2Applied: make(chan struct{})}
	registered := make(chan string, 1)
	cc := ClientConfig{Addr: redge.ln.Addr().String(), Token: testToken, Transport: testConfig(),
		OnRegistered: func(id string) { registered <- id }}
	startClient(t, cc, node)
	resp := &ioppb.RegisterResponse{Accepted: true, Config: configToProto(domain.NodeConfig{NodeID: "n1"}), HeartbeatIntervalMs: 100, HeartbeatTimeoutMs: 5000, InitialWindow: 1 << 18}
	edge, _ := redge.accept(ctx, resp)
	recv(t, ctx, registered, "registration")

	for _, v := range []uint64{1, 2} {
		edge.write(&ioppb.Frame{Body: &ioppb.Frame_ConfigRefresh{ConfigRefresh: &ioppb.ConfigRefresh{Config: configToProto(domain.NodeConfig{NodeID: "n1", Version: v})}}})
	}
	var acks []uint64
	for len(acks) < 2 {
		f := edge.readUntil(ctx, "config ack", func(f *ioppb.Frame) bool { return f.GetConfigRefreshAck() != nil })
		acks = append(acks, f.GetConfigRefreshAck().GetVersion())
	}
	node.mu.Lock()
	inForce := node.inForce
	node.mu.Unlock()
	if inForce != 2 {
		t.Errorf("config v%d in force after refreshes v1, v2 (acks in order %v)", inForce, acks)
	}
	if acks[0] != 1 || acks[1] != 2 {
		t.Errorf("acks %v, want [1 2]", acks)
	}
}

// A terminal error event whose message is too long for one frame (an
// upstream error body, say) still reaches the edge, with its code and the
// start of its message; the caller does not get a bare stream reset.
func TestRunTerminalWithHugeErrorMessageArrives(t *testing.T) {
	long := strings.Repeat("x", 200<<10)
	script := func(req domain.RunRequest) []domain.RunEvent {
		return []domain.RunEvent{
			{RunID: req.RunID, Seq: 1, Type: domain.EventStart},
			{RunID: req.RunID, Seq: 2, Type: domain.EventError, Error: &domain.ErrorInfo{Code: domain.CodeProviderError, Message: long}},
		}
	}
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) { n.runScript = script })
	rs, err := p.link.StartRun(p.ctx, runReq("r"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	_, err = rs.Recv(p.ctx)
	mustf(t, err, "start")
	ev, err := rs.Recv(p.ctx)
	mustf(t, err, "terminal")
	if ev.Type != domain.EventError || ev.Seq != 2 || ev.Error == nil || ev.Error.Code != domain.CodeProviderError {
		t.Fatalf("terminal %+v", ev)
	}
	if msg := ev.Error.Message; len(msg) < 1<<10 || !strings.HasPrefix(msg, "xxxx") {
		t.Errorf("message of %d bytes", len(msg))
	}
	if o := recv(t, p.ctx, p.node.runEnded, "run end"); o.Outcome != "completed" {
		t.Errorf("node outcome %+v", o)
	}
}

// The edge collects a command's result only up to a limit: a node sending
// more (run_get and runs are commands the edge issues on its own) gets the
// stream reset and the command fails with result_too_large, instead of the
// edge buffering whatever the node sends. The link goes on.
func TestCommandResultOverLimitFails(t *testing.T) {
	const limit = 1 << 20
	size := make(chan int, 1)
	p := newPair(t, pairOptions{server: Config{commandResultLimit: limit}}, func(_ *fakeEdge, n *fakeNode) {
		n.onCommand = func(ctx context.Context, _ string, _ []byte, _ func([]byte) error) ([]byte, error) {
			return bytes.Repeat([]byte("r"), <-size), nil
		}
	})
	size <- limit + 1
	cs, err := p.link.Command(p.ctx, "runs", nil)
	mustf(t, err, "Command")
	r, err := cs.Recv(p.ctx)
	if err == nil {
		t.Fatalf("a result of %d bytes was accepted (final=%v, %d bytes) past the %d-byte limit", limit+1, r.Final, len(r.Result), limit)
	}
	if domain.CodeOf(err) != domain.CodeResultTooLarge || !strings.Contains(err.Error(), "larger than the edge accepts") {
		t.Errorf("error %v (code %s), want result_too_large", err, domain.CodeOf(err))
	}
	if _, err := cs.Recv(p.ctx); err != io.EOF {
		t.Errorf("after the failure: %v", err)
	}
	cs.Close()
	// The node was told: its stream ends, and nothing of it is left on either side.
	node := p.cli.currentConn()
	eventually(t, p.ctx, "the command's stream gone on both sides", func() bool {
		return node.Stats().Streams == 0 && p.link.conn.Stats().Streams == 0
	})

	// A result of exactly the limit is whole, on the same link.
	size <- limit
	cs, err = p.link.Command(p.ctx, "runs", nil)
	mustf(t, err, "Command")
	defer cs.Close()
	r, err = cs.Recv(p.ctx)
	mustf(t, err, "Recv at the limit")
	if !r.Final || len(r.Result) != limit {
		t.Errorf("final=%v, %d bytes; want the whole %d", r.Final, len(r.Result), limit)
	}
	if err := p.link.conn.Err(); err != nil {
		t.Errorf("link ended: %v", err)
	}
}

func TestCommandResultLimitDefault(t *testing.T) {
	if got := (Config{}).withDefaults().commandResultLimit; got != MaxCommandResult {
		t.Errorf("default limit %d, want %d", got, MaxCommandResult)
	}
	if got := (Config{MaxFrameSize: 64 << 20}).withDefaults().commandResultLimit; got != 4*(64<<20) {
		t.Errorf("limit with 64 MiB frames %d, want four frames", got)
	}
}

// stallingBody is a caller's body that sends nothing: a Read waits until
// Close. reading counts the Reads in progress.
type stallingBody struct {
	reading atomic.Int32
	closed  chan struct{}
	once    sync.Once
}

func (b *stallingBody) Read([]byte) (int, error) {
	b.reading.Add(1)
	defer b.reading.Add(-1)
	<-b.closed
	return 0, errors.New("body closed")
}

func (b *stallingBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

// A tunnel that ends while its uploader waits for the caller's body (the
// node answered without reading it) does not leave the uploader reading:
// Close closes the body, which ends the read, and returns only once the
// uploader has. It used to give the uploader up after a second, still
// reading a body its owner (an HTTP handler) was done with.
func TestTunnelCloseEndsAStalledBodyRead(t *testing.T) {
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(_ context.Context, _ domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 413})
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelEnd})
		}
	})
	body := &stallingBody{closed: make(chan struct{})}
	defer body.Close() // the old Close left it read
	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Method: "POST"}, body)
	mustf(t, err, "OpenTunnel")
	for {
		f, err := ts.Recv(p.ctx)
		mustf(t, err, "Recv")
		if f.Kind == domain.TunnelEnd {
			break
		}
	}
	eventually(t, p.ctx, "the uploader waiting for the body", func() bool { return body.reading.Load() == 1 })
	ts.Close()
	if n := body.reading.Load(); n != 0 {
		t.Fatalf("Close returned with %d read(s) of the body in progress", n)
	}
	select {
	case <-ts.(*tunnelStream).upload:
	default:
		t.Fatal("Close returned before the uploader did")
	}
}

// reportStats does not trust its caller for the floor: a ClientConfig
// built in code with a nanosecond interval gets MinStatsInterval, not a
// report per nanosecond.
func TestStatsIntervalBelowTheFloorIsRaised(t *testing.T) {
	for d, want := range map[time.Duration]time.Duration{
		0:                    DefaultStatsInterval,
		-time.Second:         DefaultStatsInterval,
		time.Nanosecond:      MinStatsInterval,
		MinStatsInterval - 1: MinStatsInterval,
		MinStatsInterval:     MinStatsInterval,
		time.Minute:          time.Minute,
	} {
		if got := statsInterval(d); got != want {
			t.Errorf("statsInterval(%s) = %s, want %s", d, got, want)
		}
	}
	var calls atomic.Int64
	p := newPair(t, pairOptions{}, nil)
	start := time.Now()
	r := reportStats(p.ctx, p.cli.currentConn(), func() domain.NodeStats { calls.Add(1); return domain.NodeStats{} }, time.Nanosecond)
	time.Sleep(350 * time.Millisecond)
	r.stop()
	// Bounded by the time that really passed, so a slow machine's long
	// sleep is no failure; unclamped it was tens of thousands.
	el := time.Since(start)
	if n := calls.Load(); n > int64(el/MinStatsInterval)+1 {
		t.Fatalf("%d reports in %s with a 1ns interval, want at most one per %s", n, el, MinStatsInterval)
	}
}
