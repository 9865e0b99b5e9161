// Package prom maps the edge's metrics port (ports.EdgeMetrics) and its
// live state (registry, links, event bus) to Prometheus collectors, and
// serves them in the text format. Label values come from the directory and
// node configs, never from callers.
package prom

import (
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"iop/adapters/transport"
	edgeapp "iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// Metrics is the edge's Prometheus registry. It implements ports.EdgeMetrics.
type Metrics struct {
	reg *prometheus.Registry

	registrations *prometheus.CounterVec
	runs          *prometheus.CounterVec
	runDuration   *prometheus.HistogramVec
	runFirst      *prometheus.HistogramVec
	tunnels       *prometheus.CounterVec
	tunnelFirst   prometheus.Histogram
	tunnelBytes   *prometheus.CounterVec
	tokens        *prometheus.CounterVec
	historyDrops  prometheus.Counter

	// models are the model label values counted per scope, at most
	// maxRunModels each (modelScope). A run's model is what its adapter
	// reports, which for a chat adapter is often the caller's target
	// echoed by the upstream, so callers could otherwise mint series; per
	// node, as a tunnel's per provider: one node reporting models without
	// end (broken or hostile) used up a bound shared by all, and every
	// other node's models were (other). A tunnel's model is one its
	// provider lists, but a caller may grow an Ollama provider's list
	// without end (POST /api/copy).
	mu     sync.Mutex
	models map[modelScope]map[string]struct{}
}

// modelScope is what one bound of model labels is kept for: a node's
// runs, or a node's provider's tunnels.
type modelScope struct {
	tunnel         bool
	node, provider string
}

// maxRunModels bounds the distinct model labels of each node's runs'
// tokens, and of each provider's tunnels; further models are counted
// under otherModels.
const (
	maxRunModels = 256
	otherModels  = "(other)"
)

var _ ports.EdgeMetrics = (*Metrics)(nil)

// Sources are the live parts of the edge read at scrape time; any may be nil.
type Sources struct {
	Registry *edgeapp.Registry
	// BusDropped is the event bus's count of events dropped for slow subscribers.
	BusDropped func() uint64
	// LinkCerts is when the certificates the node link serves expire, by
	// kind ("ca", "server").
	LinkCerts func() map[string]time.Time
}

// New registers every metric, the Go runtime and process collectors, and
// collectors reading src at scrape time.
func New(src Sources) *Metrics {
	reg := prometheus.NewRegistry()
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	runBuckets := []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}
	m := &Metrics{
		reg: reg,
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "iop_node_registrations_total",
			Help: "Node registration attempts by outcome (accepted or the rejection code)."}, []string{"outcome"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "iop_runs_total",
			Help: "Runs dispatched by the edge that ended, by node, adapter and final status."}, []string{"node", "adapter", "status"}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "iop_run_duration_seconds",
			Help: "Run duration from dispatch to terminal event.", Buckets: runBuckets}, []string{"adapter"}),
		runFirst: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "iop_run_first_event_seconds",
			Help: "Time from dispatch to a run's first event.", Buckets: runBuckets}, []string{"adapter"}),
		tunnels: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "iop_tunnel_requests_total",
			Help: "Provider tunnels that ended, by node, provider, served model and HTTP status or error code."}, []string{"node", "provider", "model", "code"}),
		tunnelFirst: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "iop_tunnel_first_byte_seconds",
			// A provider answers a request that does not stream only once
			// it has generated the whole answer: often past 10 s, where
			// the default buckets end.
			Help: "Time from opening a tunnel to the provider's response status.", Buckets: append([]float64{0.005, 0.01, 0.025}, runBuckets...)}),
		tunnelBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "iop_tunnel_body_bytes_total",
			Help: "Tunnel body bytes: in (request, caller to provider) and out (response)."}, []string{"direction"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "iop_tokens_total",
			Help: "Tokens reported by runs and tunnels, by node, model and kind (prompt or completion)."}, []string{"node", "model", "kind"}),
		historyDrops: prometheus.NewCounter(prometheus.CounterOpts{Name: "iop_history_dropped_rows_total",
			Help: "History rows lost because the store was slow or unreachable."}),
	}
	for _, c := range []prometheus.Collector{m.registrations, m.runs, m.runDuration, m.runFirst, m.tunnels, m.tunnelFirst,
		m.tunnelBytes, m.tokens, m.historyDrops} {
		f(c)
	}
	m.tunnelBytes.WithLabelValues("in")
	m.tunnelBytes.WithLabelValues("out")
	// Every outcome starts at 0: a series born at 100 (a burst of bad
	// tokens within one scrape) shows no increase() or rate(), and an
	// alert on them would never fire.
	for _, o := range edgeapp.RegistrationOutcomes {
		m.registrations.WithLabelValues(o)
	}
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f(&liveCollector{src: src})
	return m
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry is the underlying registry (for tests and extra collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// NodeRegistration implements ports.EdgeMetrics.
func (m *Metrics) NodeRegistration(outcome string) {
	m.registrations.WithLabelValues(label(outcome)).Inc()
}

// runStatuses are the statuses iop_runs_total counts.
var runStatuses = []string{string(domain.RunSucceeded), string(domain.RunFailed), string(domain.RunCancelled)}

// RunDispatched implements ports.EdgeMetrics: the pair's runs_total series
// and its adapter's histograms start at 0.
func (m *Metrics) RunDispatched(node, adapter string) {
	node, adapter = label(node), label(adapter)
	for _, s := range runStatuses {
		m.runs.WithLabelValues(node, adapter, s)
	}
	m.runDuration.WithLabelValues(adapter)
	m.runFirst.WithLabelValues(adapter)
}

// RunFinished implements ports.EdgeMetrics.
func (m *Metrics) RunFinished(r ports.RunOutcome) {
	m.runs.WithLabelValues(label(r.Node), label(r.Adapter), string(r.Status)).Inc()
	m.runDuration.WithLabelValues(label(r.Adapter)).Observe(r.Duration.Seconds())
	if r.FirstEvent > 0 {
		m.runFirst.WithLabelValues(label(r.Adapter)).Observe(r.FirstEvent.Seconds())
	}
	if r.Usage != nil {
		m.addTokens(r.Node, r.Usage, m.runModel(r.Node, r.Usage.Model))
	}
}

// runModel is the label a run's model is counted under: itself while
// fewer than maxRunModels have been seen on its node, otherModels after
// that.
func (m *Metrics) runModel(node, model string) string {
	return m.inScope(modelScope{node: node}, label(model))
}

// tunnelModel is the label a tunnel's model is counted under: itself
// while its node's provider has had fewer than maxRunModels, otherModels
// after that. "" (a tunnel that named none) and the unlisted label are
// always themselves.
func (m *Metrics) tunnelModel(node, provider, model string) string {
	model = label(model)
	if model == "" || model == edgeapp.UnlistedModel {
		return model
	}
	return m.inScope(modelScope{tunnel: true, node: node, provider: provider}, model)
}

// inScope is model if scope's set holds it or has room for it (it is
// added), otherModels if the set is full.
func (m *Metrics) inScope(scope modelScope, model string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.models == nil {
		m.models = map[modelScope]map[string]struct{}{}
	}
	set := m.models[scope]
	if set == nil {
		set = map[string]struct{}{}
		m.models[scope] = set
	}
	return bounded(set, model)
}

// bounded is model if set holds it or has room for it (it is added),
// otherModels if set is full.
func bounded(set map[string]struct{}, model string) string {
	if _, ok := set[model]; ok {
		return model
	}
	if len(set) >= maxRunModels {
		return otherModels
	}
	set[model] = struct{}{}
	return model
}

// TunnelFinished implements ports.EdgeMetrics.
func (m *Metrics) TunnelFinished(t ports.TunnelOutcome) {
	model := m.tunnelModel(t.Node, t.Provider, t.Model)
	m.tunnels.WithLabelValues(label(t.Node), label(t.Provider), model, tunnelCode(t.Code)).Inc()
	if t.FirstByte > 0 {
		m.tunnelFirst.Observe(t.FirstByte.Seconds())
	}
	m.tunnelBytes.WithLabelValues("in").Add(float64(t.BytesIn))
	m.tunnelBytes.WithLabelValues("out").Add(float64(t.BytesOut))
	m.addTokens(t.Node, t.Usage, model)
}

// otherCode labels tunnels that ended with an error code this edge does
// not know: a node may report any code (domain.PeerCode), and each
// distinct one would otherwise be a series kept for good.
const otherCode = "other"

// tunnelCode is the label of a tunnel's outcome: its HTTP status (100–999,
// the only ones a tunnel reports), or its error code if it is one of the
// edge's own, otherCode for any other.
func tunnelCode(code string) string {
	if len(code) == 3 && code[0] >= '1' && code[0] <= '9' && code[1] >= '0' && code[1] <= '9' && code[2] >= '0' && code[2] <= '9' {
		return code
	}
	if domain.KnownCode(code) {
		return code
	}
	return otherCode
}

// HistoryDropped implements ports.EdgeMetrics.
func (m *Metrics) HistoryDropped(n int) { m.historyDrops.Add(float64(n)) }

// addTokens counts usage under model, or the model the node reported (a
// run's adapter decides it, not the caller) when model is "".
func (m *Metrics) addTokens(node string, u *domain.Usage, model string) {
	if u == nil {
		return
	}
	if model == "" {
		model = u.Model
	}
	// Bounded as the history and the ledger bound them: a counter never
	// forgets one absurd report (a node's 9e18), and every rate over it
	// would show it.
	if n := domain.BoundTokens(u.PromptTokens); n > 0 {
		m.tokens.WithLabelValues(label(node), label(model), "prompt").Add(float64(n))
	}
	if n := domain.BoundTokens(u.CompletionTokens); n > 0 {
		m.tokens.WithLabelValues(label(node), label(model), "completion").Add(float64(n))
	}
}

// label bounds a label value's length (values come from configs, nodes,
// providers and callers) and makes it safe to print: invalid UTF-8 (which
// the client library refuses) and control characters (C0, DEL and C1: an
// ESC sequence would reach the terminal of whoever curls /metrics) become
// U+FFFD.
func label(s string) string {
	if len(s) > 128 {
		i := 128
		for i > 0 && !utf8.RuneStart(s[i]) {
			i-- // do not cut a character in two
		}
		s = s[:i]
	}
	if utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	// Map reads each invalid byte as utf8.RuneError, which it writes back
	// as the valid U+FFFD.
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return utf8.RuneError
		}
		return r
	}, s)
}

