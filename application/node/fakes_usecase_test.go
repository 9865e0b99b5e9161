package node_test

// Hand-written fakes for the node use-case tests. Every identifier here is
// prefixed "uc" so these files share the node_test package with other test
// files without clashing.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/adapters/store/memory"
	"iop/application/node"
	"iop/domain"
	"iop/ports"
)

// ucWait bounds every wait in these tests.
const ucWait = 5 * time.Second

// ucNoLeaks fails t if goroutines started during the test outlive it. Call
// it first so its cleanup runs after every other cleanup.
func ucNoLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// ucExecFunc is what a fake adapter does for one run.
type ucExecFunc func(ctx context.Context, req domain.RunRequest, sink ports.EventSink) error

// ucAdapter is a ports.RuntimeAdapter whose behaviour per run is chosen by
// the run's target from script (the "" entry is the default). It records
// the runs it started, the errors Emit returned, and whether it was closed.
type ucAdapter struct {
	name   string
	caps   domain.Capabilities
	script map[string]ucExecFunc

	started chan string // run ids, as Execute begins

	mu       sync.Mutex
	runs     []string
	emitErrs []error
	closed   int
}

func newUCAdapter(name string, caps domain.Capabilities, script map[string]ucExecFunc) *ucAdapter {
	return &ucAdapter{name: name, caps: caps, script: script, started: make(chan string, 1024)}
}

func (a *ucAdapter) Capabilities() domain.Capabilities { return a.caps }

func (a *ucAdapter) Execute(ctx context.Context, req domain.RunRequest, sink ports.EventSink) error {
	a.mu.Lock()
	a.runs = append(a.runs, req.RunID)
	a.mu.Unlock()
	a.started <- req.RunID
	f := a.script[req.Target]
	if f == nil {
		f = a.script[""]
	}
	if f == nil {
		return errors.New("ucAdapter: no script for target " + req.Target)
	}
	return f(ctx, req, &ucRecordingSink{a: a, sink: sink})
}

func (a *ucAdapter) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed++
	return nil
}

func (a *ucAdapter) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed > 0
}

func (a *ucAdapter) closeCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

func (a *ucAdapter) ranRuns() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.runs)
}

func (a *ucAdapter) emitErrors() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.emitErrs)
}

// waitStarted waits until Execute has begun run id.
func (a *ucAdapter) waitStarted(t *testing.T, id string) {
	t.Helper()
	timeout := time.After(ucWait)
	for {
		select {
		case got := <-a.started:
			if got == id {
				return
			}
		case <-timeout:
			t.Fatalf("adapter %s never started run %s", a.name, id)
		}
	}
}

// ucRecordingSink passes events on and records Emit's errors.
type ucRecordingSink struct {
	a    *ucAdapter
	sink ports.EventSink
}

func (s *ucRecordingSink) Emit(ev domain.RunEvent) error {
	err := s.sink.Emit(ev)
	if err != nil {
		s.a.mu.Lock()
		s.a.emitErrs = append(s.a.emitErrs, err)
		s.a.mu.Unlock()
	}
	return err
}

// Finish passes ports.Finisher on: the run manager's sink has it.
func (s *ucRecordingSink) Finish() error { return s.sink.(ports.Finisher).Finish() }

// Script building blocks.

// ucEmit emits evs in order and returns ret.
func ucEmit(ret error, evs ...domain.RunEvent) ucExecFunc {
	return func(_ context.Context, _ domain.RunRequest, sink ports.EventSink) error {
		for _, ev := range evs {
			_ = sink.Emit(ev)
		}
		return ret
	}
}

// ucBlock emits evs, then waits for ctx and returns its error, as an
// adapter that stops its work on cancel does.
func ucBlock(evs ...domain.RunEvent) ucExecFunc {
	return func(ctx context.Context, _ domain.RunRequest, sink ports.EventSink) error {
		for _, ev := range evs {
			_ = sink.Emit(ev)
		}
		<-ctx.Done()
		return ctx.Err()
	}
}

