package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"iop/domain"
	"iop/internal/lossreport"
	"iop/ports"
)

// MaxEventMetadata bounds the JSON metadata of one event; larger metadata
// (a huge tool input, say) is replaced by {"truncated":true,"bytes":N}.
const MaxEventMetadata = 32 << 10

// MaxEventText is the most text one delta event carries; longer text is
// split into several events at rune boundaries so every frame stays small.
const MaxEventText = 16 << 10

// MaxErrorMessage is the most of an error message a run's events carry
// and its record keeps, in bytes. An upstream's error body may be
// megabytes (a proxy's HTML page, a dump): relayed whole, one was sent to
// its caller and stored whole, and six such runs made the runs command's
// answer larger than the edge accepts. A longer message keeps its head, cut
// at a character boundary and marked (see clipMessage).
const MaxErrorMessage = domain.MaxPeerMessage

var (
	errCancelRequested = errors.New("cancelled by request")
	errCallerLeft      = errors.New("caller went away")
	errSessionEnded    = errors.New("session terminated")
	errShutdown        = errors.New("node shutting down")
)

type sessionKey struct{ adapter, session string }

type activeRun struct {
	req    domain.RunRequest
	in     *instance // the adapter instance it runs on (one a refresh may have retired since)
	cancel context.CancelCauseFunc
	guard  *guard
	done   chan struct{} // closed once Execute has returned and the run's slot and session are free
	// record is the run as its store holds it while it executes (created
	// and started when admitted).
	record domain.RunSnapshot
}

// RunManager executes runs: it admits them against adapter capacity, records
// them in the store, relays their events in order with per-run sequence
// numbers, and guarantees exactly one terminal event, last.
type RunManager struct {
	rt    *Runtime
	store ports.RunStore
	log   *slog.Logger
	now   func() time.Time

	base context.Context
	stop context.CancelCauseFunc
	wg   sync.WaitGroup

	// lost logs the run records the store could not take (a full disk):
	// one line for the first, then one per lostLogEvery with a count.
	lost *lossreport.Reporter

	mu       sync.Mutex
	stopped  bool // no run is admitted once Stop has begun
	active   map[string]*activeRun
	sessions map[sessionKey]string
	missed   missedCancels
}

// Missed cancels. The transport hands a run request and a cancel request
// that follows right behind it (the edge cancels a run whose caller left
// during admission) to goroutines of their own, so the cancel can reach
// CancelRun before ExecuteRun has registered the run. CancelRun then
// remembers the id, for missedCancelTTL and at most maxMissedCancels ids
// (the oldest is forgotten first), and a run that registers under a
// remembered id ends cancelled without starting. Run ids are the edge's,
// never reused, so a remembered id names only that run.
const (
	missedCancelTTL  = 30 * time.Second
	maxMissedCancels = 1024
)

// missedCancels is the remembered ids, with an insertion-ordered queue for
// expiry. Guarded by RunManager.mu.
type missedCancels struct {
	at    map[string]missedAt
	queue []missedCancel
}

// missedAt is when a missed cancel came and why (CancelRun's reason).
type missedAt struct {
	at     time.Time
	reason string
}

type missedCancel struct {
	id string
	at time.Time
}

// add remembers id at now with the cancel's reason, forgetting what
// expired or overflows.
func (c *missedCancels) add(id, reason string, now time.Time) {
	if c.at == nil {
		c.at = map[string]missedAt{}
	}
	c.at[id] = missedAt{now, reason}
	c.queue = append(c.queue, missedCancel{id, now})
	for len(c.queue) > 0 && (len(c.queue) > maxMissedCancels || now.Sub(c.queue[0].at) >= missedCancelTTL) {
		old := c.queue[0]
		c.queue[0] = missedCancel{}
		c.queue = c.queue[1:]
		if m, ok := c.at[old.id]; ok && m.at.Equal(old.at) {
			delete(c.at, old.id)
		}
	}
}

