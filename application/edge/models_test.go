package edge_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/adapters/provider/models"
	"iop/application/edge"
	"iop/domain"
	"iop/internal/lockedbuf"
	"iop/ports"
)

const ptOpenAIModels = `{"object":"list","data":[
 {"id":"qwen2.5-72b","object":"model","created":1715000000,"owned_by":"vllm"},
 {"id":"","object":"model"},
 {"id":"bge-m3","object":"model","created":1716000000,"owned_by":"vllm"}]}`

const ptOllamaTags = `{"models":[
 {"name":"llama3.2:latest","model":"llama3.2:latest","modified_at":"2024-09-25T10:00:00.123456789-07:00","size":2019393189,"digest":"a80c4f17","details":{"format":"gguf","family":"llama","parameter_size":"3.2B","quantization_level":"Q4_K_M"}},
 {"model":"qwen3:8b","modified_at":"bad time","size":1}]}`

// ptDiscovery answers model discovery: /v1/models and /api/tags with the
// given bodies, counting calls.
func ptDiscovery(openai, ollama string, calls *atomic.Int32) func(domain.TunnelRequest) (ports.TunnelStream, error) {
	return func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		calls.Add(1)
		if req.Method != http.MethodGet {
			return newPTStream(nil, domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: "bad_method"}}), nil
		}
		switch req.Path {
		case "/v1/models":
			return newPTStream(nil, ptOK(openai)...), nil
		case "/api/tags":
			return newPTStream(nil, ptOK(ollama)...), nil
		}
		return newPTStream(nil, domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 404}, domain.TunnelFrame{Kind: domain.TunnelEnd}), nil
	}
}

func ptIDs(es []edge.ModelEntry) string {
	var out []string
	for _, e := range es {
		out = append(out, e.ID+"@"+e.Node+"/"+e.Provider)
	}
	return strings.Join(out, " ")
}

func TestModelCatalogDiscoversBothShapes(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	var calls atomic.Int32
	link := ptAdmit(t, reg, "gpu", ptProvider("vllm", domain.ProviderOpenAI), ptProvider("ollama", domain.ProviderOllama), ptProvider("fixed", domain.ProviderOpenAI, "declared-1"))
	link.open = ptDiscovery(ptOpenAIModels, ptOllamaTags, &calls)

	if got := ptIDs(cat.Models()); got != "declared-1@gpu/fixed" {
		t.Fatalf("before discovery: %s", got)
	}
	if err := cat.Refresh(context.Background(), "gpu"); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d discovery tunnels, want 2 (declared models need none)", n)
	}
	for _, c := range link.calls() {
		if c.req.Method != http.MethodGet || (c.req.Provider == "vllm") != (c.req.Path == "/v1/models") {
			t.Fatalf("discovery request %+v", c.req)
		}
	}
	models := cat.Models()
	if got, want := ptIDs(models), "bge-m3@gpu/vllm declared-1@gpu/fixed llama3.2:latest@gpu/ollama qwen2.5-72b@gpu/vllm qwen3:8b@gpu/ollama"; got != want {
		t.Fatalf("models = %s\nwant     %s", got, want)
	}
	byID := map[string]edge.ModelEntry{}
	for _, m := range models {
		byID[m.ID] = m
	}
	if m := byID["qwen2.5-72b"]; m.Created != 1715000000 || m.Type != domain.ProviderOpenAI || m.Raw != nil {
		t.Fatalf("openai entry = %+v", m)
	}
	if m := byID["llama3.2:latest"]; m.Type != domain.ProviderOllama || !strings.Contains(string(m.Raw), `"digest":"a80c4f17"`) ||
		m.Created != time.Date(2024, 9, 25, 17, 0, 0, 0, time.UTC).Unix() {
		t.Fatalf("ollama entry = %+v", m)
	}
	if m := byID["qwen3:8b"]; m.Created != 1700000000 {
		t.Fatalf("entry without a usable time = %+v, want the connect time", m)
	}

	if got := ptIDs(cat.Lookup(domain.ProviderOllama, "llama3.2")); got != "llama3.2:latest@gpu/ollama" {
		t.Fatalf("Lookup(ollama, llama3.2) = %s", got)
	}
	if got := ptIDs(cat.Lookup(domain.ProviderOpenAI, "llama3.2:latest")); got != "llama3.2:latest@gpu/ollama" {
		t.Fatalf("Lookup(openai, llama3.2:latest) = %s", got)
	}
	if got := ptIDs(cat.Lookup(domain.ProviderOllama, "bge-m3")); got != "" {
		t.Fatalf("Lookup(ollama, bge-m3) = %s, want nothing (openai providers do not speak ollama)", got)
	}
	if nm, err := cat.NodeModels("gpu"); err != nil || len(nm) != 5 {
		t.Fatalf("NodeModels = %d, %v", len(nm), err)
	}
	if _, err := cat.NodeModels("other"); !errors.Is(err, domain.ErrNodeNotFound) {
		t.Fatalf("NodeModels(other) err = %v", err)
	}
}