// ucGate emits before, waits for gate (or ctx), then emits after and returns nil.
func ucGate(gate <-chan struct{}, before []domain.RunEvent, after ...domain.RunEvent) ucExecFunc {
	return func(ctx context.Context, _ domain.RunRequest, sink ports.EventSink) error {
		for _, ev := range before {
			_ = sink.Emit(ev)
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		for _, ev := range after {
			_ = sink.Emit(ev)
		}
		return nil
	}
}

func ucDelta(text string) domain.RunEvent {
	return domain.RunEvent{Type: domain.EventDelta, Text: text}
}

func ucComplete(u *domain.Usage) domain.RunEvent {
	return domain.RunEvent{Type: domain.EventComplete, Usage: u}
}

// ucSessionAdapter keeps logical sessions (SessionTerminator, SessionLister).
type ucSessionAdapter struct {
	*ucAdapter
	termErr  error
	sessions []domain.SessionInfo

	smu        sync.Mutex
	terminated []string // "target/session"
	// stored, if set, are the sessions the adapter keeps, as a store
	// would: terminating one forgets it, any other is session_not_found.
	stored map[string]bool
}

func (a *ucSessionAdapter) TerminateSession(_ context.Context, target, sessionID string) error {
	a.smu.Lock()
	defer a.smu.Unlock()
	a.terminated = append(a.terminated, target+"/"+sessionID)
	if a.stored != nil {
		if !a.stored[sessionID] {
			return domain.Errorf(domain.CodeSessionNotFound, "no session %q", sessionID)
		}
		delete(a.stored, sessionID)
	}
	return a.termErr
}

// ListSessions pages the sessions as a store does, keyed by the adapter's
// name (which a real adapter's store keys them by: its configured name).
func (a *ucSessionAdapter) ListSessions(_ context.Context, q domain.SessionQuery) ([]domain.SessionInfo, error) {
	all := slices.Clone(a.sessions)
	for i := range all {
		all[i].Adapter = a.name
	}
	return domain.PageSessions(all, q), nil
}

func (a *ucSessionAdapter) terminations() []string {
	a.smu.Lock()
	defer a.smu.Unlock()
	return slices.Clone(a.terminated)
}

// ucCommandAdapter serves node commands (CommandRunner): it sends each of
// progress, then answers result.
type ucCommandAdapter struct {
	*ucAdapter
	progress []string
	result   string

	cmu   sync.Mutex
	calls []string // "name args"
}

func (a *ucCommandAdapter) RunCommand(_ context.Context, name string, args []byte, progress func([]byte) error) ([]byte, error) {
	a.cmu.Lock()
	a.calls = append(a.calls, name+" "+string(args))
	a.cmu.Unlock()
	for _, p := range a.progress {
		if err := progress([]byte(p)); err != nil {
			return nil, err
		}
	}
	return []byte(a.result), nil
}

// ucFactory is a ports.AdapterFactory: build makes an adapter for a config,
// fail makes the named adapters fail to build. It records what it built.
type ucFactory struct {
	build func(cfg domain.AdapterConfig) ports.RuntimeAdapter
	fail  map[string]error

	mu    sync.Mutex
	built map[string][]ports.RuntimeAdapter
}

func (f *ucFactory) Build(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error) {
	if err := f.fail[cfg.Name]; err != nil {
		return nil, err
	}
	a := f.build(cfg)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.built == nil {
		f.built = map[string][]ports.RuntimeAdapter{}
	}
	f.built[cfg.Name] = append(f.built[cfg.Name], a)
	return a, nil
}

// instances returns the instances built for adapter name, oldest first.
func (f *ucFactory) instances(name string) []ports.RuntimeAdapter {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.built[name])
}

// ucOutput is a ports.RunOutput recording the events it is given. Done is
// closed by leave; with failAfterDone set, Emit then fails (a gone edge).
type ucOutput struct {
	failAfterDone bool
	// onTerminal, if set, runs inside Emit when the terminal event arrives,
	// before Emit returns: it sees the node exactly as a caller receiving
	// that event would.
	onTerminal func(ev domain.RunEvent)

	mu        sync.Mutex
	events    []domain.RunEvent
	done      chan struct{}
	leaveOnce sync.Once
	closed    chan struct{}
	closeOnce sync.Once
	notify    chan struct{}
}

func newUCOutput() *ucOutput {
	return &ucOutput{done: make(chan struct{}), closed: make(chan struct{}), notify: make(chan struct{}, 1)}
}

var _ ports.RunOutput = (*ucOutput)(nil)

func (o *ucOutput) Emit(_ context.Context, ev domain.RunEvent) error {
	if o.failAfterDone {
		select {
		case <-o.done:
			return errors.New("ucOutput: edge gone")
		default:
		}
	}
	o.mu.Lock()
	o.events = append(o.events, ev)
	o.mu.Unlock()
	select {
	case o.notify <- struct{}{}:
	default:
	}
	if ev.Type.Terminal() && o.onTerminal != nil {
		o.onTerminal(ev)
	}
	return nil
}

func (o *ucOutput) Done() <-chan struct{} { return o.done }
func (o *ucOutput) Close()                { o.closeOnce.Do(func() { close(o.closed) }) }
func (o *ucOutput) leave()                { o.leaveOnce.Do(func() { close(o.done) }) }

func (o *ucOutput) all() []domain.RunEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.events)
}

// wait waits until ok holds over the recorded events.
func (o *ucOutput) wait(t *testing.T, what string, ok func([]domain.RunEvent) bool) []domain.RunEvent {
	t.Helper()
	deadline := time.NewTimer(ucWait)
	defer deadline.Stop()
	for {
		if evs := o.all(); ok(evs) {
			return evs
		}
		select {
		case <-o.notify:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s; got %s", what, ucTypes(o.all()))
		}
	}
}