// take reports whether id was remembered within the TTL, and forgets it:
// it returns then the error that ends the run (cancelledBeforeStart).
func (c *missedCancels) take(id string, now time.Time) error {
	m, ok := c.at[id]
	if !ok {
		return nil
	}
	delete(c.at, id)
	if now.Sub(m.at) >= missedCancelTTL {
		return nil
	}
	msg := errCancelRequested.Error() + " before it started"
	if m.reason != "" {
		msg = m.reason + " (before it started)"
	}
	return cancelledBeforeStart(msg)
}

// cancelledBeforeStart ends a run whose cancel arrived before it did; it
// is the run's message.
type cancelledBeforeStart string

func (e cancelledBeforeStart) Error() string { return string(e) }

// NewRunManager refuses nil dependencies.
func NewRunManager(rt *Runtime, store ports.RunStore, log *slog.Logger) *RunManager {
	if rt == nil || store == nil {
		panic("node.NewRunManager: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	m := &RunManager{rt: rt, store: store, log: log, now: time.Now, base: ctx, stop: cancel,
		active: map[string]*activeRun{}, sessions: map[sessionKey]string{}}
	m.lost = lossreport.New(lostLogEvery, func(err error, attrs []any) {
		log.Error("run record lost: the node store could not be written", append(attrs, "err", err)...)
	}, func(n int, err error) {
		log.Error("run records lost: the node store could not be written", "runs", n, "err", err)
	})
	return m
}

// lostLogEvery is the most often the node logs run records its store
// could not take, after the first (as the edge does for history rows).
const lostLogEvery = 10 * time.Second

// Stop cancels every run and waits for them to record their end. Each run
// ends cancelled with "node shutting down", on the link and in the store.
func (m *RunManager) Stop() {
	m.BeginStop()
	m.wg.Wait()
	m.lost.Close() // the records lost and not logged yet
}

// BeginStop is Stop without the wait: no run is admitted any more, and
// every run in flight is cancelled as the node shutting down. A node calls
// it before it closes its link to the edge, so that runs whose streams
// then end are not taken for runs whose caller left. Idempotent.
func (m *RunManager) BeginStop() {
	m.mu.Lock()
	m.stopped = true
	active := make([]*activeRun, 0, len(m.active))
	for _, ar := range m.active {
		active = append(active, ar)
	}
	m.mu.Unlock()
	// The shutdown claims each run's end before its context is cancelled:
	// an adapter whose event send is abandoned by the cancel must not make
	// it look as if the caller had left. Runs not registered yet see the
	// cause through their context (guard.Emit, decide).
	for _, ar := range active {
		m.cancel(ar, errShutdown)
	}
	m.stop(errShutdown)
}

// recoverBatch is how many unfinished runs Recover lists at a time (the
// stores' largest page).
const recoverBatch = 1000

// Recover marks runs left running or queued by a previous process as
// failed, however many there are: each pass finishes the runs it listed,
// so the next lists the rest, until none is left. A store that lists a run
// again after it was finished (one it cannot update) would keep Recover
// going for ever: a pass with nothing new ends it with an error instead.
func (m *RunManager) Recover(ctx context.Context) error {
	ev := domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: domain.CodeRunFailed, Message: "node restarted while the run was in flight"}}
	for _, st := range []domain.RunStatus{domain.RunRunning, domain.RunQueued} {
		finished := map[string]bool{}
		for {
			runs, err := m.store.ListRuns(ctx, domain.RunFilter{Status: st, Limit: recoverBatch})
			if err != nil {
				return fmt.Errorf("list unfinished runs: %w", err)
			}
			if len(runs) == 0 {
				break
			}
			fresh := 0
			for _, r := range runs {
				if finished[r.ID()] {
					continue
				}
				finished[r.ID()], fresh = true, fresh+1
				if err := m.store.UpdateRun(ctx, r.ID(), func(run *domain.Run) error { return run.Finish(ev, m.now()) }); err != nil && !errors.Is(err, domain.ErrRunAlreadyFinished) {
					return fmt.Errorf("recover run %s: %w", r.ID(), err)
				}
			}
			if fresh == 0 {
				return fmt.Errorf("recover: %d runs still listed as %s after they were marked failed (first: %s)", len(runs), st, runs[0].ID())
			}
		}
	}
	return nil
}