func TestModelCatalogDropsGoneNodes(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	var calls atomic.Int32
	link := ptAdmit(t, reg, "a", ptProvider("vllm", domain.ProviderOpenAI))
	link.open = ptDiscovery(ptOpenAIModels, ptOllamaTags, &calls)
	ptAdmit(t, reg, "b", ptProvider("fixed", domain.ProviderOpenAI, "m"))
	cat.RefreshAll(context.Background())
	if got := ptIDs(cat.Models()); got != "bge-m3@a/vllm m@b/fixed qwen2.5-72b@a/vllm" {
		t.Fatalf("models = %s", got)
	}

	reg.Remove("b", mustView(t, reg, "b").Link)
	if got := ptIDs(cat.Models()); got != "bge-m3@a/vllm qwen2.5-72b@a/vllm" {
		t.Fatalf("after b left: %s", got)
	}

	// a reconnects over a new link: what was discovered over the old one is
	// stale until the next refresh.
	reg.Remove("a", link)
	link2 := ptAdmit(t, reg, "a", ptProvider("vllm", domain.ProviderOpenAI))
	if got := ptIDs(cat.Models()); got != "" {
		t.Fatalf("after a reconnected: %s", got)
	}
	link2.open = ptDiscovery(`{"object":"list","data":[{"id":"new-model"}]}`, "", &calls)
	if err := cat.Refresh(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if got := ptIDs(cat.Models()); got != "new-model@a/vllm" {
		t.Fatalf("after refresh: %s", got)
	}
	if err := cat.Refresh(context.Background(), "b"); !errors.Is(err, domain.ErrNodeNotFound) {
		t.Fatalf("Refresh(gone node) = %v", err)
	}
}

func mustView(t *testing.T, reg *edge.Registry, id string) edge.NodeView {
	t.Helper()
	v, ok := reg.Get(id)
	if !ok {
		t.Fatalf("node %s not connected", id)
	}
	return v
}

func TestModelCatalogDiscoveryFailureKeepsLastList(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	var calls atomic.Int32
	link := ptAdmit(t, reg, "a", ptProvider("vllm", domain.ProviderOpenAI))
	link.open = ptDiscovery(ptOpenAIModels, "", &calls)
	if err := cat.Refresh(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	failures := []func(domain.TunnelRequest) (ports.TunnelStream, error){
		func(domain.TunnelRequest) (ports.TunnelStream, error) {
			return nil, domain.Errorf(domain.CodeNodeDisconnected, "gone")
		},
		func(domain.TunnelRequest) (ports.TunnelStream, error) {
			return newPTStream(nil, domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderUnreachable, Message: "refused"}}), nil
		},
		func(domain.TunnelRequest) (ports.TunnelStream, error) {
			return newPTStream(nil, domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 500}, domain.TunnelFrame{Kind: domain.TunnelEnd}), nil
		},
		func(domain.TunnelRequest) (ports.TunnelStream, error) {
			return newPTStream(nil, ptOK("<html>")...), nil
		},
		func(domain.TunnelRequest) (ports.TunnelStream, error) {
			return newPTStream(domain.Errorf(domain.CodeNodeDisconnected, "lost"), domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200}), nil
		},
	}
	for i, f := range failures {
		link.open = f
		if err := cat.Refresh(context.Background(), "a"); err == nil {
			t.Fatalf("failure %d: Refresh returned nil", i)
		}
		if got := ptIDs(cat.Models()); got != "bge-m3@a/vllm qwen2.5-72b@a/vllm" {
			t.Fatalf("failure %d: models = %s, want the last good list", i, got)
		}
	}
}

