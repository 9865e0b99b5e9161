package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

// SubmitRun asks for one run. Node may be empty (the edge chooses).
type SubmitRun struct {
	Node       string
	Adapter    string
	Target     string
	Input      []byte
	SessionID  string
	Background bool
	Options    []byte
}

// SubmitRunHandler dispatches runs to nodes and relays their events.
type SubmitRunHandler struct {
	reg   *Registry
	runs  *RunTracker
	bus   ports.EventPublisher
	log   *slog.Logger
	newID func() string
	now   func() time.Time

	// Background runs and abandoned runs are drained by goroutines owned
	// here; Stop ends them. mu orders starting one against Stop.
	base    context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	stopped bool
	// withdrawing counts the runs being withdrawn (withdraw: cancelled on
	// their nodes and followed to their ends); settled, when set, is
	// closed once it is 0 again (Settle). Both under mu.
	withdrawing int
	settled     chan struct{}
	// DrainTimeout bounds how long an abandoned run is followed to its end.
	DrainTimeout time.Duration
	// AdmitTimeout bounds the wait for a node's admission answer.
	AdmitTimeout time.Duration
	// Observe receives every dispatched run's record and outcome.
	Observe Observers
	// Orphans, if set, gets the background runs whose link broke before
	// the node answered their dispatch, to cancel them when it is back.
	Orphans *OrphanCancels
	// MaxRequestBytes bounds a run request as it goes to the node in one
	// frame (DefaultMaxRequestBytes; bootstrap sets the link's max frame
	// size). A larger request is refused with invalid_request instead of
	// being lost on the link. Zero or less disables the check.
	MaxRequestBytes int
	// Sessions, if set, is the history a session run's node and owner are
	// recalled from when the edge has none in memory (sessionGuard).
	Sessions ports.HistoryReader
	// AdminKey, if set, reports whether an API key name holds the admin
	// scope: its runs in the history make it no session's owner.
	AdminKey func(name string) bool
	// Reconcile, if set, learns of the background runs let go of when
	// their link broke, whose history rows it then settles (RunLost).
	Reconcile *HistoryReconciler
}

// DefaultMaxRequestBytes is the node link's default maximum frame size.
const DefaultMaxRequestBytes = 4 << 20

// requestOverhead covers a request's framing and field tags on the link.
const requestOverhead = 1 << 10

// NewSubmitRunHandler refuses nil dependencies.
func NewSubmitRunHandler(reg *Registry, runs *RunTracker, bus ports.EventPublisher, log *slog.Logger) *SubmitRunHandler {
	if reg == nil || runs == nil || bus == nil {
		panic("edge.NewSubmitRunHandler: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &SubmitRunHandler{reg: reg, runs: runs, bus: bus, log: log, newID: NewRunID, now: time.Now, base: ctx, stop: cancel, DrainTimeout: 10 * time.Second, AdmitTimeout: 30 * time.Second,
		MaxRequestBytes: DefaultMaxRequestBytes}
}

// NewRunID returns a run id such as "run_019ad8…" (24 hex digits: the
// time in milliseconds, then 48 random bits; see timeOrderedID).
func NewRunID() string { return timeOrderedID("run", time.Now()) }

// Stop ends the goroutines following background and abandoned runs. Runs
// submitted or closed after it are let go of at once.
func (h *SubmitRunHandler) Stop() {
	h.mu.Lock()
	h.stopped = true
	h.mu.Unlock()
	h.stop()
	h.wg.Wait()
}

// Settle waits, until ctx ends, for the runs being withdrawn (a foreground
// run whose caller left, or whose stream the edge's stop cut) to end on
// their nodes, so that their ends reach the history: Stop cuts their
// following at once, and a run so cut stayed running in the history until
// its node registered again — for good if it never did. The edge's stop
// calls it once its HTTP server has closed the runs' streams, before Stop.
func (h *SubmitRunHandler) Settle(ctx context.Context) {
	h.mu.Lock()
	if h.withdrawing == 0 {
		h.mu.Unlock()
		return
	}
	if h.settled == nil {
		h.settled = make(chan struct{})
	}
	done := h.settled
	h.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// withdrawn counts a run's withdrawal as ended (see Settle).
func (h *SubmitRunHandler) withdrawn() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.withdrawing--
	if h.withdrawing == 0 && h.settled != nil {
		close(h.settled)
		h.settled = nil
	}
}

// spawn runs f on a goroutine that Stop waits for; after Stop it runs
// nothing and reports false.
func (h *SubmitRunHandler) spawn(f func()) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return false
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		f()
	}()
	return true
}