// InFlight returns the number of runs executing now.
func (m *RunManager) InFlight() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.active)
}

// ExecuteRun runs req to its end. It blocks; events go to out.
//
// The first event is the admission answer the edge waits for before it
// answers its caller: start once the run holds a slot, is registered (so a
// cancel finds it) and is recorded; or, for a run refused (shutting down,
// invalid, adapter or target unknown, at capacity, session busy), a terminal
// error and nothing else. A foreground
// run is cancelled when out is done (the edge or caller left); a background
// run keeps going and records its outcome in the store.
func (m *RunManager) ExecuteRun(req domain.RunRequest, out ports.RunOutput) {
	defer out.Close()
	g := newGuard(req.RunID, out, req.Background, m.now)
	// Admission to the wait group happens under the lock Stop takes, so no
	// run starts while Stop waits.
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		g.sendTerminal(domain.ErrorEvent(req.RunID, domain.Errorf(domain.CodeShuttingDown, "the node is shutting down")))
		return
	}
	m.wg.Add(1)
	m.mu.Unlock()
	defer m.wg.Done()
	if err := req.Validate(); err != nil {
		g.sendTerminal(domain.ErrorEvent(req.RunID, err))
		return
	}
	// A run its adapter cannot serve is refused as such, before capacity.
	admitted, _ := m.rt.lookup(req.Adapter)
	if admitted != nil {
		if err := admit(admitted, req); err != nil {
			m.reject(req, g, err)
			return
		}
	}
	in, release, err := m.rt.acquire(req.Adapter)
	if err != nil {
		m.reject(req, g, err)
		return
	}
	if in != admitted {
		// A config refresh replaced the adapter in between: the run goes
		// to the new instance, so that one must be able to serve it (a
		// target renamed or removed is refused, not started and failed).
		if err := admit(in, req); err != nil {
			release()
			m.reject(req, g, err)
			return
		}
	}
	ctx, cancel := context.WithCancelCause(m.base)
	defer cancel(nil)
	g.ctx = ctx
	now := m.now()
	run, _ := domain.NewRun(req, now)
	_ = run.Start(now)
	ar := &activeRun{req: req, in: in, cancel: cancel, guard: g, done: make(chan struct{}), record: run.Snapshot()}
	if err := m.register(ar); err != nil {
		release()
		if msg, ok := err.(cancelledBeforeStart); ok {
			m.refuse(req, g, domain.RunEvent{Type: domain.EventCancelled, Error: &domain.ErrorInfo{Code: domain.CodeCancelled, Message: string(msg)}})
			return
		}
		m.reject(req, g, err)
		return
	}
	// The record must not depend on the run's context: a cancel that
	// arrives right after admission would otherwise lose the run's record.
	// Should it fail (a full disk), the end writes the whole record.
	recorded := true
	if err := m.store.CreateRun(context.WithoutCancel(ctx), run); err != nil {
		recorded = false
		m.log.Debug("recording run start failed; its end writes the whole record", "run", req.RunID, "err", err)
	}
	g.emitStart()

	finished := make(chan struct{})
	if !req.Background {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			select {
			case <-out.Done():
				m.cancel(ar, errCallerLeft)
			case <-finished:
			}
		}()
	}
	execErr := in.adapter.Execute(ctx, req, g)
	close(finished)
	term := sendable(g.decide(execErr, ctx))
	m.unregister(ar)
	release()
	close(ar.done)
	if err := m.recordEnd(context.WithoutCancel(ctx), run, recorded, term); err != nil {
		m.lost.Lost(1, err, "run", req.RunID, "status", string(domain.StatusFor(term.Type)))
	}
	g.sendTerminal(term)
}