func TestModelCatalogDiscoveryTimesOut(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	cat.DiscoveryTimeout = 50 * time.Millisecond
	st := newPTStream(nil) // never answers
	ptAdmit(t, reg, "a", ptProvider("vllm", domain.ProviderOpenAI)).open = func(domain.TunnelRequest) (ports.TunnelStream, error) { return st, nil }
	start := time.Now()
	if err := cat.Refresh(context.Background(), "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > 2*time.Second || !st.isClosed() {
		t.Fatal("discovery did not give up and close its tunnel")
	}
}

func TestModelCatalogRun(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	var calls atomic.Int32
	ptAdmit(t, reg, "a", ptProvider("vllm", domain.ProviderOpenAI)).open = ptDiscovery(ptOpenAIModels, "", &calls)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		cat.Run(ctx, 10*time.Millisecond)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("Run did not refresh periodically")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after ctx ended")
	}
	if len(cat.Models()) != 2 {
		t.Fatalf("models = %s", ptIDs(cat.Models()))
	}
}

func TestMatchModel(t *testing.T) {
	cases := []struct {
		served, requested string
		want              bool
	}{
		{"llama3.2:latest", "llama3.2", true},
		{"llama3.2", "llama3.2:latest", true},
		{"llama3.2:latest", "llama3.2:latest", true},
		{"llama3.2:3b", "llama3.2", false},
		{"gpt-4o", "gpt-4o-mini", false},
		{"a", "a", true},
	}
	for _, c := range cases {
		if got := edge.MatchModel(c.served, c.requested); got != c.want {
			t.Errorf("MatchModel(%q, %q) = %v", c.served, c.requested, got)
		}
	}
}

func TestOllamaName(t *testing.T) {
	for in, want := range map[string]string{
		"llama3.2":         "llama3.2:latest",
		"Llama3.2":         "llama3.2:latest",
		"library/llama3.2": "llama3.2:latest",
		"registry.ollama.ai/library/llama3.2:latest": "llama3.2:latest",
		"llama3.2:3B":               "llama3.2:3b",
		"hf.co/Org/Model:Q4_K_M":    "hf.co/org/model:q4_k_m",
		"localhost:5000/team/model": "localhost:5000/team/model:latest",
		"":                          "",
	} {
		if got := edge.OllamaName(in); got != want {
			t.Errorf("OllamaName(%q) = %q, want %q", in, got, want)
		}
	}
	if !edge.MatchProviderModel(domain.ProviderOllama, "llama3.2:latest", "Library/Llama3.2") ||
		edge.MatchProviderModel(domain.ProviderOpenAI, "Qwen3", "qwen3") {
		t.Error("MatchProviderModel: Ollama's name forms are for ollama providers only")
	}
}