// Handle validates cmd, picks a node, starts the run there and waits for the
// node to admit it: an error means the run was refused (adapter or target
// unknown, at capacity, session busy, …) and never started. A run whose node
// the caller did not name, refused because that node is shutting down or at
// capacity, is tried on the next node (under a new id; place). For a
// background run the returned handle is already being drained by the edge:
// the caller only learns its id and node.
func (h *SubmitRunHandler) Handle(ctx context.Context, cmd SubmitRun) (*RunHandle, error) {
	if err := domain.PrincipalFrom(ctx).Require(domain.ScopeRuns); err != nil {
		return nil, err
	}
	if err := domain.CheckPathIDs("node", cmd.Node, "session_id", cmd.SessionID); err != nil {
		return nil, err
	}
	if err := domain.CheckIDs("adapter", cmd.Adapter, "target", cmd.Target); err != nil {
		return nil, err
	}
	if cmd.Adapter == "" {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "adapter is required")
	}
	if h.base.Err() != nil {
		return nil, domain.Errorf(domain.CodeShuttingDown, "the edge is shutting down")
	}
	if size := len(cmd.Input) + len(cmd.Options) + len(cmd.Adapter) + len(cmd.Target) + len(cmd.SessionID) + requestOverhead; h.MaxRequestBytes > 0 && size > h.MaxRequestBytes {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "run request is too large: input and options take %d bytes, the node link carries at most %d",
			size-requestOverhead, h.MaxRequestBytes-requestOverhead)
	}
	// A session is its first key's: another key's run of it is refused,
	// named node or not. A session run with no node named goes to its node.
	undo, err := (sessionGuard{h.reg, h.Sessions, h.log, h.AdminKey}).use(ctx, cmd.Adapter, cmd.SessionID, cmd.Node == "", true)
	if err != nil {
		return nil, err
	}
	rh, err := h.place(ctx, cmd)
	if err != nil {
		undo()
	}
	return rh, err
}

// place picks cmd's node and dispatches it there; a run refused there
// because its node is stopping or at capacity is tried elsewhere (see
// Handle).
func (h *SubmitRunHandler) place(ctx context.Context, cmd SubmitRun) (*RunHandle, error) {
	p := domain.PrincipalFrom(ctx)
	if cmd.Node == "" && cmd.SessionID != "" {
		done, err := h.reg.placeSession(ctx, p, cmd.Adapter, cmd.SessionID)
		if err != nil {
			return nil, err
		}
		defer done()
	}
	node, release, err := h.reg.PickForTarget(p, cmd.Node, cmd.Adapter, cmd.Target, cmd.SessionID)
	if err != nil {
		return nil, err
	}
	var tried map[string]bool
	// A refusal that is tried again is not the caller's run: it is neither
	// counted (a failed run in iop_runs_total) nor recorded in the history
	// (a row whose id the caller never got). The last one is held (held)
	// until the caller's answer is known: dropped once a later node is sent
	// the run (that run, admitted or not, is the caller's and has its own
	// row), recorded and counted if none is (no node left, or the next one
	// could not be sent it: its link full or gone).
	var held *runObservation
	for {
		rh, sent, err := h.dispatch(ctx, cmd, node, release, cmd.Node == "")
		if sent != nil {
			held = sent // an earlier refusal is dropped; one with none held flushes nothing
		}
		code := domain.CodeOf(err)
		if err == nil {
			return rh, nil
		}
		if !triedElsewhere(code) {
			held.noRetry()
			return nil, err
		}
		if code == domain.CodeShuttingDown {
			// The node refused the run before admitting it because it is
			// stopping: its word that it drains was still on its way, or
			// it is a version that does not send one. It takes no new run
			// from now on.
			announceDraining(h.reg, h.bus, h.log, h.now(), node.ID, node.Link, "it refused a run: shutting_down")
		}
		// The run, unless its caller named the node, is tried on the next
		// node; with none left it gets this node's refusal. A node that
		// answered at_capacity (its adapter full, a race the edge's count
		// lost, or its link out of streams: tunnels hold it, which the
		// count of runs does not see) is tried only on nodes with a free
		// slot; each node is tried once.
		if cmd.Node != "" {
			held.noRetry()
			return nil, err
		}
		if tried == nil {
			tried = map[string]bool{}
		}
		tried[node.ID] = true
		var perr error
		node, release, perr = h.reg.pickElsewhere(p, cmd.Adapter, cmd.Target, cmd.SessionID, tried, code == domain.CodeAtCapacity)
		if perr != nil {
			held.noRetry()
			return nil, err
		}
	}
}