// recordEnd stores a run's end: an update of the record its start wrote,
// or, when that write failed (recorded false) or its row is gone, the
// whole finished record, so that one write that succeeds is enough. run is
// the record as its start wrote it (or meant to).
func (m *RunManager) recordEnd(ctx context.Context, run *domain.Run, recorded bool, term domain.RunEvent) error {
	finish := func(r *domain.Run) error { return r.Finish(term, m.now()) }
	if recorded {
		err := m.store.UpdateRun(ctx, run.ID(), finish)
		if !errors.Is(err, domain.ErrRunNotFound) {
			return err
		}
	}
	if err := finish(run); err != nil {
		return err
	}
	err := m.store.CreateRun(ctx, run)
	if err != nil && !recorded {
		// The start's insert may have reached the store after all.
		if m.store.UpdateRun(ctx, run.ID(), finish) == nil {
			return nil
		}
	}
	return err
}

// reject ends a run that could not start, recording it as failed.
func (m *RunManager) reject(req domain.RunRequest, g *guard, err error) {
	m.refuse(req, g, domain.ErrorEvent(req.RunID, err))
}

// refuse ends a run that did not start with ev, its only event, and
// records it so.
func (m *RunManager) refuse(req domain.RunRequest, g *guard, ev domain.RunEvent) {
	ev = sendable(ev)
	now := m.now()
	if run, nerr := domain.NewRun(req, now); nerr == nil && run.Finish(ev, now) == nil {
		if serr := m.store.CreateRun(context.Background(), run); serr != nil {
			m.lost.Lost(1, serr, "run", req.RunID, "status", string(run.Status()))
		}
	}
	g.sendTerminal(ev)
}

// register makes ar findable by CancelRun and takes its session; after
// BeginStop it refuses ar with shutting_down. Under the same lock CancelRun
// either finds ar or leaves a missed cancel that register sees, and
// BeginStop either finds ar or is seen here.
func (m *RunManager) register(ar *activeRun) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		// BeginStop came after this run's first check, while it was
		// admitted or waited for a slot: it did not see the run, so the
		// run is refused as every later one is, and the edge can place it
		// elsewhere.
		return domain.Errorf(domain.CodeShuttingDown, "the node is shutting down")
	}
	if _, dup := m.active[ar.req.RunID]; dup {
		return domain.Errorf(domain.CodeInvalidRequest, "run %s is already running", ar.req.RunID)
	}
	if err := m.missed.take(ar.req.RunID, m.now()); err != nil {
		return err
	}
	if ar.req.SessionID != "" {
		k := sessionKey{ar.req.Adapter, ar.req.SessionID}
		if other, busy := m.sessions[k]; busy {
			if other == sessionEnding {
				return domain.Errorf(domain.CodeSessionBusy, "session %q is being ended", ar.req.SessionID)
			}
			return domain.Errorf(domain.CodeSessionBusy, "session %q already has run %s in flight", ar.req.SessionID, other)
		}
		m.sessions[k] = ar.req.RunID
	}
	m.active[ar.req.RunID] = ar
	return nil
}

func (m *RunManager) unregister(ar *activeRun) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.active, ar.req.RunID)
	if ar.req.SessionID != "" {
		delete(m.sessions, sessionKey{ar.req.Adapter, ar.req.SessionID})
	}
}

// cancel claims the run's terminal event for cancellation and stops it. It
// reports false when the run had already produced its terminal event.
func (m *RunManager) cancel(ar *activeRun, cause error) bool {
	if !ar.guard.claimCancel(cause) {
		return false
	}
	ar.cancel(cause)
	return true
}

// Running returns the record of a run executing now as its store would
// hold it (running, since it was admitted): what run_get answers for a
// run whose record the store could not take (a full disk), until its end
// writes it whole.
func (m *RunManager) Running(runID string) (domain.RunSnapshot, bool) {
	m.mu.Lock()
	ar := m.active[runID]
	m.mu.Unlock()
	if ar == nil {
		return domain.RunSnapshot{}, false
	}
	return ar.record, true
}

