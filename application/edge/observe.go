package edge

import (
	"context"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"iop/domain"
	"iop/ports"
)

// Observers are where the use cases report what happened: metrics and the
// durable history. Either may be nil (nothing is reported there). Both are
// non-blocking by contract, so reporting never slows a run or a tunnel.
type Observers struct {
	Metrics ports.EdgeMetrics
	History ports.RunHistory
}

// CallerKey is the name of the API key the request came with (the
// principal the auth middleware put in ctx), for history and metrics;
// domain.AnonymousName on an edge without keys.
func CallerKey(ctx context.Context) string { return domain.PrincipalFrom(ctx).Name }

// runObservation follows one dispatched run for the observers. It is used
// by the run's single consumer only.
type runObservation struct {
	o       Observers
	now     func() time.Time
	rec     domain.RunRecord
	started time.Time
	first   time.Duration
	// mayRetry: the run goes to a node its caller did not name, so a
	// refusal for the node shutting down or at capacity is tried again
	// elsewhere (under another id; triedElsewhere): such a refusal is held (held) until the dispatcher
	// knows whether it is (discarded: the caller's run is the retry) or
	// not (flush: it is the caller's answer). The running row waits for
	// the node's admission answer meanwhile (recorded).
	mayRetry bool
	recorded bool
	held     *domain.RunEvent
}

// observeRun records a run the edge just dispatched; mayRetry as in
// runObservation.
func (h *SubmitRunHandler) observeRun(ctx context.Context, req domain.RunRequest, node string, mayRetry bool) *runObservation {
	now := h.now()
	ob := &runObservation{o: h.Observe, now: h.now, started: now, mayRetry: mayRetry, rec: domain.RunRecord{
		ID: req.RunID, Node: node, Adapter: req.Adapter, Target: req.Target, SessionID: req.SessionID,
		Key: CallerKey(ctx), Background: req.Background, Status: domain.RunRunning, CreatedAt: now,
	}}
	if !mayRetry {
		ob.record()
	}
	if h.Observe.Metrics != nil {
		h.Observe.Metrics.RunDispatched(node, req.Adapter)
	}
	return ob
}

// record writes the running row once.
func (ob *runObservation) record() {
	if ob.recorded {
		return
	}
	ob.recorded = true
	if ob.o.History != nil {
		ob.o.History.RecordRun(ob.rec)
	}
}

// event sees each event the edge relays; the terminal one finishes the record.
func (ob *runObservation) event(ev domain.RunEvent) {
	if ob == nil {
		return
	}
	now := ob.now()
	if !ev.Type.Terminal() {
		ob.record()
		if ob.first == 0 {
			ob.first = max(now.Sub(ob.started), time.Nanosecond)
		}
		return
	}
	if ob.mayRetry && ob.first == 0 && ev.Error != nil && triedElsewhere(ev.Error.Code) {
		held := ev
		held.Time = now
		ob.held = &held
		return
	}
	ob.finish(ev, now)
}

// finish records the run's end and counts it.
func (ob *runObservation) finish(ev domain.RunEvent, now time.Time) {
	ob.record()
	r := ob.rec
	r.Status = domain.StatusFor(ev.Type)
	r.FinishedAt = now
	if ev.Error != nil {
		r.ErrorCode, r.ErrorMsg = ev.Error.Code, ev.Error.Message
	}
	if ev.Usage != nil {
		u := *ev.Usage
		r.Usage = &u
	}
	if ob.o.History != nil {
		ob.o.History.RecordRun(r)
	}
	if ob.o.Metrics != nil {
		ob.o.Metrics.RunFinished(ports.RunOutcome{Node: r.Node, Adapter: r.Adapter, Status: r.Status,
			Duration: now.Sub(ob.started), FirstEvent: ob.first, Usage: r.Usage})
	}
}

// noRetry ends mayRetry: a refusal from now on is the caller's answer.
// A refusal held already is recorded and counted as one (flush). An
// observation whose mayRetry is over (held is only ever set while it
// lasts) is left untouched: it may belong to the goroutine that follows
// a withdrawn run by now.
func (ob *runObservation) noRetry() {
	if ob == nil || !ob.mayRetry {
		return
	}
	ob.mayRetry = false
	if ev := ob.held; ev != nil {
		ob.held = nil
		ob.finish(*ev, ev.Time)
	}
}

// settled counts the end of a run the edge let go of when its link broke
// (RunHandle.lose), learned later from its node: r is its final record,
// which the caller records in the history. Its duration is `took`, the span
// the node reports by its own clock (below zero: unknown, and the run is
// taken to have lasted until now), never more than the time since the edge
// dispatched it: the node's end is on the node's clock, and measured
// against the edge's dispatch a node an hour ahead (or one reporting the
// year 9999) would add that hour to the histogram's sum for good.
func (ob *runObservation) settled(r domain.RunRecord, took time.Duration) {
	if ob == nil || ob.o.Metrics == nil {
		return
	}
	elapsed := max(ob.now().Sub(ob.started), 0)
	if took < 0 || took > elapsed {
		took = elapsed
	}
	ob.o.Metrics.RunFinished(ports.RunOutcome{Node: ob.rec.Node, Adapter: ob.rec.Adapter, Status: r.Status,
		Duration: took, FirstEvent: ob.first, Usage: r.Usage})
}

// countingReader counts the request body bytes streamed into a tunnel
// (read on the transport's goroutine, summed when the tunnel ends).
type countingReader struct {
	r interface{ Read([]byte) (int, error) }
	n atomic.Int64
}

// Close closes the body it counts, if it has a Close
// (ports.NodeLink.OpenTunnel).
func (c *countingReader) Close() error {
	if cl, ok := c.r.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// tunnelObservation is what a tunnel keeps for the observers.
type tunnelObservation struct {
	key       string
	modelOK   bool // the chosen provider lists the model: fit for a metric label
	bytesIn   int64
	body      *countingReader
	firstByte time.Duration
}

// UnlistedModel labels tunnels whose model the provider they went to does
// not list: callers' strings never become label values.
const UnlistedModel = "(unlisted)"

// observeTunnel reports a finished tunnel.
func (h *SubmitProviderTunnelHandler) observeTunnel(t *Tunnel, s domain.TunnelSummary, err error) {
	ob := &t.obs
	in := ob.bytesIn
	if ob.body != nil {
		in += ob.body.n.Load()
	}
	if h.Observe.History != nil {
		rec := domain.TunnelRecord{ID: t.ID, Node: t.Node, Provider: t.Provider, Model: t.Model, Path: t.path, Key: ob.key,
			Status: t.status, BodyBytes: t.bodyBytes, Usage: t.usage, StartedAt: t.start, FinishedAt: t.start.Add(s.Duration), Response: t.Response}
		if t.usage != nil {
			rec.UsageOf = t.UsageOf
		}
		if err != nil {
			rec.ErrorCode = domain.CodeOf(err)
		}
		h.Observe.History.RecordTunnel(rec)
	}
	if h.Observe.Metrics != nil {
		model := t.Model
		if (!ob.modelOK && model != "") || (model == "" && t.usage != nil) {
			// A tunnel that named no model (a stored response's
			// retrieval) is not labelled with the one the provider
			// reported either.
			model = UnlistedModel
		}
		code := strconv.Itoa(t.status)
		if err != nil {
			code = domain.CodeOf(err)
		}
		h.Observe.Metrics.TunnelFinished(ports.TunnelOutcome{Node: t.Node, Provider: t.Provider, Model: model, Code: code,
			FirstByte: ob.firstByte, BytesIn: in, BytesOut: t.bodyBytes, Usage: t.usage})
	}
}
