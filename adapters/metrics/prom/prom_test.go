package prom_test

import (
	"fmt"
	"io"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"iop/adapters/metrics/prom"
	"iop/adapters/transport"
	edgeapp "iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// scrape fetches the handler's text exposition and parses it.
func scrape(t *testing.T, m *prom.Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, body)
	}
	return fams
}

func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, m := range f.Metric {
		for _, lp := range m.Label {
			if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("no %s with %v", name, labels)
	return 0
}

func TestPortToCollectors(t *testing.T) {
	reg := edgeapp.NewRegistry()
	var dropped uint64 = 3
	m := prom.New(prom.Sources{Registry: reg, BusDropped: func() uint64 { return dropped }})
	m.NodeRegistration("accepted")
	m.NodeRegistration("unknown_token")
	m.NodeRegistration("unknown_token")
	u := &domain.Usage{PromptTokens: 5, CompletionTokens: 7, Model: "m1"}
	m.RunFinished(ports.RunOutcome{Node: "n1", Adapter: "exec", Status: domain.RunSucceeded, Duration: time.Second, FirstEvent: time.Millisecond, Usage: u})
	m.RunFinished(ports.RunOutcome{Node: "n1", Adapter: "exec", Status: domain.RunFailed, Duration: time.Second})
	m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "p", Model: "m1", Code: "200", FirstByte: time.Millisecond, BytesIn: 10, BytesOut: 20,
		Usage: &domain.Usage{PromptTokens: 1, CompletionTokens: 2}})
	m.HistoryDropped(4)
	// An absurd count is bounded as the history bounds it.
	m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "p", Model: "m2", Code: "200",
		Usage: &domain.Usage{PromptTokens: math.MaxInt64, CompletionTokens: -5}})

	f := scrape(t, m)
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"iop_node_registrations_total", map[string]string{"outcome": "accepted"}, 1},
		{"iop_node_registrations_total", map[string]string{"outcome": "unknown_token"}, 2},
		{"iop_runs_total", map[string]string{"node": "n1", "adapter": "exec", "status": "succeeded"}, 1},
		{"iop_runs_total", map[string]string{"status": "failed"}, 1},
		{"iop_run_duration_seconds", map[string]string{"adapter": "exec"}, 2},
		{"iop_run_first_event_seconds", map[string]string{"adapter": "exec"}, 1},
		{"iop_tunnel_requests_total", map[string]string{"node": "n1", "provider": "p", "model": "m1", "code": "200"}, 1},
		{"iop_tunnel_first_byte_seconds", nil, 1},
		{"iop_tunnel_body_bytes_total", map[string]string{"direction": "in"}, 10},
		{"iop_tunnel_body_bytes_total", map[string]string{"direction": "out"}, 20},
		{"iop_tokens_total", map[string]string{"model": "m1", "kind": "prompt"}, 6},
		{"iop_tokens_total", map[string]string{"model": "m1", "kind": "completion"}, 9},
		{"iop_tokens_total", map[string]string{"model": "m2", "kind": "prompt"}, float64(domain.MaxUsageTokens)},
		{"iop_history_dropped_rows_total", nil, 4},
		{"iop_eventbus_dropped_total", nil, 3},
		{"iop_nodes_connected", nil, 0},
	}
	for _, c := range checks {
		if got := value(t, f, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if f[name] == nil {
			t.Errorf("runtime/process metric %s missing", name)
		}
	}
}

// A run's model is what its adapter reports — for a chat adapter often the
// caller's target echoed by the upstream — so the models runs' tokens are
// counted under are bounded: past 256 distinct ones, the rest share
// "(other)", and no caller can mint series without end.
func TestRunTokenModelsAreBounded(t *testing.T) {
	m := prom.New(prom.Sources{})
	for i := range 300 {
		m.RunFinished(ports.RunOutcome{Node: "n1", Adapter: "llm", Status: domain.RunSucceeded,
			Usage: &domain.Usage{PromptTokens: 1, Model: fmt.Sprintf("invented-%d", i)}})
	}
	m.RunFinished(ports.RunOutcome{Node: "n1", Adapter: "llm", Status: domain.RunSucceeded, Usage: &domain.Usage{PromptTokens: 1, Model: "invented-0"}})
	f := scrape(t, m)
	if n := len(f["iop_tokens_total"].Metric); n != 257 {
		t.Fatalf("%d iop_tokens_total series, want 256 models and (other)", n)
	}
	if v := value(t, f, "iop_tokens_total", map[string]string{"model": "(other)"}); v != 44 {
		t.Fatalf("(other) counted %v prompt tokens, want 44", v)
	}
	if v := value(t, f, "iop_tokens_total", map[string]string{"model": "invented-0"}); v != 2 {
		t.Fatalf("invented-0 counted %v, want 2 (a model seen before keeps its label)", v)
	}
}