// CancelRun cancels an in-flight run. Errors: run_not_found, run_finished.
// reason, the edge's (the caller left, the edge is shutting down, ...), is
// the cancelled run's message, on its terminal event and in the store;
// empty, it is "cancelled by request" (a user's cancel, or an edge that
// sends no reason). A run not known yet may be on its way (see
// missedCancels): it is cancelled should it arrive within missedCancelTTL,
// but the answer is run_not_found, since it may as well be on another node
// or none.
func (m *RunManager) CancelRun(ctx context.Context, runID, reason string) error {
	reason = domain.ClipMessage(strings.ToValidUTF8(reason, "\uFFFD"), maxCancelReason)
	m.mu.Lock()
	ar := m.active[runID]
	if ar == nil {
		m.missed.add(runID, reason, m.now())
	}
	m.mu.Unlock()
	if ar != nil {
		cause := errCancelRequested
		if reason != "" {
			cause = errors.New(reason)
		}
		if m.cancel(ar, cause) {
			return nil
		}
		return domain.Errorf(domain.CodeRunFinished, "run %s has already finished", runID)
	}
	run, err := m.store.GetRun(ctx, runID)
	if err != nil {
		if errors.Is(err, domain.ErrRunNotFound) {
			return domain.Errorf(domain.CodeRunNotFound, "run %s is not known on this node (should it arrive within %v, it is cancelled)", runID, missedCancelTTL)
		}
		return err
	}
	// Recorded, so it registered and ended already: nothing to remember.
	m.mu.Lock()
	delete(m.missed.at, runID)
	m.mu.Unlock()
	return domain.Errorf(domain.CodeRunFinished, "run %s has already finished (%s)", runID, run.Status())
}

// sessionRun returns the instance the run in flight in session sessionID
// of adapter runs on, or nil when no run of it is in flight.
func (m *RunManager) sessionRun(adapter, sessionID string) *instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ar := m.active[m.sessions[sessionKey{adapter, sessionID}]]; ar != nil {
		return ar.in
	}
	return nil
}

// sessionEnding holds a session's place in RunManager.sessions while its
// adapter forgets it (endSession); no run id looks like it.
const sessionEnding = "\x00ending"

// endSession cancels any run in flight in one session, waits until its
// adapter has returned and the session is free, and then holds the session
// until release is called: the caller asks the adapter to forget the
// session meanwhile, and a run of the same session arriving then is
// refused (session_busy) instead of using — and writing back — a session
// the adapter is deleting. A run that follows release starts fresh.
// stopped reports whether a run was in flight in the session: the session
// existed then, whatever the adapter has stored of it.
func (m *RunManager) endSession(ctx context.Context, adapter, sessionID string) (release func(), stopped bool, err error) {
	k := sessionKey{adapter, sessionID}
	for {
		m.mu.Lock()
		runID, ok := m.sessions[k]
		if !ok {
			m.sessions[k] = sessionEnding
			m.mu.Unlock()
			return func() {
				m.mu.Lock()
				if m.sessions[k] == sessionEnding {
					delete(m.sessions, k)
				}
				m.mu.Unlock()
			}, stopped, nil
		}
		ar := m.active[runID]
		m.mu.Unlock()
		if runID == sessionEnding || ar == nil {
			return nil, false, domain.Errorf(domain.CodeSessionBusy, "session %q is being ended", sessionID)
		}
		m.cancel(ar, errSessionEnded)
		stopped = true
		select {
		case <-ar.done:
		case <-ctx.Done():
			return nil, false, domain.Errorf(domain.CodeTimeout, "run %s in session %q did not stop: %v", runID, sessionID, ctx.Err())
		}
	}
}