// triedElsewhere reports whether a run refused with code before its node
// admitted it is tried on another node when its caller named none: the
// node is stopping (shutting_down) or has no room for it (at_capacity).
func triedElsewhere(code string) bool {
	return code == domain.CodeShuttingDown || code == domain.CodeAtCapacity
}

// dispatch starts cmd as a new run on node, which holds a slot for it that
// release gives back, and waits for the node to admit it; then follows it
// if it is a background run. sent is the run's observation once the node
// was sent it (nil when it could not be). With mayRetry a refusal for the
// node shutting down or at capacity (triedElsewhere) is held in it
// (sent.held), not recorded nor counted: the caller either tries the run
// elsewhere or calls sent.noRetry, which records and counts it.
func (h *SubmitRunHandler) dispatch(ctx context.Context, cmd SubmitRun, node NodeView, release func(), mayRetry bool) (_ *RunHandle, sent *runObservation, _ error) {
	req := domain.RunRequest{
		RunID: h.newID(), Adapter: cmd.Adapter, Target: cmd.Target, Input: cmd.Input,
		SessionID: cmd.SessionID, Background: cmd.Background, Options: cmd.Options,
	}
	stream, err := node.Link.StartRun(ctx, req)
	if err != nil {
		release()
		return nil, nil, err
	}
	h.runs.start(req.RunID, node.ID)
	rh := &RunHandle{RunID: req.RunID, Node: node.ID, Background: cmd.Background, Key: domain.PrincipalFrom(ctx).Name,
		h: h, link: node.Link, stream: stream, release: release, obs: h.observeRun(ctx, req, node.ID, mayRetry)}
	if err := h.admit(ctx, rh); err != nil {
		return nil, rh.obs, err
	}
	rh.obs.mayRetry = false
	// The node admitted it, so it holds the session's history from now on:
	// the session's next run goes there (Registry.PickForTarget).
	if req.SessionID != "" {
		h.reg.admitSession(req.Adapter, req.SessionID, node.ID, domain.PrincipalFrom(ctx))
	}
	if h.log.Enabled(ctx, slog.LevelInfo) {
		// As h.log.Info, without the caller's program counter (runtime.Callers
		// on every run, for a source line no edge handler prints).
		rec := slog.NewRecord(time.Now(), slog.LevelInfo, "run started", 0)
		rec.AddAttrs(slog.String("run", req.RunID), slog.String("node", node.ID), slog.String("adapter", req.Adapter),
			slog.String("target", req.Target), slog.Bool("background", req.Background), slog.String("key", domain.PrincipalFrom(ctx).Name))
		_ = h.log.Handler().Handle(ctx, rec)
	}
	if cmd.Background {
		h.follow(rh, 0)
	}
	return rh, rh.obs, nil
}

// admit waits for the node's admission answer, the run's first event: start
// for an admitted run (kept for the caller's first Next), a terminal error
// for a refused one (returned as the error, so the caller gets an honest
// status and never a run id). Only an admitted run's id reaches a caller, and
// the node has registered and recorded it by then, so a cancel sent at once
// finds it. If the caller leaves or the node does not answer in time, the
// run is cancelled and followed to its end.
func (h *SubmitRunHandler) admit(ctx context.Context, rh *RunHandle) error {
	wait, cancel := context.WithTimeout(ctx, h.AdmitTimeout)
	defer cancel()
	ev, err := rh.next(wait)
	if err != nil {
		// The end, which the edge follows now, is the caller's answer
		// (timeout) however it comes; the run was sent and the node may
		// still take it, so it has its row (else the history would never
		// learn of it, nor ask its node about it).
		rh.obs.mayRetry = false
		rh.obs.record()
		if ctx.Err() != nil {
			rh.withdraw(CancelCallerLeftUnadmitted)
			// The caller left: nobody reads the answer, and it is no
			// failure of the edge's (a 499 in the access log, not a 500).
			return fmt.Errorf("%w: %w", domain.Errorf(domain.CodeCancelled, "the caller left before run %s was admitted; it is cancelled", rh.RunID), ctx.Err())
		}
		rh.withdraw(fmt.Sprintf("node did not admit the run within %v", h.AdmitTimeout))
		return domain.Errorf(domain.CodeTimeout, "node %q did not admit run %s within %v", rh.Node, rh.RunID, h.AdmitTimeout)
	}
	if ev.Type.Terminal() {
		if ev.Error != nil && ev.Error.Code != "" {
			return &domain.Error{Code: ev.Error.Code, Message: ev.Error.Message}
		}
		return domain.Errorf(domain.CodeRunFailed, "node %q ended run %s before starting it (%s)", rh.Node, rh.RunID, ev.Type)
	}
	rh.pending = &ev
	rh.admitted = true
	return nil
}