func TestModelCatalogFollow(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	var calls atomic.Int32
	ptAdmit(t, reg, "a", ptProvider("vllm", domain.ProviderOpenAI)).open = ptDiscovery(ptOpenAIModels, "", &calls)
	events := make(chan domain.BusEvent, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		cat.Follow(ctx, events)
	}()
	events <- domain.BusEvent{Type: domain.BusRunEvent, Node: "a"} // ignored
	events <- domain.BusEvent{Type: domain.BusNodeRegistered, Node: "a"}
	deadline := time.Now().Add(5 * time.Second)
	for len(cat.Models()) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("registration did not trigger discovery")
		}
		time.Sleep(5 * time.Millisecond)
	}
	reg.Remove("a", mustView(t, reg, "a").Link)
	events <- domain.BusEvent{Type: domain.BusNodeDisconnected, Node: "a"}
	close(events)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Follow did not return when its channel closed")
	}
	if len(cat.Models()) != 0 || calls.Load() != 1 {
		t.Fatalf("models %s after disconnect, %d discoveries", ptIDs(cat.Models()), calls.Load())
	}
}

func TestModelCatalogRefreshedSince(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	cat.MinRefreshGap = 300 * time.Millisecond
	var calls atomic.Int32
	link := ptAdmit(t, reg, "gpu", ptProvider("ollama", domain.ProviderOllama))
	link.open = ptDiscovery(ptOpenAIModels, ptOllamaTags, &calls)
	ctx := context.Background()
	cat.RefreshedSince(ctx, time.Now())
	if n := calls.Load(); n != 1 || !strings.Contains(ptIDs(cat.Models()), "llama3.2:latest@gpu/ollama") {
		t.Fatalf("first refresh: %d discoveries, models %s", n, ptIDs(cat.Models()))
	}
	// Asked about a moment already covered: no new round.
	cat.RefreshedSince(ctx, time.Now().Add(-time.Hour))
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d discoveries for a covered moment, want 1", n)
	}
	// Twenty callers arriving now share one round, which waits for the gap.
	since := time.Now()
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); cat.RefreshedSince(ctx, since) }()
	}
	wg.Wait()
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d discoveries for twenty callers, want 2", n)
	}
	// A caller whose context ends does not wait.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	cat.RefreshedSince(cctx, time.Now().Add(time.Hour))
}

// TestModelCatalogPagesAnthropicModels: an anthropic provider's list is
// asked 1,000 at a time and followed while it has more, and a listed dated
// model is served under its aliases.
func TestModelCatalogPagesAnthropicModels(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	link := ptAdmit(t, reg, "gw", ptProvider("claude", domain.ProviderAnthropic), ptProvider("vllm", domain.ProviderOpenAI))
	pages := map[string]string{
		"limit=1000": `{"data":[{"type":"model","id":"claude-sonnet-4-5-20250929","created_at":"2025-09-29T00:00:00Z"}],"has_more":true,"first_id":"claude-sonnet-4-5-20250929","last_id":"claude-sonnet-4-5-20250929"}`,
		"after_id=claude-sonnet-4-5-20250929&limit=1000": `{"data":[{"type":"model","id":"claude-3-7-sonnet-20250219","created_at":"2025-02-19T00:00:00Z"}],"has_more":false,"first_id":"claude-3-7-sonnet-20250219","last_id":"claude-3-7-sonnet-20250219"}`,
	}
	link.open = func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		if req.Provider == "vllm" {
			return newPTStream(nil, ptOK(`{"data":[{"id":"qwen-20250101"}],"has_more":true,"last_id":"qwen-20250101"}`)...), nil
		}
		if body, ok := pages[req.Query]; ok && req.Path == "/v1/models" {
			return newPTStream(nil, ptOK(body)...), nil
		}
		return newPTStream(nil, domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 400}, domain.TunnelFrame{Kind: domain.TunnelEnd}), nil
	}
	if err := cat.Refresh(context.Background(), "gw"); err != nil {
		t.Fatal(err)
	}
	if got, want := ptIDs(cat.Models()), "claude-3-7-sonnet-20250219@gw/claude claude-sonnet-4-5-20250929@gw/claude qwen-20250101@gw/vllm"; got != want {
		t.Fatalf("models = %s\nwant     %s", got, want)
	}
	if n := len(link.calls()); n != 3 {
		t.Fatalf("%d discovery tunnels, want 3 (two anthropic pages, one openai list)", n)
	}
	for requested, want := range map[string]string{
		"claude-sonnet-4-5":          "claude-sonnet-4-5-20250929@gw/claude",
		"claude-sonnet-4-5-20250929": "claude-sonnet-4-5-20250929@gw/claude",
		"claude-3-7-sonnet-latest":   "claude-3-7-sonnet-20250219@gw/claude",
		"claude-sonnet-4":            "",
		"claude-sonnet-4-5-2025":     "",
		"qwen":                       "", // aliases are Anthropic's, not every provider's
	} {
		if got := ptIDs(cat.Lookup(domain.ProviderAnthropic, requested)); got != want {
			t.Errorf("Lookup(anthropic, %s) = %q, want %q", requested, got, want)
		}
	}
}