// guard is the EventSink an adapter sees. It numbers events, splits long
// text, drops anything after the terminal event, and holds the terminal
// event back until the adapter has returned, so that when a caller sees it
// the run's slot is free and its store record final.
type guard struct {
	runID      string
	out        ports.RunOutput
	background bool
	now        func() time.Time

	sendMu sync.Mutex // orders sends; held across out.Emit
	seq    uint64
	// ctx is the run's context: an event send blocked on the edge's credit
	// is abandoned when the run is cancelled, so the adapter can stop.
	ctx context.Context

	mu        sync.Mutex // guards the terminal decision; never held across I/O
	terminal  *domain.RunEvent
	cancelled error
	decided   bool
	finishing bool // Finish succeeded: no cancel claims the run any more
}

// Finish implements ports.Finisher: it fails with the cancel's cause once
// the run is being cancelled, and otherwise makes the run's end the
// adapter's, whatever cancel comes after (a cancel then answers
// run_finished, as after the terminal event).
func (g *guard) Finish() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cancelled != nil {
		return g.cancelled
	}
	g.finishing = true
	return nil
}

func newGuard(runID string, out ports.RunOutput, background bool, now func() time.Time) *guard {
	return &guard{runID: runID, out: out, background: background, now: now, ctx: context.Background()}
}

// admit asks in's adapter whether it can serve req, if it can tell
// (ports.RunAdmitter).
func admit(in *instance, req domain.RunRequest) error {
	if a, ok := in.adapter.(ports.RunAdmitter); ok {
		return a.Admit(req)
	}
	return nil
}

func (g *guard) emitStart() {
	g.sendMu.Lock()
	defer g.sendMu.Unlock()
	_ = g.send(domain.RunEvent{Type: domain.EventStart})
}

// Emit implements ports.EventSink for the adapter.
func (g *guard) Emit(ev domain.RunEvent) error {
	if !ev.Type.Valid() {
		return fmt.Errorf("unknown event type %q", ev.Type)
	}
	// Before it is split (the pieces stay within MaxEventText) or kept as
	// the terminal event (which is also stored).
	ev = sendable(ev)
	g.sendMu.Lock()
	defer g.sendMu.Unlock()
	g.mu.Lock()
	if g.cancelled != nil {
		// The run is being stopped: say so, as ports.EventSink promises,
		// so an adapter that only watches its sends stops too.
		err := g.cancelled
		g.mu.Unlock()
		return err
	}
	if g.decided || g.terminal != nil {
		g.mu.Unlock()
		return nil
	}
	if ev.Type.Terminal() {
		e := ev
		g.terminal = &e
		g.mu.Unlock()
		return nil
	}
	g.mu.Unlock()
	if ev.Type == domain.EventStart {
		return nil // the run manager has sent it
	}
	if len(ev.Metadata) > MaxEventMetadata {
		// Too large to relay as one event; say so rather than fail the run.
		ev.Metadata = []byte(fmt.Sprintf(`{"truncated":true,"bytes":%d}`, len(ev.Metadata)))
	}
	for _, piece := range splitText(ev) {
		if err := g.send(piece); err != nil {
			if g.background {
				continue // nobody is listening; the run goes on and the store records it
			}
			// The run ends cancelled however its adapter reports the failed
			// Emit: for what stopped the run (a cancel, the node shutting
			// down) when the send was abandoned for that, else because the
			// stream is gone, so the caller left.
			cause := errCallerLeft
			if g.ctx.Err() != nil {
				cause = context.Cause(g.ctx)
			}
			g.claimCancel(cause)
			return err
		}
	}
	return nil
}

func (g *guard) send(ev domain.RunEvent) error {
	return g.sendWithin(g.ctx, ev)
}

// sendWithin numbers ev and sends it; a failed send leaves no gap in the
// sequence, because the event was not sent.
func (g *guard) sendWithin(ctx context.Context, ev domain.RunEvent) error {
	ev.RunID, ev.Seq = g.runID, g.seq+1
	if ev.Time.IsZero() {
		ev.Time = g.now()
	}
	if err := g.out.Emit(ctx, ev); err != nil {
		return err
	}
	g.seq++
	return nil
}