// The bound on runs' models is each node's: one node whose runs report
// models without end (broken or hostile: the model is whatever it says)
// used up a bound all nodes shared, and from then on every other node's
// runs were counted under (other).
func TestRunTokenModelsAreBoundedPerNode(t *testing.T) {
	m := prom.New(prom.Sources{})
	for i := range 300 {
		m.RunFinished(ports.RunOutcome{Node: "bad", Adapter: "llm", Status: domain.RunSucceeded,
			Usage: &domain.Usage{PromptTokens: 1, Model: fmt.Sprintf("invented-%d", i)}})
	}
	m.RunFinished(ports.RunOutcome{Node: "good", Adapter: "llm", Status: domain.RunSucceeded, Usage: &domain.Usage{PromptTokens: 5, Model: "llama3.2"}})
	f := scrape(t, m)
	if v := value(t, f, "iop_tokens_total", map[string]string{"node": "good", "model": "llama3.2"}); v != 5 {
		t.Fatalf("the good node's model counted %v prompt tokens, want 5", v)
	}
	if v := value(t, f, "iop_tokens_total", map[string]string{"node": "bad", "model": "(other)"}); v != 44 {
		t.Fatalf("the bad node's (other) counted %v prompt tokens, want 44", v)
	}
}

// A tunnel's model is one its provider lists, but a caller may grow an
// Ollama provider's list without end (POST /api/copy, then a refresh): past
// 256 models of one provider the rest share "(other)", in the tunnel
// counter and the tokens alike; another provider has its own 256.
func TestTunnelModelsAreBoundedPerProvider(t *testing.T) {
	m := prom.New(prom.Sources{})
	for i := range 300 {
		m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "ollama", Model: fmt.Sprintf("copy-%d:latest", i), Code: "200",
			Usage: &domain.Usage{PromptTokens: 1}})
	}
	m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "ollama", Model: "copy-0:latest", Code: "200"})
	m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "ollama", Model: "(unlisted)", Code: "200"})
	m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "vllm", Model: "m", Code: "200"})
	f := scrape(t, m)
	if n := len(f["iop_tunnel_requests_total"].Metric); n != 256+1+1+1 {
		t.Fatalf("%d iop_tunnel_requests_total series, want 256 models, (other), (unlisted) and vllm's", n)
	}
	if v := value(t, f, "iop_tunnel_requests_total", map[string]string{"provider": "ollama", "model": "(other)"}); v != 44 {
		t.Fatalf("(other) counted %v tunnels, want 44", v)
	}
	if v := value(t, f, "iop_tunnel_requests_total", map[string]string{"provider": "ollama", "model": "copy-0:latest"}); v != 2 {
		t.Fatalf("copy-0 counted %v, want 2 (a model seen before keeps its label)", v)
	}
	if n := len(f["iop_tokens_total"].Metric); n != 257 {
		t.Fatalf("%d iop_tokens_total series, want 256 models and (other)", n)
	}
	if v := value(t, f, "iop_tokens_total", map[string]string{"model": "(other)"}); v != 44 {
		t.Fatalf("(other) counted %v prompt tokens, want 44", v)
	}
}

// A tunnel's first byte may come minutes in (a completion that does not
// stream sends its status when it is done): the buckets reach 30 minutes
// like the runs', and still tell milliseconds apart.
// A run's outcome series were born at the first run to end with that
// outcome, at 1: rate(iop_runs_total{status="failed"}[5m]) (the README's
// error ratio) never saw a node's first failure. They start at 0 when a
// run is dispatched to the pair.
func TestRunOutcomesStartAtZeroAtDispatch(t *testing.T) {
	m := prom.New(prom.Sources{})
	m.RunDispatched("n1", "exec")
	fams := scrape(t, m)
	for _, s := range []string{"succeeded", "failed", "cancelled"} {
		if v := value(t, fams, "iop_runs_total", map[string]string{"node": "n1", "adapter": "exec", "status": s}); v != 0 {
			t.Errorf("%s = %v, want 0", s, v)
		}
	}
	for _, h := range []string{"iop_run_duration_seconds", "iop_run_first_event_seconds"} {
		if v := value(t, fams, h, map[string]string{"adapter": "exec"}); v != 0 {
			t.Errorf("%s count = %v, want 0", h, v)
		}
	}
	m.RunFinished(ports.RunOutcome{Node: "n1", Adapter: "exec", Status: domain.RunFailed, Duration: time.Second})
	if v := value(t, scrape(t, m), "iop_runs_total", map[string]string{"node": "n1", "adapter": "exec", "status": "failed"}); v != 1 {
		t.Fatalf("failed = %v after one failure", v)
	}
}