// TestModelCatalogStopsAPagingLoop: a provider that answers the same page
// again fails discovery rather than being asked until the byte bound.
func TestModelCatalogStopsAPagingLoop(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	link := ptAdmit(t, reg, "gw", ptProvider("claude", domain.ProviderAnthropic))
	link.open = func(domain.TunnelRequest) (ports.TunnelStream, error) {
		return newPTStream(nil, ptOK(`{"data":[{"id":"claude-x-20250101"}],"has_more":true,"last_id":"claude-x-20250101"}`)...), nil
	}
	if err := cat.Refresh(context.Background(), "gw"); err == nil || !strings.Contains(err.Error(), "same page") {
		t.Fatalf("err = %v", err)
	}
	if n := len(link.calls()); n != 2 {
		t.Fatalf("%d tunnels, want 2", n)
	}
}

// A node's discoveries run concurrently: one begun over a link the node
// has since left, ending after the discovery over its new link, does not
// replace that list (the node's models would be unlisted until the next
// round); nor does one for a config older than the list's.
func TestModelCatalogStaleDiscoveryKeepsTheNewerList(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	var calls atomic.Int32
	old := ptAdmit(t, reg, "gpu", ptProvider("vllm", domain.ProviderOpenAI))
	entered, release := make(chan struct{}), make(chan struct{})
	old.open = func(domain.TunnelRequest) (ports.TunnelStream, error) {
		close(entered)
		<-release // the link breaks while its discovery waits
		return nil, domain.Errorf(domain.CodeNodeDisconnected, "link closed")
	}
	done := make(chan error, 1)
	go func() { done <- cat.Refresh(context.Background(), "gpu") }()
	<-entered
	// The node is back on a new link, and its discovery ends first.
	if !reg.Remove("gpu", old) {
		t.Fatal("gpu was not on its link")
	}
	ptAdmit(t, reg, "gpu", ptProvider("vllm", domain.ProviderOpenAI)).open = ptDiscovery(ptOpenAIModels, "", &calls)
	if err := cat.Refresh(context.Background(), "gpu"); err != nil {
		t.Fatal(err)
	}
	want := ptIDs(cat.Models())
	if want == "" {
		t.Fatal("the new link's discovery found nothing")
	}
	close(release)
	if err := <-done; err == nil {
		t.Fatal("the old link's discovery did not fail")
	}
	if got := ptIDs(cat.Models()); got != want {
		t.Fatalf("after the old link's discovery failed: %q, want %q", got, want)
	}
}

