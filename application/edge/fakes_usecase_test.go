package edge_test

// Hand-written fakes for the edge use-case tests. Every identifier here is
// prefixed "uc" so these files share the edge_test package with other test
// files without clashing.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// ucWait bounds every wait in these tests.
const ucWait = 5 * time.Second

// ucNoLeaks fails t if goroutines started during the test outlive it. Call
// it first so its cleanup runs after every other cleanup (Stop and friends).
func ucNoLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// ucRecv is one scripted answer of a run stream.
type ucRecv struct {
	ev  domain.RunEvent
	err error
}

// ucRunStream is a ports.RunStream fed by the test (push, fail); Recv blocks
// until an answer is queued or ctx ends.
type ucRunStream struct {
	ch        chan ucRecv
	closeOnce sync.Once
	closed    chan struct{}
}

func newUCRunStream() *ucRunStream {
	return &ucRunStream{ch: make(chan ucRecv, 256), closed: make(chan struct{})}
}

func (s *ucRunStream) Recv(ctx context.Context) (domain.RunEvent, error) {
	select {
	case r := <-s.ch:
		return r.ev, r.err
	case <-ctx.Done():
		return domain.RunEvent{}, ctx.Err()
	}
}

func (s *ucRunStream) Close() { s.closeOnce.Do(func() { close(s.closed) }) }

func (s *ucRunStream) push(evs ...domain.RunEvent) {
	for _, ev := range evs {
		s.ch <- ucRecv{ev: ev}
	}
}

func (s *ucRunStream) fail(err error) { s.ch <- ucRecv{err: err} }

func (s *ucRunStream) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// ucCmdStream is a ports.CommandStream answering scripted replies in order;
// with block set (or once the replies run out) Recv waits for ctx.
type ucCmdStream struct {
	replies []ports.CommandReply
	block   bool
	closed  chan struct{}
	once    sync.Once
}

func (s *ucCmdStream) Recv(ctx context.Context) (ports.CommandReply, error) {
	if !s.block && len(s.replies) > 0 {
		r := s.replies[0]
		s.replies = s.replies[1:]
		return r, nil
	}
	<-ctx.Done()
	return ports.CommandReply{}, ctx.Err()
}

func (s *ucCmdStream) Close() { s.once.Do(func() { close(s.closed) }) }

// ucLink is a ports.NodeLink that records every call. Runs get a fresh
// ucRunStream the test drives; the other methods answer from fields set
// before use.
type ucLink struct {
	id string

	startErr error
	// refuse makes every run refused at admission with this error; silent
	// leaves the admission answer to the test.
	refuse *domain.ErrorInfo
	silent bool
	// cancelErr is what CancelRun answers; with cancelEnds set and a nil
	// cancelErr, CancelRun also ends the run's stream with a cancelled event,
	// as a node would.
	cancelErr  error
	cancelEnds bool
	termErr    error
	pushErr    error
	// commands maps a command name to its replies; an unknown name answers
	// unknown_command. commandErr fails Command itself.
	commands   map[string][]ports.CommandReply
	blockCmds  bool
	commandErr error
	// onClose runs when Close is called (the transport reporting the drop).
	onClose func(reason string)

	mu         sync.Mutex
	started    []domain.RunRequest
	streams    map[string]*ucRunStream
	cancels    []string
	reasons    []string // each cancel's reason, as cancels
	terminates []string
	cmdCalls   []string
	cmdStreams []*ucCmdStream
	pushed     []domain.NodeConfig
	closes     []string
}

var _ ports.NodeLink = (*ucLink)(nil)

func (l *ucLink) StartRun(_ context.Context, req domain.RunRequest) (ports.RunStream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.started = append(l.started, req)
	if l.startErr != nil {
		return nil, l.startErr
	}
	if l.streams == nil {
		l.streams = map[string]*ucRunStream{}
	}
	s := newUCRunStream()
	// A node answers a run it admits with start (seq 1) first; refuse makes
	// it answer with that terminal error instead.
	if l.refuse != nil {
		e := *l.refuse
		s.push(domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventError, Error: &e})
	} else if !l.silent {
		s.push(domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventStart})
	}
	l.streams[req.RunID] = s
	return s, nil
}