// follow drains rh on a goroutine owned by h, publishing its events, for at
// most limit (0: until the run ends or the edge stops).
func (h *SubmitRunHandler) follow(rh *RunHandle, limit time.Duration) {
	started := h.spawn(func() {
		ctx, cancel := h.base, context.CancelFunc(func() {})
		if limit > 0 {
			ctx, cancel = context.WithTimeout(h.base, limit)
		}
		defer cancel()
		for {
			if _, err := rh.next(ctx); err != nil {
				rh.abandon()
				return
			}
		}
	})
	if !started {
		rh.abandon()
	}
}

// RunHandle is a caller's view of one dispatched run. It has one consumer:
// Next and Close are called from the same goroutine (for background runs,
// the edge's own follower).
type RunHandle struct {
	RunID      string
	Node       string
	Background bool
	// Key names the API key of the caller that started the run.
	Key string

	h       *SubmitRunHandler
	stream  ports.RunStream
	link    ports.NodeLink // the link the run went out on
	release func()
	obs     *runObservation

	lastSeq uint64
	done    bool
	// admitted is set once the node's start event arrived (admit).
	admitted bool
	// pending is the admission event (start), already published, that the
	// caller's first Next returns.
	pending *domain.RunEvent
	// withdrawn is the reason the edge cancelled the run for (withdraw).
	withdrawn string
}

// Next returns the run's next event; io.EOF after the terminal one. If the
// node goes away first, Next returns a synthesized error event (code
// node_disconnected) as the terminal event, so no caller hangs.
func (r *RunHandle) Next(ctx context.Context) (domain.RunEvent, error) {
	if r.Background {
		return domain.RunEvent{}, errors.New("background runs are drained by the edge")
	}
	return r.next(ctx)
}

func (r *RunHandle) next(ctx context.Context) (domain.RunEvent, error) {
	if ev := r.pending; ev != nil {
		r.pending = nil
		return *ev, nil
	}
	if r.done {
		return domain.RunEvent{}, io.EOF
	}
	ev, err := r.stream.Recv(ctx)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return domain.RunEvent{}, err
		}
		// Only an admitted background run outlives its link: before the
		// node's answer the edge cannot tell whether it ever got the run,
		// so it ends like a foreground run (node_disconnected, recorded
		// failed) and admit hands that to the caller.
		if r.Background && r.admitted && linkLost(err) {
			r.lose(err)
			return domain.RunEvent{}, errRunLost
		}
		if r.Background && !r.admitted && linkLost(err) {
			r.h.Orphans.add(r.Node, r.RunID, r.link, r.withdrawn)
		}
		if errors.Is(err, io.EOF) {
			err = domain.Errorf(domain.CodeNodeDisconnected, "run stream ended without a terminal event")
		}
		ev = domain.ErrorEvent(r.RunID, err)
		if domain.CodeOf(err) == domain.CodeStreamReset {
			ev.Error.Code = domain.CodeNodeDisconnected
		}
		ev.Seq = r.lastSeq + 1
		ev.Time = r.h.now()
	}
	// The stream is this run's, whatever id the node put in the event: a
	// node must not publish events (a terminal one) under another run's id.
	ev.RunID = r.RunID
	r.lastSeq = ev.Seq
	r.obs.event(ev)
	if ev.Type.Terminal() {
		r.done = true
		r.release()
		r.h.runs.finish(r.RunID, true)
	}
	// Published once the state it describes is so: a subscriber acting on
	// a terminal event (starting the next run on the node's freed slot,
	// reading GET /v1/nodes) must not meet the run still in flight.
	r.h.bus.Publish(domain.BusEvent{Type: domain.BusRunEvent, Time: r.h.now(), Node: r.Node, Key: r.Key, Run: &ev})
	return ev, nil
}

// Close is called when the caller stops reading. A foreground run that has
// not ended is cancelled on its node, as one whose caller left
// (CancelCallerLeft), and followed to its end in the background, so the
// bus still sees its terminal event.
func (r *RunHandle) Close() { r.CloseFor(CancelCallerLeft) }

// CloseFor is Close with the reason the run is cancelled for, which the
// node records as the run's message (CancelEdgeStopping, say).
func (r *RunHandle) CloseFor(reason string) {
	if r.done || r.Background {
		return
	}
	r.withdraw(reason)
}