// liveCollector reads the edge's live state at scrape time.
type liveCollector struct{ src Sources }

var (
	descConnected = prometheus.NewDesc("iop_nodes_connected", "Nodes connected to the edge.", nil, nil)
	descInFlight  = prometheus.NewDesc("iop_runs_in_flight", "Runs in flight on a node as the edge counts them: dispatched through it and not yet ended, or reported still going by the node after a link loss or an edge restart.", []string{"node", "adapter"}, nil)
	descTunnelsIn = prometheus.NewDesc("iop_tunnels_in_flight", "Provider tunnels open through this edge.", []string{"node"}, nil)
	descBusDrops  = prometheus.NewDesc("iop_eventbus_dropped_total", "Bus events dropped because a subscriber was too slow.", nil, nil)
	descRTT       = prometheus.NewDesc("iop_link_heartbeat_rtt_seconds", "Last heartbeat round trip on a node's link.", []string{"node"}, nil)
	descFrames    = prometheus.NewDesc("iop_link_frames_total", "Frames on a node's link (current connection), by direction.", []string{"node", "direction"}, nil)
	descLinkBytes = prometheus.NewDesc("iop_link_bytes_total", "Bytes on a node's link (current connection), by direction.", []string{"node", "direction"}, nil)
	descCertEnd   = prometheus.NewDesc("iop_link_cert_expiry_timestamp_seconds", "When a certificate the edge serves on the node link expires (Unix time): the auto-mode CA (cert=ca) or the server certificate (cert=server; in files mode the earliest end in its chain).", []string{"cert"}, nil)

	descSlotsMax   = prometheus.NewDesc("iop_node_adapter_slots", "An adapter's concurrency limit on its node (0: unlimited), as the node reports it.", []string{"node", "adapter"}, nil)
	descSlotsUsed  = prometheus.NewDesc("iop_node_adapter_slots_in_use", "An adapter's runs in flight on its node, as the node reports it.", []string{"node", "adapter"}, nil)
	descChildren   = prometheus.NewDesc("iop_node_child_processes", "Child processes a node's adapters are running.", []string{"node"}, nil)
	descStoreBytes = prometheus.NewDesc("iop_node_store_bytes", "Size of a node's run store on disk.", []string{"node"}, nil)
	descProvLat    = prometheus.NewDesc("iop_node_provider_first_byte_seconds", "Time a node's providers took to answer, as the node measures it.", []string{"node", "provider"}, nil)
)

