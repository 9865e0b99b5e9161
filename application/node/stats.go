package node

import (
	"sort"
	"sync"
	"time"

	"iop/domain"
)

// Stats gathers what the node reports to the edge for its metrics: adapter
// slots, child processes, store size and provider latency.
type Stats struct {
	rt        *Runtime
	storeSize func() int64
	lat       *ProviderLatencies
}

// NewStats reads rt and lat; storeSize may be nil (size unknown).
func NewStats(rt *Runtime, lat *ProviderLatencies, storeSize func() int64) *Stats {
	if rt == nil || lat == nil {
		panic("node.NewStats: nil dependency")
	}
	return &Stats{rt: rt, storeSize: storeSize, lat: lat}
}

// spawnsProcesses reports whether runs of an adapter type are child processes.
func spawnsProcesses(typ string) bool {
	return typ == domain.AdapterExec || typ == domain.AdapterClaudeCode || typ == domain.AdapterCodex || typ == domain.AdapterGemini
}

// NodeStats is a snapshot for the edge.
func (s *Stats) NodeStats() domain.NodeStats {
	var out domain.NodeStats
	// An adapter a reload removed keeps its series while its runs go on
	// (Max 0), as the edge's iop_runs_in_flight does.
	out.Adapters = s.rt.slots()
	out.ChildProcesses = s.rt.childProcesses()
	if s.storeSize != nil {
		out.StoreBytes = s.storeSize()
	}
	out.Providers = s.lat.snapshot()
	return out
}

// ProviderLatencies sums, per provider, the time the node's provider
// requests took to their response headers. It is safe for concurrent use.
// Once a config is applied (keep), it holds the providers of that config
// only.
type ProviderLatencies struct {
	mu sync.Mutex
	m  map[string]*domain.ProviderLatency
	// configured are the providers of the config in force; nil until one
	// is applied (every name is measured then).
	configured map[string]bool
}

// NewProviderLatencies returns an empty set.
func NewProviderLatencies() *ProviderLatencies {
	return &ProviderLatencies{m: map[string]*domain.ProviderLatency{}}
}

// maxProviders bounds the names kept (they come from the node's config).
const maxProviders = 256

func (p *ProviderLatencies) observe(provider string, d time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.m[provider]
	if l == nil {
		// A request that began before a config dropped its provider
		// does not bring it back.
		if p.configured != nil && !p.configured[provider] || len(p.m) >= maxProviders {
			return
		}
		l = &domain.ProviderLatency{Name: provider}
		p.m[provider] = l
	}
	l.Count++
	l.Seconds += d.Seconds()
}

// keep drops the sums of providers not in names, the providers of the
// config just applied, and measures only those from then on: a provider
// removed or renamed leaves the node's stats (and the edge's metrics), and
// the names kept are the configured ones.
func (p *ProviderLatencies) keep(names []string) {
	if p == nil {
		return
	}
	configured := make(map[string]bool, len(names))
	for _, n := range names {
		configured[n] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.configured = configured
	for name := range p.m {
		if !configured[name] {
			delete(p.m, name)
		}
	}
}

func (p *ProviderLatencies) snapshot() []domain.ProviderLatency {
	p.mu.Lock()
	out := make([]domain.ProviderLatency, 0, len(p.m))
	for _, l := range p.m {
		out = append(out, *l)
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