// On one link, a discovery for a config a reload has since replaced, ending
// after the discovery for the new config, does not put its list back: it
// was made for the provider as it was, so the provider would count as
// unlisted until the next round.
func TestModelCatalogDiscoveryOfAnOlderConfigIsDropped(t *testing.T) {
	reg := edge.NewRegistry()
	cat := edge.NewModelCatalog(reg, models.Lists{}, nil)
	var calls atomic.Int32
	link := ptAdmit(t, reg, "gpu", ptProvider("vllm", domain.ProviderOpenAI))
	serve := ptDiscovery(ptOpenAIModels, ptOllamaTags, &calls)
	entered, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	link.open = func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		blocked := false
		first.Do(func() { blocked = true })
		if blocked {
			close(entered)
			<-release
		}
		return serve(req)
	}
	done := make(chan error, 1)
	go func() { done <- cat.Refresh(context.Background(), "gpu") }() // config v1: vllm
	<-entered
	moved := ptProvider("vllm", domain.ProviderOpenAI)
	moved.BaseURL = "http://vllm-2.local" // the reload moved it
	reg.SetConfig("gpu", link, domain.NodeConfig{NodeID: "gpu", Version: 2, Providers: []domain.ProviderConfig{moved}})
	if err := cat.Refresh(context.Background(), "gpu"); err != nil {
		t.Fatal(err)
	}
	want := ptIDs(cat.Models())
	if want == "" {
		t.Fatal("the v2 discovery found nothing")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := ptIDs(cat.Models()); got != want {
		t.Fatalf("after the v1 discovery ended: %q, want v2's %q", got, want)
	}
}

// An anthropic provider serves a model under every name Anthropic does: a
// listed dated id its aliases (-latest, and -0 for a bare major version),
// and a declared alias the dated ids it stands for (Claude Code asks for
// claude-sonnet-4-5-20250929 where the config says claude-sonnet-4-5). Two
// different dated ids, or different models, never match.
func TestAnthropicAliasesBothWays(t *testing.T) {
	for _, c := range []struct {
		served, requested string
		want              bool
	}{
		{"claude-sonnet-4-5-20250929", "claude-sonnet-4-5", true},
		{"claude-sonnet-4-5-20250929", "claude-sonnet-4-5-latest", true},
		{"claude-opus-4-20250514", "claude-opus-4-0", true},
		{"claude-opus-4-20250514", "claude-opus-4", true},
		{"claude-sonnet-4-5", "claude-sonnet-4-5-20250929", true},
		{"claude-haiku-4-5", "claude-haiku-4-5-20251001", true},
		{"claude-opus-4-0", "claude-opus-4-20250514", true},
		{"claude-opus-4-0", "claude-opus-4", true},
		{"claude-3-7-sonnet-latest", "claude-3-7-sonnet-20250219", true},
		{"claude-3-5-sonnet-20240620", "claude-3-5-sonnet-20241022", false},
		{"claude-sonnet-4-5", "claude-sonnet-4-20250514", false},
		{"claude-sonnet-4-5-20250929", "claude-sonnet-4", false},
		{"claude-sonnet-4-5-20250929", "claude-sonnet-4-5-0", false},
	} {
		if got := edge.MatchProviderModel(domain.ProviderAnthropic, c.served, c.requested); got != c.want {
			t.Errorf("served %s, requested %s: %v, want %v", c.served, c.requested, got, c.want)
		}
	}
	if edge.MatchProviderModel(domain.ProviderOpenAI, "claude-sonnet-4-5", "claude-sonnet-4-5-20250929") {
		t.Error("an openai provider matched an Anthropic alias")
	}
}

// ptManyModels is an OpenAI model list of n short ids m00000, m00001, ….
func ptManyModels(n int) string {
	var b strings.Builder
	b.WriteString(`{"object":"list","data":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"m%05d"}`, i)
	}
	b.WriteString(`]}`)
	return b.String()
}