// waitClosed waits until the run manager closed the output (after the
// terminal event) and returns every event.
func (o *ucOutput) waitClosed(t *testing.T) []domain.RunEvent {
	t.Helper()
	select {
	case <-o.closed:
	case <-time.After(ucWait):
		t.Fatalf("run did not end within %s; got %s", ucWait, ucTypes(o.all()))
	}
	return o.all()
}

func ucTypes(evs []domain.RunEvent) string {
	s := "["
	for i, ev := range evs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%d:%s", ev.Seq, ev.Type)
		if ev.Error != nil {
			s += "(" + ev.Error.Code + ")"
		}
	}
	return s + "]"
}

// ucCheckStream checks the invariants of every run's stream: all events
// carry runID, seq runs 1..n without gaps, and exactly one event is
// terminal, the last. It returns the terminal event.
func ucCheckStream(t *testing.T, runID string, evs []domain.RunEvent) domain.RunEvent {
	t.Helper()
	if len(evs) == 0 {
		t.Fatalf("run %s produced no events", runID)
	}
	for i, ev := range evs {
		if ev.RunID != runID {
			t.Fatalf("event %d has run id %q, want %q", i, ev.RunID, runID)
		}
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d, want %d: %s", i, ev.Seq, i+1, ucTypes(evs))
		}
		if ev.Time.IsZero() {
			t.Fatalf("event %d has no time", i)
		}
		if ev.Type.Terminal() != (i == len(evs)-1) {
			t.Fatalf("terminal events misplaced: %s", ucTypes(evs))
		}
	}
	return evs[len(evs)-1]
}

// ucNode is a node's run side over fakes and the in-memory store.
type ucNode struct {
	rt      *node.Runtime
	store   *memory.RunStore
	runs    *node.RunManager
	factory *ucFactory
	// adapters maps an adapter name to the adapter its next build returns.
	adapters map[string]ports.RuntimeAdapter
}

// ucAdapterCfg is an adapter config as the edge would push it.
func ucAdapterCfg(name string, maxConc int) domain.AdapterConfig {
	return domain.AdapterConfig{Name: name, Type: domain.AdapterExec, MaxConcurrency: maxConc,
		Targets: map[string]domain.ExecTarget{"t": {Command: []string{"cat"}}}}
}

// newUCNode builds a runtime whose adapters are the given fakes, keyed by
// name; each is configured with the MaxConcurrency of its capabilities.
func newUCNode(t *testing.T, adapters map[string]ports.RuntimeAdapter) *ucNode {
	t.Helper()
	n := &ucNode{store: memory.NewRunStore(), adapters: adapters}
	n.factory = &ucFactory{build: func(cfg domain.AdapterConfig) ports.RuntimeAdapter { return n.adapters[cfg.Name] }}
	n.rt = node.NewRuntime(n.factory, nil)
	var cfg domain.NodeConfig
	cfg.NodeID, cfg.Version = "n1", 7
	names := make([]string, 0, len(adapters))
	for name := range adapters {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		cfg.Adapters = append(cfg.Adapters, ucAdapterCfg(name, adapters[name].Capabilities().MaxConcurrency))
	}
	if err := n.rt.Apply(cfg); err != nil {
		t.Fatalf("apply: %v", err)
	}
	n.runs = node.NewRunManager(n.rt, n.store, nil)
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() { n.runs.Stop(); close(done) }()
		select {
		case <-done:
		case <-time.After(ucWait):
			t.Errorf("RunManager.Stop did not return within %s", ucWait)
		}
	})
	return n
}

// start runs req in the background and returns its output.
func (n *ucNode) start(req domain.RunRequest) *ucOutput {
	out := newUCOutput()
	go n.runs.ExecuteRun(req, out)
	return out
}

// run runs req to its end and returns its events.
func (n *ucNode) run(t *testing.T, req domain.RunRequest) []domain.RunEvent {
	t.Helper()
	return n.start(req).waitClosed(t)
}

func (n *ucNode) stored(t *testing.T, runID string) domain.RunSnapshot {
	t.Helper()
	r, err := n.store.GetRun(context.Background(), runID)
	if err != nil {
		t.Fatalf("store: %v", err)
	}
	return r.Snapshot()
}

func ucReq(id, adapter, target string) domain.RunRequest {
	return domain.RunRequest{RunID: id, Adapter: adapter, Target: target, Input: []byte("in")}
}

// ucTransport is a ports.TransportStatus with fixed stats.
type ucTransport struct{ stats ports.TransportStats }

func (t ucTransport) TransportStatus() ports.TransportStats { return t.stats }