func (l *ucLink) CancelRun(_ context.Context, runID, reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancels = append(l.cancels, runID)
	l.reasons = append(l.reasons, reason)
	if l.cancelErr != nil {
		return l.cancelErr
	}
	if s := l.streams[runID]; s != nil && l.cancelEnds {
		msg := reason // as the node records it
		if msg == "" {
			msg = "cancelled by request"
		}
		s.push(domain.RunEvent{RunID: runID, Seq: 99, Type: domain.EventCancelled, Error: &domain.ErrorInfo{Code: domain.CodeCancelled, Message: msg}})
	}
	return nil
}

func (l *ucLink) TerminateSession(_ context.Context, adapter, target, sessionID string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.terminates = append(l.terminates, adapter+"/"+target+"/"+sessionID)
	return l.termErr
}

func (l *ucLink) Command(_ context.Context, name string, args []byte) (ports.CommandStream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cmdCalls = append(l.cmdCalls, name+" "+string(args))
	if l.commandErr != nil {
		return nil, l.commandErr
	}
	replies, ok := l.commands[name]
	if !ok {
		replies = []ports.CommandReply{{Final: true, Err: domain.Errorf(domain.CodeUnknownCommand, "unknown command %q", name)}}
	}
	s := &ucCmdStream{replies: slices.Clone(replies), block: l.blockCmds, closed: make(chan struct{})}
	l.cmdStreams = append(l.cmdStreams, s)
	return s, nil
}

func (l *ucLink) OpenTunnel(context.Context, domain.TunnelRequest, io.Reader) (ports.TunnelStream, error) {
	return nil, errors.New("ucLink: no tunnels")
}

func (l *ucLink) PushConfig(_ context.Context, cfg domain.NodeConfig) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pushErr != nil {
		return l.pushErr
	}
	l.pushed = append(l.pushed, cfg)
	return nil
}

func (l *ucLink) Close(reason string) {
	l.mu.Lock()
	l.closes = append(l.closes, reason)
	onClose := l.onClose
	l.mu.Unlock()
	if onClose != nil {
		onClose(reason)
	}
}

// stream returns the stream of run id, failing t if the run was not started here.
func (l *ucLink) stream(t *testing.T, runID string) *ucRunStream {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streams[runID]
	if s == nil {
		t.Fatalf("node %s never started run %s", l.id, runID)
	}
	return s
}

func (l *ucLink) snapshot() (started []domain.RunRequest, cancels, terminates, cmds []string, pushed []domain.NodeConfig, closes []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.started), slices.Clone(l.cancels), slices.Clone(l.terminates), slices.Clone(l.cmdCalls), slices.Clone(l.pushed), slices.Clone(l.closes)
}

func (l *ucLink) cancelReasons() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reasons)
}

func (l *ucLink) cancelCalls() []string {
	_, c, _, _, _, _ := l.snapshot()
	return c
}

// ucBus is a recording ports.EventPublisher.
type ucBus struct {
	mu     sync.Mutex
	events []domain.BusEvent
	notify chan struct{}
}

func newUCBus() *ucBus { return &ucBus{notify: make(chan struct{}, 1)} }

func (b *ucBus) Publish(ev domain.BusEvent) {
	b.mu.Lock()
	b.events = append(b.events, ev)
	b.mu.Unlock()
	select {
	case b.notify <- struct{}{}:
	default:
	}
}

func (b *ucBus) all() []domain.BusEvent {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.events)
}

