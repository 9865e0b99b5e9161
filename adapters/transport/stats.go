package transport

import (
	"context"
	"strings"
	"sync"
	"time"

	"iop/domain"
	ioppb "iop/proto/iop"
)

// DefaultStatsInterval is how often a node sends its NodeStats.
const DefaultStatsInterval = 15 * time.Second

// MinStatsInterval is the shortest interval between two stats reports:
// each report is a frame on the edge link, and one every microsecond kept
// the node busy on a core sending tens of thousands a second (a report
// given less time than it takes to send is cut short and sent again at
// once). A shorter ClientConfig.StatsInterval is raised to it.
const MinStatsInterval = 100 * time.Millisecond

// Bounds of a NodeStats message as the edge keeps it: a node cannot grow
// the edge's metrics beyond them.
const (
	maxStatsEntries = 256
	maxStatsName    = 128
)

// statsToProto converts the node's stats for the wire, cut to the bounds
// the edge keeps (the rest would only be dropped there, and a frame of
// thousands of entries could exceed the edge's bound on a frame's elements,
// elements.go).
func statsToProto(s domain.NodeStats) *ioppb.NodeStats {
	p := &ioppb.NodeStats{ChildProcesses: uint32(max(s.ChildProcesses, 0)), StoreBytes: s.StoreBytes}
	s.Adapters = s.Adapters[:min(len(s.Adapters), maxStatsEntries)]
	s.Providers = s.Providers[:min(len(s.Providers), maxStatsEntries)]
	for _, a := range s.Adapters {
		p.Adapters = append(p.Adapters, &ioppb.AdapterSlots{Name: a.Name, MaxConcurrency: uint32(max(a.Max, 0)), InFlight: uint32(max(a.InFlight, 0))})
	}
	for _, l := range s.Providers {
		p.Providers = append(p.Providers, &ioppb.ProviderLatency{Name: l.Name, Count: uint64(max(l.Count, 0)), Seconds: l.Seconds})
	}
	return p
}

func statsName(s string) string {
	if len(s) > maxStatsName {
		s = s[:maxStatsName]
	}
	return strings.ToValidUTF8(s, "")
}

// statsToDomain converts what a node sent, cut to the bounds.
func statsToDomain(p *ioppb.NodeStats) domain.NodeStats {
	s := domain.NodeStats{ChildProcesses: int(p.GetChildProcesses()), StoreBytes: max(p.GetStoreBytes(), 0)}
	for i, a := range p.GetAdapters() {
		if i == maxStatsEntries {
			break
		}
		s.Adapters = append(s.Adapters, domain.AdapterSlots{Name: statsName(a.GetName()), Max: int(a.GetMaxConcurrency()), InFlight: int(a.GetInFlight())})
	}
	for i, l := range p.GetProviders() {
		if i == maxStatsEntries {
			break
		}
		sec := l.GetSeconds()
		if sec < 0 || sec != sec {
			sec = 0
		}
		s.Providers = append(s.Providers, domain.ProviderLatency{Name: statsName(l.GetName()), Count: int64(min(l.GetCount(), 1<<62)), Seconds: sec})
	}
	return s
}

// reportStats sends the node's stats on conn now and every interval until
// conn or ctx ends or stop is called; now sends them at once besides (a
// config applied changes them). Each report runs from a timer, so
// between reports no goroutine waits for the next one (an idle link keeps
// one goroutine per side, its read loop). stop ends the reports and waits for one in
// progress; call it once the connection has ended. An interval of zero or
// less means DefaultStatsInterval; a positive one below MinStatsInterval is
// raised to it, whoever the caller is.
func reportStats(ctx context.Context, conn *Conn, stats func() domain.NodeStats, interval time.Duration) *statsReporter {
	r := &statsReporter{ctx: ctx, conn: conn, stats: stats, interval: statsInterval(interval)}
	r.mu.Lock()
	r.running.Add(1)
	r.timer = time.AfterFunc(0, r.send)
	r.mu.Unlock()
	return r
}

// statsInterval is the interval reportStats uses when asked for d.
func statsInterval(d time.Duration) time.Duration {
	switch {
	case d <= 0:
		return DefaultStatsInterval
	case d < MinStatsInterval:
		return MinStatsInterval
	}
	return d
}

type statsReporter struct {
	ctx      context.Context
	conn     *Conn
	stats    func() domain.NodeStats
	interval time.Duration

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	again   bool           // now was called while a report was being sent
	running sync.WaitGroup // a report is scheduled or in progress
}

func (r *statsReporter) send() {
	defer r.running.Done()
	sctx, cancel := context.WithTimeout(r.ctx, r.interval)
	err := r.conn.sendControl(sctx, &ioppb.Frame{Body: &ioppb.Frame_NodeStats{NodeStats: statsToProto(r.stats())}})
	cancel()
	if err != nil && r.conn.Err() != nil || r.ctx.Err() != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	next := r.interval
	if r.again {
		// This report may have been taken before what now was called
		// for: send another.
		next, r.again = 0, false
	}
	r.running.Add(1)
	r.timer.Reset(next)
}

// now sends a report at once, or right after the one being sent, and the
// following ones every interval from then.
func (r *statsReporter) now() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	if r.timer.Stop() {
		r.timer.Reset(0) // still the one report scheduled (running)
		return
	}
	// A report is under way: it schedules the next one at once. (Or the
	// reports have ended with the link, and nothing more is sent.)
	r.again = true
}

func (r *statsReporter) stop() {
	r.mu.Lock()
	r.stopped = true
	if r.timer.Stop() {
		r.running.Done() // scheduled, and now it will not run
	}
	r.mu.Unlock()
	r.running.Wait()
}

// nodeStatsBox keeps the last NodeStats a node sent.
type nodeStatsBox struct {
	mu    sync.Mutex
	stats domain.NodeStats
	ok    bool
}

func (b *nodeStatsBox) set(s domain.NodeStats) {
	b.mu.Lock()
	b.stats, b.ok = s, true
	b.mu.Unlock()
}

// NodeStats returns the last stats the node sent, if any.
func (l *edgeLink) NodeStats() (domain.NodeStats, bool) {
	l.statsBox.mu.Lock()
	defer l.statsBox.mu.Unlock()
	return l.statsBox.stats, l.statsBox.ok
}