func (c *liveCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConnected, descInFlight, descTunnelsIn, descBusDrops, descRTT, descFrames, descLinkBytes, descCertEnd,
		descSlotsMax, descSlotsUsed, descChildren, descStoreBytes, descProvLat} {
		ch <- d
	}
}

// linkStats and nodeStats are what the transport's edge link offers.
type linkStats interface{ Stats() transport.Stats }
type nodeStats interface {
	NodeStats() (domain.NodeStats, bool)
}

func (c *liveCollector) Collect(ch chan<- prometheus.Metric) {
	// Each series at most once: a second one with the same label values
	// fails the whole scrape, every node's series lost. Label values are
	// label()'s, which may make two names one (control characters in what
	// a node reported, say): the first one wins.
	type series struct {
		d *prometheus.Desc // one per metric, made once (the desc* variables)
		l string
	}
	emitted := map[series]bool{}
	first := func(d *prometheus.Desc, l []string) bool {
		k := series{d, strings.Join(l, "\xff")} // label values are valid UTF-8: no 0xff
		if emitted[k] {
			return false
		}
		emitted[k] = true
		return true
	}
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		if first(d, l) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
		}
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		if first(d, l) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
		}
	}
	if c.src.BusDropped != nil {
		counter(descBusDrops, float64(c.src.BusDropped()))
	}
	if c.src.LinkCerts != nil {
		for cert, end := range c.src.LinkCerts() {
			gauge(descCertEnd, float64(end.Unix()), cert)
		}
	}
	if c.src.Registry == nil {
		return
	}
	nodes := c.src.Registry.List()
	gauge(descConnected, float64(len(nodes)))
	for _, n := range nodes {
		id := label(n.ID)
		for _, a := range n.Adapters {
			gauge(descInFlight, float64(a.InFlight), id, label(a.Name))
		}
		// A reload removed these adapters; their runs go on, and count
		// (under a name still configured, the configured one's series).
		for _, a := range n.RemovedAdapters {
			gauge(descInFlight, float64(a.InFlight), id, label(a.Name))
		}
		gauge(descTunnelsIn, float64(n.TunnelsInFlight), id)
		if ls, ok := n.Link.(linkStats); ok {
			s := ls.Stats()
			// None until the link's first heartbeat comes back (up to
			// transport.heartbeat_interval, 30 s by default, after each
			// connect): 0 would read as an instant round trip.
			if s.RTT > 0 {
				gauge(descRTT, s.RTT.Seconds(), id)
			}
			counter(descFrames, float64(s.FramesIn), id, "in")
			counter(descFrames, float64(s.FramesOut), id, "out")
			counter(descLinkBytes, float64(s.BytesIn), id, "in")
			counter(descLinkBytes, float64(s.BytesOut), id, "out")
		}
		ns, ok := n.Link.(nodeStats)
		if !ok {
			continue
		}
		st, ok := ns.NodeStats()
		if !ok {
			continue
		}
		for _, a := range st.Adapters {
			gauge(descSlotsMax, float64(a.Max), id, label(a.Name))
			gauge(descSlotsUsed, float64(a.InFlight), id, label(a.Name))
		}
		gauge(descChildren, float64(st.ChildProcesses), id)
		gauge(descStoreBytes, float64(st.StoreBytes), id)
		for _, p := range st.Providers {
			if l := []string{id, label(p.Name)}; first(descProvLat, l) {
				ch <- prometheus.MustNewConstSummary(descProvLat, uint64(max(p.Count, 0)), p.Seconds, nil, l...)
			}
		}
	}
}