func (b *ucBus) ofType(typ string) []domain.BusEvent {
	var out []domain.BusEvent
	for _, ev := range b.all() {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// runEvents returns the run events published for runID, in order.
func (b *ucBus) runEvents(runID string) []domain.RunEvent {
	var out []domain.RunEvent
	for _, ev := range b.ofType(domain.BusRunEvent) {
		if ev.Run != nil && ev.Run.RunID == runID {
			out = append(out, *ev.Run)
		}
	}
	return out
}

// waitFor waits until ok holds over the published events.
func (b *ucBus) waitFor(t *testing.T, what string, ok func([]domain.BusEvent) bool) []domain.BusEvent {
	t.Helper()
	deadline := time.NewTimer(ucWait)
	defer deadline.Stop()
	for {
		evs := b.all()
		if ok(evs) {
			return evs
		}
		select {
		case <-b.notify:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s; bus saw %s", what, ucDescribe(evs))
		}
	}
}

// waitTerminal waits until the bus has the terminal event of runID.
func (b *ucBus) waitTerminal(t *testing.T, runID string) []domain.RunEvent {
	t.Helper()
	b.waitFor(t, "terminal event of "+runID, func([]domain.BusEvent) bool {
		return slices.ContainsFunc(b.runEvents(runID), func(ev domain.RunEvent) bool { return ev.Type.Terminal() })
	})
	return b.runEvents(runID)
}

func ucDescribe(evs []domain.BusEvent) string {
	s := "["
	for i, ev := range evs {
		if i > 0 {
			s += ", "
		}
		s += ev.Type
		if ev.Run != nil {
			s += fmt.Sprintf("(%s #%d %s)", ev.Run.RunID, ev.Run.Seq, ev.Run.Type)
		}
		if ev.Node != "" || ev.Reason != "" {
			s += fmt.Sprintf("{%s %q}", ev.Node, ev.Reason)
		}
	}
	return s + "]"
}

// ucDir is a ports.NodeDirectory (and DirectoryReplacer) over a slice of
// records; it counts replacements.
type ucDir struct {
	mu       sync.Mutex
	recs     []domain.NodeRecord
	replaced int
	authErr  error // when set, Authenticate fails with it
}

var _ edge.Directory = (*ucDir)(nil)

func (d *ucDir) Authenticate(token string) (domain.NodeRecord, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.authErr != nil {
		return domain.NodeRecord{}, d.authErr
	}
	for _, r := range d.recs {
		if r.Token != "" && r.Token == token {
			return r, nil
		}
	}
	return domain.NodeRecord{}, fmt.Errorf("authenticate: %w", domain.ErrUnknownToken)
}

func (d *ucDir) Records() []domain.NodeRecord {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.recs)
}

func (d *ucDir) Replace(recs []domain.NodeRecord) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.recs = slices.Clone(recs)
	d.replaced++
}

func (d *ucDir) replacements() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.replaced
}

// ucSource is a ports.NodeSource answering fixed records (and settings
// that need a restart) or an error.
type ucSource struct {
	recs         []domain.NodeRecord
	needsRestart []string
	err          error
}

func (s *ucSource) LoadNodes() ([]domain.NodeRecord, []string, error) {
	return s.recs, s.needsRestart, s.err
}

// ucExecAdapter is a valid exec adapter config with one target.
func ucExecAdapter(name string, maxConc int, targets ...string) domain.AdapterConfig {
	a := domain.AdapterConfig{Name: name, Type: domain.AdapterExec, MaxConcurrency: maxConc, Targets: map[string]domain.ExecTarget{}}
	for _, tg := range targets {
		a.Targets[tg] = domain.ExecTarget{Command: []string{"cat"}}
	}
	return a
}

// ucAdmit puts a live node with the named adapters into reg and returns its link.
func ucAdmit(t *testing.T, reg *edge.Registry, id string, adapters ...string) *ucLink {
	t.Helper()
	l := &ucLink{id: id}
	cfg := domain.NodeConfig{NodeID: id, Version: 1}
	for _, a := range adapters {
		cfg.Adapters = append(cfg.Adapters, ucExecAdapter(a, 4, "t"))
	}
	if err := reg.Admit(&edge.LiveNode{ID: id, Link: l, Config: cfg, ConnectedAt: time.Now()}); err != nil {
		t.Fatalf("admit %s: %v", id, err)
	}
	return l
}

// ucCode returns the domain code of err, or "" for nil.
func ucCode(err error) string {
	if err == nil {
		return ""
	}
	return domain.CodeOf(err)
}

// ucWithin runs f and fails t if it does not return within ucWait.
func ucWithin(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(ucWait):
		t.Fatalf("%s did not return within %s", what, ucWait)
	}
}

// ucEventually polls cond, for states with no channel to wait on (the
// registry's in-flight counts, updated by a background goroutine).
func ucEventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(ucWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