// Only "accepted" was there from the start: a burst of refusals within
// one scrape interval made its series appear at its count, which no
// increase() or rate() sees, so an alert on unknown_token never fired.
func TestRegistrationOutcomesStartAtZero(t *testing.T) {
	fams := scrape(t, prom.New(prom.Sources{}))
	for _, o := range []string{"accepted", "unknown_token", "duplicate_connection", "identity_mismatch", "config_error", "handshake_failed"} {
		if v := value(t, fams, "iop_node_registrations_total", map[string]string{"outcome": o}); v != 0 {
			t.Errorf("%s = %v, want 0", o, v)
		}
	}
	if n := len(fams["iop_node_registrations_total"].Metric); n != 6 {
		t.Fatalf("%d outcomes, want the 6 the README lists", n)
	}
}

func TestTunnelFirstByteBucketsReachMinutes(t *testing.T) {
	m := prom.New(prom.Sources{})
	m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "p", Model: "m", Code: "200", FirstByte: 45 * time.Second})
	h := scrape(t, m)["iop_tunnel_first_byte_seconds"].Metric[0].Histogram
	var bounds []float64
	for _, b := range h.Bucket {
		bounds = append(bounds, b.GetUpperBound())
	}
	if bounds[0] > 0.005 || bounds[len(bounds)-1] < 1800 {
		t.Fatalf("buckets %v", bounds)
	}
	for _, b := range h.Bucket {
		if b.GetUpperBound() == 30 && b.GetCumulativeCount() != 0 || b.GetUpperBound() == 60 && b.GetCumulativeCount() != 1 {
			t.Fatalf("45 s landed wrong: %v", h.Bucket)
		}
	}
}

// A node may end tunnels with error codes of its own making: they share
// one label value, so it cannot mint series without end; the edge's own
// codes and HTTP statuses keep theirs.
func TestTunnelErrorCodesAreBounded(t *testing.T) {
	m := prom.New(prom.Sources{})
	for i := range 1000 {
		m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "p", Model: "m", Code: fmt.Sprintf("made_up_%d", i)})
	}
	for _, c := range []string{domain.CodeProviderError, domain.CodeNodeDisconnected, "502", "200"} {
		m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "p", Model: "m", Code: c})
	}
	f := scrape(t, m)
	if n := len(f["iop_tunnel_requests_total"].Metric); n != 5 {
		t.Fatalf("%d iop_tunnel_requests_total series, want 5 (other and four known)", n)
	}
	if v := value(t, f, "iop_tunnel_requests_total", map[string]string{"code": "other"}); v != 1000 {
		t.Fatalf("other counted %v, want 1000", v)
	}
	for _, c := range []string{domain.CodeProviderError, domain.CodeNodeDisconnected, "502", "200"} {
		if v := value(t, f, "iop_tunnel_requests_total", map[string]string{"code": c}); v != 1 {
			t.Fatalf("%s counted %v, want 1", c, v)
		}
	}
}

// Label values come from providers and callers: control characters (an
// ESC sequence would reach the terminal of whoever curls /metrics) and
// invalid UTF-8 are written as U+FFFD, and a long value is cut at a
// character boundary.
func TestLabelValuesAreSafeToPrint(t *testing.T) {
	m := prom.New(prom.Sources{})
	m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "p", Model: "evil\x1b[2J\x07\u009bm\x7f", Code: "200"})
	m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "p", Model: "bad\xffutf8", Code: "200"})
	m.TunnelFinished(ports.TunnelOutcome{Node: "n1", Provider: "p", Model: strings.Repeat("a", 127) + "é", Code: "200"})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	if strings.ContainsFunc(body, func(r rune) bool { return r != '\n' && unicode.IsControl(r) }) {
		t.Fatalf("exposition holds control characters:\n%q", body)
	}
	f := scrape(t, m)
	for _, want := range []string{"evil\uFFFD[2J\uFFFD\uFFFDm\uFFFD", "bad\uFFFDutf8", strings.Repeat("a", 127)} {
		if v := value(t, f, "iop_tunnel_requests_total", map[string]string{"model": want}); v != 1 {
			t.Errorf("model %q counted %v, want 1", want, v)
		}
	}
}