// TestModelCatalogCapsADiscoveredList: a provider listing more than
// MaxListModels models (default 10,000) has its first 10,000 kept, and the
// edge warns once, naming the provider and the count, not on every round.
func TestModelCatalogCapsADiscoveredList(t *testing.T) {
	reg := edge.NewRegistry()
	var logs lockedbuf.Buffer
	cat := edge.NewModelCatalog(reg, models.Lists{}, slog.New(slog.NewTextHandler(&logs, nil)))
	var calls atomic.Int32
	link := ptAdmit(t, reg, "a", ptProvider("flood", domain.ProviderOpenAI), ptProvider("small", domain.ProviderOpenAI))
	flood := ptManyModels(10_005)
	link.open = func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		calls.Add(1)
		if req.Provider == "flood" {
			return newPTStream(nil, ptOK(flood)...), nil
		}
		return newPTStream(nil, ptOK(`{"data":[{"id":"small-1"}]}`)...), nil
	}
	for range 2 {
		if err := cat.Refresh(context.Background(), "a"); err != nil {
			t.Fatal(err)
		}
	}
	nm, err := cat.NodeModels("a")
	if err != nil {
		t.Fatal(err)
	}
	byProvider := map[string][]string{}
	for _, e := range nm {
		byProvider[e.Provider] = append(byProvider[e.Provider], e.ID)
	}
	if f := byProvider["flood"]; len(f) != 10_000 || f[0] != "m00000" || f[len(f)-1] != "m09999" {
		t.Fatalf("flood kept %d models (%v … %v), want m00000 … m09999", len(f), f[:1], f[len(f)-1:])
	}
	if s := byProvider["small"]; len(s) != 1 {
		t.Fatalf("small = %v", s)
	}
	if got := strings.Count(logs.String(), "provider lists more models than the edge keeps"); got != 1 ||
		!strings.Contains(logs.String(), "provider=flood") || !strings.Contains(logs.String(), "listed=10005") || !strings.Contains(logs.String(), "kept=10000") {
		t.Fatalf("%d warnings over two rounds, want 1 naming provider flood and its count:\n%s", got, logs.String())
	}
	// A list whose count changes is warned about again.
	flood = ptManyModels(10_010)
	if err := cat.Refresh(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(logs.String(), "listed=10010"); got != 1 {
		t.Fatalf("changed count warned %d times:\n%s", got, logs.String())
	}
}

// ptCtxStream is a ptStream that, as a real tunnel does, fails once its
// context has ended, even with frames left.
type ptCtxStream struct{ *ptStream }

func (s ptCtxStream) Recv(ctx context.Context) (domain.TunnelFrame, error) {
	if err := ctx.Err(); err != nil {
		return domain.TunnelFrame{}, err
	}
	return s.ptStream.Recv(ctx)
}

// TestModelCatalogHungProviderDoesNotFailTheNext: a node's providers are
// discovered independently, so one that hangs (listed first) does not use
// up the round's time for the one after it: a model just pulled on the
// second is listed after a refresh, and the hung one's failure is logged
// (once, not on every round).
func TestModelCatalogHungProviderDoesNotFailTheNext(t *testing.T) {
	reg := edge.NewRegistry()
	var logs lockedbuf.Buffer
	cat := edge.NewModelCatalog(reg, models.Lists{}, slog.New(slog.NewTextHandler(&logs, nil)))
	// The fresh provider answers at once, but within this on a loaded
	// machine too (100 ms was near what a descheduled goroutine can lose).
	cat.DiscoveryTimeout = 500 * time.Millisecond
	cat.MinRefreshGap = 0
	link := ptAdmit(t, reg, "a", ptProvider("hung", domain.ProviderOpenAI), ptProvider("fresh", domain.ProviderOllama))
	link.open = func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		if req.Provider == "hung" {
			return ptCtxStream{newPTStream(nil)}, nil // never answers
		}
		return ptCtxStream{newPTStream(nil, ptOK(`{"models":[{"name":"just-pulled:latest"}]}`)...)}, nil
	}
	for range 2 {
		cat.RefreshedSince(context.Background(), time.Now())
	}
	if got := ptIDs(cat.Lookup(domain.ProviderOllama, "just-pulled")); got != "just-pulled:latest@a/fresh" {
		t.Fatalf("Lookup(just-pulled) = %q after a refresh, want the fresh provider's model", got)
	}
	if got := strings.Count(logs.String(), "model discovery failed"); got != 1 || !strings.Contains(logs.String(), "provider=hung") {
		t.Fatalf("%d discovery failure lines over two rounds, want 1 naming provider hung:\n%s", got, logs.String())
	}
}