func (g *guard) claimCancel(cause error) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.decided || g.terminal != nil || g.finishing {
		return false
	}
	if g.cancelled == nil {
		g.cancelled = cause
	}
	return true
}

// decide fixes the run's terminal event once the adapter has returned.
func (g *guard) decide(execErr error, ctx context.Context) domain.RunEvent {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.decided = true
	switch {
	case g.cancelled != nil:
		return domain.RunEvent{Type: domain.EventCancelled, Error: &domain.ErrorInfo{Code: domain.CodeCancelled, Message: g.cancelled.Error()}}
	case g.terminal != nil:
		return *g.terminal
	case ctx.Err() != nil:
		return domain.RunEvent{Type: domain.EventCancelled, Error: &domain.ErrorInfo{Code: domain.CodeCancelled, Message: context.Cause(ctx).Error()}}
	case execErr == nil:
		return domain.RunEvent{Type: domain.EventComplete}
	default:
		ev := domain.ErrorEvent(g.runID, execErr)
		if ev.Error.Code == domain.CodeInternal {
			ev.Error.Code = domain.CodeRunFailed
		}
		return ev
	}
}

// sendTerminal sends the run's last event. It is not bound to the run's
// context (a cancelled run still reports cancelled); it ends when the edge
// takes it or the stream goes away.
func (g *guard) sendTerminal(ev domain.RunEvent) {
	g.sendMu.Lock()
	defer g.sendMu.Unlock()
	g.mu.Lock()
	g.decided = true
	g.mu.Unlock()
	// Emit cleaned what the adapter sent; terminal events made up here
	// (shutdown, a refused request) may quote anything.
	_ = g.sendWithin(context.Background(), sendable(ev))
}

// sendable returns ev with Text and Error.Message made valid UTF-8, each
// run of invalid bytes replaced by U+FFFD, and Error.Message cut to
// MaxErrorMessage. An adapter relays what a process or provider printed
// (Latin-1, a multi-byte character cut in two, a whole error page), but
// both are protobuf strings on the node link, which must be UTF-8 (a frame
// that is not cannot be sent: the run would end in a stream reset), and
// the message is stored as text.
func sendable(ev domain.RunEvent) domain.RunEvent {
	if !utf8.ValidString(ev.Text) {
		ev.Text = strings.ToValidUTF8(ev.Text, "\uFFFD")
	}
	if ev.Error != nil && (!utf8.ValidString(ev.Error.Message) || len(ev.Error.Message) > MaxErrorMessage) {
		e := *ev.Error // the adapter's; not changed under it
		e.Message = clipMessage(strings.ToValidUTF8(e.Message, "\uFFFD"))
		ev.Error = &e
	}
	return ev
}

// clipMessage returns msg (valid UTF-8) if it is at most MaxErrorMessage
// bytes, else its head and how long it was (domain.ClipMessage).
func clipMessage(msg string) string { return domain.ClipMessage(msg, MaxErrorMessage) }

// maxCancelReason is the most of a cancel's reason a run keeps, in bytes:
// the edge's reasons are a line, and a missed cancel holds its reason for
// missedCancelTTL.
const maxCancelReason = 1 << 10

// splitText cuts a text event into pieces of at most MaxEventText bytes,
// never inside a UTF-8 sequence.
func splitText(ev domain.RunEvent) []domain.RunEvent {
	if len(ev.Text) <= MaxEventText {
		return []domain.RunEvent{ev}
	}
	var out []domain.RunEvent
	text := ev.Text
	for len(text) > MaxEventText {
		cut := MaxEventText
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		if cut == 0 {
			cut = MaxEventText
		}
		p := ev
		p.Text, p.Usage, p.Metadata = text[:cut], nil, nil
		out = append(out, p)
		text = text[cut:]
	}
	last := ev
	last.Text = text
	return append(out, last)
}