// statsLink is a node link that reports stats, as the transport's does.
type statsLink struct {
	ports.NodeLink
	stats domain.NodeStats
}

func (l statsLink) NodeStats() (domain.NodeStats, bool) { return l.stats, true }

// linkWithRTT is a node link with the transport's link stats.
type linkWithRTT struct {
	ports.NodeLink
	rtt time.Duration
}

func (l linkWithRTT) Stats() transport.Stats { return transport.Stats{RTT: l.rtt} }

// A link whose first heartbeat has not come back (30 s by default after
// each connect) exposed a round trip of 0 s; it has no RTT series until
// one is measured.
func TestHeartbeatRTTOnlyOnceMeasured(t *testing.T) {
	reg := edgeapp.NewRegistry()
	for id, rtt := range map[string]time.Duration{"fresh": 0, "measured": 5 * time.Millisecond} {
		if err := reg.Admit(&edgeapp.LiveNode{ID: id, Link: linkWithRTT{rtt: rtt}}); err != nil {
			t.Fatal(err)
		}
	}
	f := scrape(t, prom.New(prom.Sources{Registry: reg}))
	fam := f["iop_link_heartbeat_rtt_seconds"]
	if fam == nil || len(fam.Metric) != 1 || fam.Metric[0].GetGauge().GetValue() != 0.005 {
		t.Fatalf("RTT series %v, want only the measured node's 0.005", fam)
	}
	if v := value(t, f, "iop_link_frames_total", map[string]string{"node": "fresh", "direction": "in"}); v != 0 {
		t.Fatalf("fresh node's frames in = %v", v)
	}
}

// Two names that differ only where label() cuts or replaces are one
// series: exposing it twice failed the whole scrape, every node's metrics
// lost to one node's names. A node's stats may name anything (here control
// characters, which label() writes as U+FFFD); the configs' names are at
// most 128 bytes, but the collector must not rely on that (the long names
// here).
func TestSeriesWhoseLabelsCollideDoNotFailTheScrape(t *testing.T) {
	reg := edgeapp.NewRegistry()
	long := strings.Repeat("a", 128)
	stats := domain.NodeStats{
		Adapters:  []domain.AdapterSlots{{Name: "x\x01", Max: 2, InFlight: 1}, {Name: "x\x02", Max: 3}},
		Providers: []domain.ProviderLatency{{Name: "p\x01", Count: 1, Seconds: 1}, {Name: "p\x02", Count: 2, Seconds: 2}},
	}
	cfg := domain.NodeConfig{Adapters: []domain.AdapterConfig{{Name: long + "1", Type: "exec"}, {Name: long + "2", Type: "exec"}}}
	if err := reg.Admit(&edgeapp.LiveNode{ID: "bad", Link: statsLink{stats: stats}, Config: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := reg.Admit(&edgeapp.LiveNode{ID: "good", Link: statsLink{stats: domain.NodeStats{ChildProcesses: 4}}}); err != nil {
		t.Fatal(err)
	}
	m := prom.New(prom.Sources{Registry: reg})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("scrape: %d %.500s", rec.Code, rec.Body)
	}
	f := scrape(t, m)
	if v := value(t, f, "iop_node_child_processes", map[string]string{"node": "good"}); v != 4 {
		t.Errorf("good node's child processes = %v, want 4", v)
	}
	if v := value(t, f, "iop_node_adapter_slots", map[string]string{"node": "bad", "adapter": "x\uFFFD"}); v != 2 {
		t.Errorf("slots of the first x\\uFFFD = %v, want 2 (the first reported)", v)
	}
	value(t, f, "iop_runs_in_flight", map[string]string{"node": "bad", "adapter": long})
	if fam := f["iop_node_provider_first_byte_seconds"]; fam == nil || len(fam.Metric) != 1 || fam.Metric[0].GetSummary().GetSampleCount() != 1 {
		t.Errorf("provider latency: %v, want one series, the first reported", fam)
	}
}