// withdraw cancels the run on its node for reason and follows it to its
// end on a goroutine owned by the handler, foreground or background alike.
//
// A background run not admitted yet whose cancel did not reach the node
// (its link half-open: the cancel times out, and the heartbeat may declare
// the link dead only after the drain gave up) is handed to the orphan
// cancels, sent again when the node registers: the node may have got the
// run, and a background run outlives its link, while its caller was told
// it timed out or was cancelled. A foreground run needs none: its node
// cancels it when its stream or link goes.
func (r *RunHandle) withdraw(reason string) {
	if r.done {
		return
	}
	r.pending = nil
	r.withdrawn = reason
	h := r.h
	h.mu.Lock()
	h.withdrawing++
	h.mu.Unlock()
	started := h.spawn(func() {
		defer h.withdrawn()
		reached := false // the node answered the cancel
		node, ok := h.reg.Get(r.Node)
		if ok {
			ctx, cancel := context.WithTimeout(h.base, 5*time.Second)
			switch err := node.Link.CancelRun(ctx, r.RunID, reason); {
			case err == nil, errors.Is(err, domain.ErrRunFinished):
				reached = true
			case errors.Is(err, domain.ErrRunNotFound):
				// The cancel overtook the run on its way to the node,
				// which remembers it and cancels the run on arrival;
				// the drain below follows it to its end either way.
				reached = true
				h.log.Debug("cancel reached the node before its run; the node cancels the run when it arrives", "run", r.RunID, "err", err)
			default:
				h.log.Warn("cancel of a run the edge let go failed", "run", r.RunID, "reason", reason, "err", err)
			}
			cancel()
		}
		ctx, cancel := context.WithTimeout(h.base, h.DrainTimeout)
		defer cancel()
		for {
			if _, err := r.next(ctx); err != nil {
				if !r.done && !reached && r.Background && !r.admitted && h.base.Err() == nil {
					// Neither its end seen nor the cancel answered. (A
					// link declared lost during the drain ends the run,
					// done, and next remembered it then.)
					h.Orphans.add(r.Node, r.RunID, r.link, reason)
				}
				r.abandon()
				return
			}
		}
	})
	if !started {
		h.withdrawn()
		r.abandon()
	}
}

// Why the edge cancels a run it was not asked to cancel: the node records
// the reason as the run's message (and the edge's history takes it from the
// run's terminal event). A user's cancel sends none: "cancelled by request".
const (
	// CancelCallerLeft: a foreground run's caller went away (RunHandle.Close).
	CancelCallerLeft = "caller left before the run ended"
	// CancelEdgeStopping: a foreground run's stream was cut by the edge's
	// graceful stop.
	CancelEdgeStopping = "edge shutting down"
	// CancelCallerLeftUnadmitted: the caller went away while the node had
	// not admitted the run yet (admit).
	CancelCallerLeftUnadmitted = "caller left before the run was admitted"
	// CancelLinkBroke: a background run whose node link broke before the
	// node answered its dispatch; its caller was told node_disconnected
	// (OrphanCancels).
	CancelLinkBroke = "node link broke before the run was admitted; its caller was told node_disconnected"
)

// errRunLost ends the following of a background run whose node link broke.
var errRunLost = errors.New("the node's link broke; the node goes on with the run")

// linkLost reports whether err, a run stream's failure, is the node's link
// breaking rather than the node ending the stream (a reset, or an end
// without a terminal event) or refusing to open it (at_capacity: the
// node's link had no stream free, so it never saw the run).
func linkLost(err error) bool {
	code := domain.CodeOf(err)
	return !errors.Is(err, io.EOF) && code != domain.CodeStreamReset && code != domain.CodeAtCapacity
}

// lose lets go of a background run whose node link broke. The node goes on
// with it (a background run outlives the link) and keeps its end in its own
// store, so the edge does not end it: no terminal event is made up, its
// history row stays running, and the tracker forgets it. A cancel then
// finds it through the history (answered node_not_found while the node is
// away: the caller cancels again once it is back), and the history learns
// its end from the node when it registers again: the repair at its
// registration asks about running rows no one follows, and keeps asking
// about those still going until they end, holding their slots meanwhile
// (HistoryReconciler). A node a reload removed never registers again: its
// run is ended node_removed (HistoryReconciler.RunLost).
func (r *RunHandle) lose(err error) {
	r.done = true
	r.release()
	r.h.runs.lose(r.RunID, r.obs)
	r.h.log.Warn("background run's node link broke; the node goes on with it", "run", r.RunID, "node", r.Node, "err", err)
	r.h.Reconcile.RunLost(r.obs.rec, r.link)
}

// abandon lets go of the stream and the run's slot whatever state it is in.
func (r *RunHandle) abandon() {
	r.stream.Close()
	r.release()
	if !r.done {
		r.done = true
		r.h.runs.finish(r.RunID, false) // its end was not seen, nor recorded
	}
}
