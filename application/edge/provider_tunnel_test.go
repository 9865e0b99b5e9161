package edge_test

// Identifiers in the provider tunnel, model catalog and usage ledger tests
// are prefixed "pt" so they share the edge_test package without clashing.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/adapters/provider/models"
	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// ptStream is a scripted ports.TunnelStream: it returns frames, then end
// (an error) if set, or else blocks until ctx ends or the stream is closed.
type ptStream struct {
	mu     sync.Mutex
	frames []domain.TunnelFrame
	end    error
	closed chan struct{}
	once   sync.Once
}

func newPTStream(end error, frames ...domain.TunnelFrame) *ptStream {
	return &ptStream{frames: frames, end: end, closed: make(chan struct{})}
}

func (s *ptStream) Recv(ctx context.Context) (domain.TunnelFrame, error) {
	s.mu.Lock()
	if len(s.frames) > 0 {
		f := s.frames[0]
		s.frames = s.frames[1:]
		s.mu.Unlock()
		return f, nil
	}
	end := s.end
	s.mu.Unlock()
	if end != nil {
		return domain.TunnelFrame{}, end
	}
	select {
	case <-ctx.Done():
		return domain.TunnelFrame{}, ctx.Err()
	case <-s.closed:
		return domain.TunnelFrame{}, errors.New("stream closed")
	}
}

func (s *ptStream) Close() { s.once.Do(func() { close(s.closed) }) }

func (s *ptStream) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// ptOpened is one OpenTunnel call.
type ptOpened struct {
	req  domain.TunnelRequest
	body []byte // what the body reader yielded
}

// ptLink is a ports.NodeLink whose OpenTunnel answers with open (or an
// end-only stream when open is nil); other methods are inert.
type ptLink struct {
	id   string
	open func(req domain.TunnelRequest) (ports.TunnelStream, error)

	mu     sync.Mutex
	opened []ptOpened
}

func (l *ptLink) OpenTunnel(_ context.Context, req domain.TunnelRequest, body io.Reader) (ports.TunnelStream, error) {
	o := ptOpened{req: req}
	if body != nil {
		o.body, _ = io.ReadAll(body)
	}
	l.mu.Lock()
	l.opened = append(l.opened, o)
	l.mu.Unlock()
	if l.open == nil {
		return newPTStream(nil, ptOK("{}")...), nil
	}
	return l.open(req)
}

func (l *ptLink) calls() []ptOpened {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]ptOpened(nil), l.opened...)
}

func (l *ptLink) StartRun(context.Context, domain.RunRequest) (ports.RunStream, error) {
	return nil, errors.New("no runs")
}
func (l *ptLink) CancelRun(context.Context, string, string) error                { return nil }
func (l *ptLink) TerminateSession(context.Context, string, string, string) error { return nil }
func (l *ptLink) Command(context.Context, string, []byte) (ports.CommandStream, error) {
	return nil, errors.New("no commands")
}
func (l *ptLink) PushConfig(context.Context, domain.NodeConfig) error { return nil }
func (l *ptLink) Close(string)                                        {}

// ptBus records published events.
type ptBus struct {
	mu  sync.Mutex
	evs []domain.BusEvent
}

func (b *ptBus) Publish(ev domain.BusEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.evs = append(b.evs, ev)
}

func (b *ptBus) events() []domain.BusEvent {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]domain.BusEvent(nil), b.evs...)
}

// ptOK is a complete 200 JSON response.
func ptOK(body string) []domain.TunnelFrame {
	return []domain.TunnelFrame{
		{Kind: domain.TunnelStatus, Status: 200},
		{Kind: domain.TunnelHeader, Header: domain.Header{"Content-Type": {"application/json"}}},
		{Kind: domain.TunnelBody, Body: []byte(body)},
		{Kind: domain.TunnelEnd},
	}
}

func ptProvider(name, typ string, models ...string) domain.ProviderConfig {
	return domain.ProviderConfig{Name: name, Type: typ, BaseURL: "http://" + name + ".local", Models: models}
}

// ptAdmit connects node id with providers to reg and returns its link.
func ptAdmit(t *testing.T, reg *edge.Registry, id string, providers ...domain.ProviderConfig) *ptLink {
	t.Helper()
	l := &ptLink{id: id}
	n := &edge.LiveNode{ID: id, Link: l, ConnectedAt: time.Unix(1700000000, 0), Config: domain.NodeConfig{NodeID: id, Version: 1, Providers: providers}}
	if err := reg.Admit(n); err != nil {
		t.Fatal(err)
	}
	return l
}

type ptEnv struct {
	reg     *edge.Registry
	bus     *ptBus
	catalog *edge.ModelCatalog
	ledger  *edge.UsageLedger
	h       *edge.SubmitProviderTunnelHandler
}

func newPTEnv() *ptEnv {
	e := &ptEnv{reg: edge.NewRegistry(), bus: &ptBus{}, ledger: edge.NewUsageLedger()}
	e.catalog = edge.NewModelCatalog(e.reg, models.Lists{}, nil)
	e.h = edge.NewSubmitProviderTunnelHandler(e.reg, e.bus, e.catalog, e.ledger, nil)
	return e
}

func (e *ptEnv) inFlight(t *testing.T, node string) int {
	t.Helper()
	v, ok := e.reg.Get(node)
	if !ok {
		t.Fatalf("node %s not connected", node)
	}
	return v.TunnelsInFlight
}

// drain reads tun to its end, returning the body and the final error (nil
// after an end frame).
func ptDrain(t *testing.T, tun *edge.Tunnel) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var body strings.Builder
	for {
		f, err := tun.Next(ctx)
		if err != nil {
			return body.String(), err
		}
		switch f.Kind {
		case domain.TunnelBody:
			body.Write(f.Body)
		case domain.TunnelEnd:
			if _, err := tun.Next(ctx); !errors.Is(err, io.EOF) {
				t.Fatalf("Next after end = %v, want io.EOF", err)
			}
			return body.String(), nil
		}
	}
}

func TestNewSubmitProviderTunnelHandlerRefusesNil(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic on nil dependency")
		}
	}()
	edge.NewSubmitProviderTunnelHandler(edge.NewRegistry(), nil, nil, nil, nil)
}

func TestProviderTunnelRouting(t *testing.T) {
	type node struct {
		id        string
		providers []domain.ProviderConfig
	}
	std := []node{
		{"a", []domain.ProviderConfig{ptProvider("vllm", domain.ProviderOpenAI, "qwen-32b", "shared")}},
		{"b", []domain.ProviderConfig{ptProvider("ollama", domain.ProviderOllama, "llama3.2:latest", "shared")}},
	}
	cases := []struct {
		name     string
		nodes    []node
		in       edge.SubmitProviderTunnel
		wantNode string
		wantProv string
		wantCode string
	}{
		{"openai model on openai provider", std, edge.SubmitProviderTunnel{Model: "qwen-32b", ProviderType: "openai"}, "a", "vllm", ""},
		{"ollama serves the openai family", std, edge.SubmitProviderTunnel{Model: "llama3.2:latest", ProviderType: "openai"}, "b", "ollama", ""},
		{"implicit :latest", std, edge.SubmitProviderTunnel{Model: "llama3.2", ProviderType: "ollama"}, "b", "ollama", ""},
		{"openai provider does not speak ollama", std, edge.SubmitProviderTunnel{Model: "qwen-32b", ProviderType: "ollama"}, "", "", domain.CodeModelNotFound},
		{"pin", std, edge.SubmitProviderTunnel{Node: "b", Model: "shared", ProviderType: "openai"}, "b", "ollama", ""},
		{"pin to unknown node", std, edge.SubmitProviderTunnel{Node: "zz", Model: "shared", ProviderType: "openai"}, "", "", domain.CodeNodeNotFound},
		{"pin to node without the model", std, edge.SubmitProviderTunnel{Node: "a", Model: "llama3.2", ProviderType: "openai"}, "", "", domain.CodeModelNotFound},
		{"pin to node without the family", std, edge.SubmitProviderTunnel{Node: "a", ProviderType: "ollama", Method: "GET", Path: "/api/tags"}, "", "", domain.CodeProviderNotFound},
		{"pin without model takes any provider of the family", std, edge.SubmitProviderTunnel{Node: "b", ProviderType: "ollama", Method: "GET", Path: "/api/tags"}, "b", "ollama", ""},
		{"unknown model", std, edge.SubmitProviderTunnel{Model: "gpt-9", ProviderType: "openai"}, "", "", domain.CodeModelNotFound},
		{"no node with the family", std[:1], edge.SubmitProviderTunnel{Model: "llama3.2", ProviderType: "ollama"}, "", "", domain.CodeNoNodeAvailable},
		{"no node at all", nil, edge.SubmitProviderTunnel{Model: "x", ProviderType: "openai"}, "", "", domain.CodeNoNodeAvailable},
		{"bad family", std, edge.SubmitProviderTunnel{Model: "x", ProviderType: "gemini"}, "", "", domain.CodeInvalidRequest},
		{"unknown list is a last resort", []node{
			{"a", []domain.ProviderConfig{ptProvider("known", domain.ProviderOpenAI, "m1")}},
			{"b", []domain.ProviderConfig{ptProvider("undiscovered", domain.ProviderOpenAI)}},
		}, edge.SubmitProviderTunnel{Model: "m2", ProviderType: "openai"}, "b", "undiscovered", ""},
		{"known list wins over unknown", []node{
			{"a", []domain.ProviderConfig{ptProvider("undiscovered", domain.ProviderOpenAI)}},
			{"b", []domain.ProviderConfig{ptProvider("known", domain.ProviderOpenAI, "m1")}},
		}, edge.SubmitProviderTunnel{Model: "m1", ProviderType: "openai"}, "b", "known", ""},
		{"anthropic family on an anthropic provider", []node{
			{"a", []domain.ProviderConfig{ptProvider("oai", domain.ProviderOpenAI, "gpt")}},
			{"b", []domain.ProviderConfig{ptProvider("ant", domain.ProviderAnthropic, "claude-x")}},
		}, edge.SubmitProviderTunnel{Model: "claude-x", ProviderType: "anthropic"}, "b", "ant", ""},
		{"anthropic provider does not speak openai", []node{
			{"b", []domain.ProviderConfig{ptProvider("ant", domain.ProviderAnthropic, "claude-x")}},
		}, edge.SubmitProviderTunnel{Model: "claude-x", ProviderType: "openai"}, "", "", domain.CodeNoNodeAvailable},
		{"ollama speaks anthropic", std, edge.SubmitProviderTunnel{Model: "llama3.2", ProviderType: "anthropic"}, "b", "ollama", ""},
		{"provider pin", []node{
			{"a", []domain.ProviderConfig{ptProvider("p1", domain.ProviderOpenAI, "m"), ptProvider("p2", domain.ProviderOpenAI, "m")}},
		}, edge.SubmitProviderTunnel{Node: "a", Provider: "p2", ProviderType: "openai", Method: "GET", Path: "/v1/responses/r1"}, "a", "p2", ""},
		{"provider pin to a provider gone", std, edge.SubmitProviderTunnel{Node: "a", Provider: "gone", ProviderType: "openai", Method: "GET", Path: "/v1/responses/r1"}, "", "", domain.CodeProviderNotFound},
		{"or-only-node: the one node takes a new model", []node{
			{"a", []domain.ProviderConfig{ptProvider("vllm", domain.ProviderOpenAI, "m")}},
			{"b", []domain.ProviderConfig{ptProvider("ollama", domain.ProviderOllama, "llama3.2")}},
		}, edge.SubmitProviderTunnel{Model: "new-model", ProviderType: "ollama", OrOnlyNode: true, Path: "/api/pull"}, "b", "ollama", ""},
		{"or-only-node: several nodes need a pin", []node{
			{"a", []domain.ProviderConfig{ptProvider("o1", domain.ProviderOllama, "x")}},
			{"b", []domain.ProviderConfig{ptProvider("o2", domain.ProviderOllama, "llama3.2")}},
		}, edge.SubmitProviderTunnel{Model: "new-model", ProviderType: "ollama", OrOnlyNode: true, Path: "/api/pull"}, "", "", domain.CodeInvalidRequest},
		{"or-only-node: a served model goes where it is", []node{
			{"a", []domain.ProviderConfig{ptProvider("o1", domain.ProviderOllama, "x")}},
			{"b", []domain.ProviderConfig{ptProvider("o2", domain.ProviderOllama, "llama3.2")}},
		}, edge.SubmitProviderTunnel{Model: "llama3.2", ProviderType: "ollama", OrOnlyNode: true, Path: "/api/pull"}, "b", "o2", ""},
		{"or-only-node: no model, several nodes", []node{
			{"a", []domain.ProviderConfig{ptProvider("o1", domain.ProviderOllama, "x")}},
			{"b", []domain.ProviderConfig{ptProvider("o2", domain.ProviderOllama, "y")}},
		}, edge.SubmitProviderTunnel{ProviderType: "ollama", OrOnlyNode: true, Method: "HEAD", Path: "/api/blobs/sha256:1"}, "", "", domain.CodeInvalidRequest},
		{"first provider in config order on one node", []node{
			{"a", []domain.ProviderConfig{ptProvider("p2", domain.ProviderOpenAI, "m"), ptProvider("p1", domain.ProviderOpenAI, "m")}},
		}, edge.SubmitProviderTunnel{Model: "m", ProviderType: "openai"}, "a", "p2", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newPTEnv()
			for _, n := range tc.nodes {
				ptAdmit(t, e.reg, n.id, n.providers...)
			}
			in := tc.in
			if in.Path == "" {
				in.Method, in.Path = http.MethodPost, "/v1/chat/completions"
			}
			tun, err := e.h.Handle(context.Background(), in)
			if tc.wantCode != "" {
				if domain.CodeOf(err) != tc.wantCode {
					t.Fatalf("err = %v, want %s", err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tun.Close()
			if tun.Node != tc.wantNode || tun.Provider != tc.wantProv {
				t.Fatalf("routed to %s/%s, want %s/%s", tun.Node, tun.Provider, tc.wantNode, tc.wantProv)
			}
		})
	}
}

func TestProviderTunnelLeastInFlight(t *testing.T) {
	e := newPTEnv()
	open := func(req domain.TunnelRequest) (ports.TunnelStream, error) { return newPTStream(nil), nil } // never ends
	for _, id := range []string{"a", "b", "c"} {
		ptAdmit(t, e.reg, id, ptProvider("p", domain.ProviderOpenAI, "m")).open = open
	}
	in := edge.SubmitProviderTunnel{Model: "m", ProviderType: "openai", Method: "POST", Path: "/v1/chat/completions"}
	var got []string
	var tuns []*edge.Tunnel
	for range 5 {
		tun, err := e.h.Handle(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, tun.Node)
		tuns = append(tuns, tun)
	}
	if s := strings.Join(got, ","); s != "a,b,c,a,b" {
		t.Fatalf("routed to %s, want a,b,c,a,b (fewest in flight, ties by id)", s)
	}
	if e.inFlight(t, "a") != 2 || e.inFlight(t, "c") != 1 {
		t.Fatalf("in flight a=%d c=%d", e.inFlight(t, "a"), e.inFlight(t, "c"))
	}
	tuns[0].Close()
	tuns[3].Close() // a is idle again
	tun, err := e.h.Handle(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if tun.Node != "a" {
		t.Fatalf("routed to %s after a went idle", tun.Node)
	}
	tuns = append(tuns, tun)
	for _, tun := range tuns {
		tun.Close()
	}
	for _, id := range []string{"a", "b", "c"} {
		if n := e.inFlight(t, id); n != 0 {
			t.Fatalf("node %s has %d tunnels in flight after all closed", id, n)
		}
	}
}

func TestProviderTunnelPassesRequestAndPublishesOnce(t *testing.T) {
	e := newPTEnv()
	secret := "data: {\"choices\":[{\"delta\":{\"content\":\"TOP-SECRET-BODY\"}}]}\n\n"
	st := newPTStream(nil,
		domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200},
		domain.TunnelFrame{Kind: domain.TunnelHeader, Header: domain.Header{"Content-Type": {"text/event-stream"}}},
		domain.TunnelFrame{Kind: domain.TunnelBody, Body: []byte(secret)},
		domain.TunnelFrame{Kind: domain.TunnelBody, Body: []byte("data: [DONE]\n\n")},
		domain.TunnelFrame{Kind: domain.TunnelUsage, Usage: &domain.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15, Model: "qwen"}},
		domain.TunnelFrame{Kind: domain.TunnelEnd},
	)
	link := ptAdmit(t, e.reg, "a", ptProvider("vllm", domain.ProviderOpenAI, "qwen"))
	link.open = func(domain.TunnelRequest) (ports.TunnelStream, error) { return st, nil }

	tun, err := e.h.Handle(context.Background(), edge.SubmitProviderTunnel{
		Model: "qwen", ProviderType: "openai", Method: "POST", Path: "/v1/chat/completions", Query: "x=1",
		Header:     domain.Header{"Authorization": {"Bearer edge-key"}, "Content-Type": {"application/json"}},
		Body:       []byte(`{"model":"qwen",`),
		BodyReader: strings.NewReader(`"stream":true}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	if e.inFlight(t, "a") != 1 {
		t.Fatal("tunnel not counted in flight")
	}
	body, err := ptDrain(t, tun)
	if err != nil {
		t.Fatal(err)
	}
	if body != secret+"data: [DONE]\n\n" {
		t.Fatalf("body = %q", body)
	}
	tun.Close()
	tun.Close()

	calls := link.calls()
	if len(calls) != 1 {
		t.Fatalf("%d tunnels opened", len(calls))
	}
	c := calls[0]
	if c.req.Provider != "vllm" || c.req.Method != "POST" || c.req.Path != "/v1/chat/completions" || c.req.Query != "x=1" ||
		string(c.req.Body) != `{"model":"qwen",` || string(c.body) != `"stream":true}` {
		t.Fatalf("tunnel request = %+v, streamed body %q", c.req, c.body)
	}
	if c.req.Header.Get("Authorization") != "" || c.req.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("tunnel request header = %v", c.req.Header)
	}
	if !st.isClosed() || e.inFlight(t, "a") != 0 {
		t.Fatalf("stream closed=%v, in flight=%d after end", st.isClosed(), e.inFlight(t, "a"))
	}

	evs := e.bus.events()
	if len(evs) != 1 || evs[0].Type != domain.BusTunnelCompleted || evs[0].Node != "a" || evs[0].Tunnel == nil {
		t.Fatalf("events = %+v, want one tunnel.completed", evs)
	}
	s := *evs[0].Tunnel
	if s.ID != tun.ID || s.Provider != "vllm" || s.Model != "qwen" || s.Path != "/v1/chat/completions" || s.Status != 200 ||
		s.BodyBytes != int64(len(body)) || s.Error != "" || s.Usage == nil || s.Usage.TotalTokens != 15 || s.Duration < 0 {
		t.Fatalf("summary = %+v", s)
	}
	if strings.Contains(fmt.Sprintf("%+v %+v", evs[0], s), "TOP-SECRET-BODY") {
		t.Fatal("body bytes reached the bus")
	}
}

func TestProviderTunnelFailures(t *testing.T) {
	partial := []domain.TunnelFrame{
		{Kind: domain.TunnelStatus, Status: 200},
		{Kind: domain.TunnelHeader, Header: domain.Header{}},
		{Kind: domain.TunnelBody, Body: []byte("data: {}\n\n")},
	}
	cases := []struct {
		name     string
		stream   *ptStream
		wantCode string
		wantBody string
	}{
		{"error frame before headers", newPTStream(nil, domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderUnreachable, Message: "connection refused"}}),
			domain.CodeProviderUnreachable, ""},
		{"error frame mid-body", newPTStream(nil, append(partial, domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderError, Message: "reset"}})...),
			domain.CodeProviderError, "data: {}\n\n"},
		{"link lost mid-body", newPTStream(domain.Errorf(domain.CodeNodeDisconnected, "connection closed"), partial...),
			domain.CodeNodeDisconnected, "data: {}\n\n"},
		{"stream ends without end frame", newPTStream(io.EOF, partial...),
			domain.CodeNodeDisconnected, "data: {}\n\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newPTEnv()
			ptAdmit(t, e.reg, "a", ptProvider("p", domain.ProviderOpenAI, "m")).open = func(domain.TunnelRequest) (ports.TunnelStream, error) { return tc.stream, nil }
			tun, err := e.h.Handle(context.Background(), edge.SubmitProviderTunnel{Model: "m", ProviderType: "openai", Method: "POST", Path: "/v1/chat/completions"})
			if err != nil {
				t.Fatal(err)
			}
			body, err := ptDrain(t, tun)
			if domain.CodeOf(err) != tc.wantCode || body != tc.wantBody {
				t.Fatalf("drain = %q, %v; want %q, %s", body, err, tc.wantBody, tc.wantCode)
			}
			if _, err := tun.Next(context.Background()); !errors.Is(err, io.EOF) {
				t.Fatalf("Next after failure = %v, want io.EOF", err)
			}
			tun.Close()
			evs := e.bus.events()
			if len(evs) != 1 || evs[0].Tunnel == nil || !strings.HasPrefix(evs[0].Tunnel.Error, tc.wantCode) || evs[0].Tunnel.BodyBytes != int64(len(tc.wantBody)) {
				t.Fatalf("events = %+v", evs)
			}
			if !tc.stream.isClosed() || e.inFlight(t, "a") != 0 {
				t.Fatal("stream not freed")
			}
			if l := e.ledger.Snapshot(); len(l) != 1 || l[0].Requests != 1 || l[0].Errors != 1 {
				t.Fatalf("ledger = %+v", l)
			}
		})
	}
}

func TestProviderTunnelCallerLeaves(t *testing.T) {
	e := newPTEnv()
	st := newPTStream(nil, domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200}, domain.TunnelFrame{Kind: domain.TunnelHeader, Header: domain.Header{}})
	ptAdmit(t, e.reg, "a", ptProvider("p", domain.ProviderOpenAI, "m")).open = func(domain.TunnelRequest) (ports.TunnelStream, error) { return st, nil }
	tun, err := e.h.Handle(context.Background(), edge.SubmitProviderTunnel{Model: "m", ProviderType: "openai", Method: "POST", Path: "/v1/completions"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	for range 2 {
		if _, err := tun.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if _, err := tun.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next after cancel = %v", err)
	}
	if len(e.bus.events()) != 0 || st.isClosed() {
		t.Fatal("a cancelled Next ended the tunnel; Close should")
	}
	tun.Close()
	tun.Close()
	evs := e.bus.events()
	if !st.isClosed() || len(evs) != 1 || !strings.HasPrefix(evs[0].Tunnel.Error, domain.CodeCancelled) {
		t.Fatalf("closed=%v events=%+v", st.isClosed(), evs)
	}
	if e.inFlight(t, "a") != 0 {
		t.Fatal("slot not released")
	}
}

func TestProviderTunnelOpenFails(t *testing.T) {
	e := newPTEnv()
	ptAdmit(t, e.reg, "a", ptProvider("p", domain.ProviderOpenAI, "m")).open = func(domain.TunnelRequest) (ports.TunnelStream, error) {
		return nil, domain.Errorf(domain.CodeNodeDisconnected, "gone")
	}
	_, err := e.h.Handle(context.Background(), edge.SubmitProviderTunnel{Model: "m", ProviderType: "openai", Method: "POST", Path: "/v1/chat/completions"})
	if !errors.Is(err, domain.ErrNodeDisconnected) {
		t.Fatalf("err = %v", err)
	}
	if e.inFlight(t, "a") != 0 || len(e.bus.events()) != 0 {
		t.Fatal("a tunnel that never opened was counted")
	}
}

func TestProviderTunnelLedgerSums(t *testing.T) {
	e := newPTEnv()
	usage := []*domain.Usage{{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}, {PromptTokens: 1, CompletionTokens: 2}, nil}
	i := 0
	ptAdmit(t, e.reg, "a", ptProvider("p", domain.ProviderOpenAI, "m")).open = func(domain.TunnelRequest) (ports.TunnelStream, error) {
		frames := ptOK("abcd")
		if u := usage[i]; u != nil {
			frames = append(frames[:3:3], domain.TunnelFrame{Kind: domain.TunnelUsage, Usage: u}, frames[3])
		}
		i++
		return newPTStream(nil, frames...), nil
	}
	// The caller's key name is kept with its usage and its events.
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "ci", Scopes: []string{domain.ScopeInference}})
	for range usage {
		tun, err := e.h.Handle(ctx, edge.SubmitProviderTunnel{Model: "m", ProviderType: "openai", Method: "POST", Path: "/v1/chat/completions"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ptDrain(t, tun); err != nil {
			t.Fatal(err)
		}
		tun.Close()
	}
	want := edge.UsageLine{Node: "a", Key: "ci", Provider: "p", Model: "m", Requests: 3, PromptTokens: 11, CompletionTokens: 7, TotalTokens: 18, BodyBytes: 12}
	if l := e.ledger.Snapshot(); len(l) != 1 || l[0] != want {
		t.Fatalf("ledger = %+v, want %+v", l, want)
	}
	if evs := e.bus.events(); len(evs) != 3 || evs[0].Key != "ci" || evs[0].Tunnel.Key != "ci" {
		t.Fatalf("events for 3 tunnels: %+v", evs)
	}
}

// ptMetrics records the model label of each finished tunnel.
type ptMetrics struct {
	mu     sync.Mutex
	models []string
}

func (m *ptMetrics) NodeRegistration(string)      {}
func (m *ptMetrics) RunFinished(ports.RunOutcome) {}
func (m *ptMetrics) RunDispatched(string, string) {}
func (m *ptMetrics) HistoryDropped(int)           {}
func (m *ptMetrics) TunnelFinished(o ports.TunnelOutcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.models = append(m.models, o.Model)
}

// A request that brings a model to the only node (a pull of a model no
// provider lists) goes to a provider with a known list that does not hold
// that model: the caller's string is counted as (unlisted), never as a
// label value of its own. A pull of a listed model keeps its name.
func TestProviderTunnelCallersModelNeverBecomesALabel(t *testing.T) {
	e := newPTEnv()
	metrics := &ptMetrics{}
	e.h.Observe.Metrics = metrics
	ptAdmit(t, e.reg, "b", ptProvider("ollama", domain.ProviderOllama, "llama3.2"))
	for _, model := range []string{"caller-made-1", "caller-made-2", "llama3.2"} {
		tun, err := e.h.Handle(context.Background(), edge.SubmitProviderTunnel{Model: model, ProviderType: domain.ProviderOllama,
			OrOnlyNode: true, Method: "POST", Path: "/api/pull"})
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		if _, err := ptDrain(t, tun); err != nil {
			t.Fatalf("%s: %v", model, err)
		}
	}
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	if got := fmt.Sprint(metrics.models); got != "[(unlisted) (unlisted) llama3.2]" {
		t.Fatalf("model labels %s, want the pulls of unlisted models as (unlisted)", got)
	}
}

// A tunnel that named no model (a stored response's retrieval) but reports
// usage is labelled (unlisted), not with the model the provider reported:
// that string is the provider's, not one its list holds. One that reports
// no usage keeps its empty label.
func TestProviderTunnelWithoutAModelIsNotLabelledByItsUsage(t *testing.T) {
	e := newPTEnv()
	metrics := &ptMetrics{}
	e.h.Observe.Metrics = metrics
	l := ptAdmit(t, e.reg, "b", ptProvider("vllm", domain.ProviderOpenAI, "m"))
	usage := domain.TunnelFrame{Kind: domain.TunnelUsage, Usage: &domain.Usage{PromptTokens: 5, Model: "echoed-by-the-provider"}}
	l.open = func(domain.TunnelRequest) (ports.TunnelStream, error) {
		frames := ptOK(`{}`)
		return newPTStream(nil, append(frames[:3:3], usage, frames[3])...), nil
	}
	tun, err := e.h.Handle(context.Background(), edge.SubmitProviderTunnel{Node: "b", Provider: "vllm", ProviderType: domain.ProviderOpenAI, Method: "GET", Path: "/v1/responses/resp_1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ptDrain(t, tun); err != nil {
		t.Fatal(err)
	}
	l.open = func(domain.TunnelRequest) (ports.TunnelStream, error) { return newPTStream(nil, ptOK(`{}`)...), nil }
	tun, err = e.h.Handle(context.Background(), edge.SubmitProviderTunnel{Node: "b", ProviderType: domain.ProviderOpenAI, Method: "GET", Path: "/v1/models"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ptDrain(t, tun); err != nil {
		t.Fatal(err)
	}
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	if got := fmt.Sprintf("%q", metrics.models); got != `["(unlisted)" ""]` {
		t.Fatalf("model labels %s", got)
	}
}

// ptTunnelHistory records the tunnel rows.
type ptTunnelHistory struct {
	mu     sync.Mutex
	models []string
}

func (h *ptTunnelHistory) RecordRun(domain.RunRecord) {}
func (h *ptTunnelHistory) RecordTunnel(r domain.TunnelRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.models = append(h.models, r.Model)
}

// A model the caller spells another way than the provider lists it (case,
// ":latest", Ollama's registry and namespace, an Anthropic date suffix for
// a declared alias) is routed to it, and counted — metrics, history,
// ledger — under the provider's own name: each spelling would otherwise be
// a series for good. What goes to the provider is the caller's request,
// byte for byte.
func TestProviderTunnelCountsAModelUnderTheProvidersName(t *testing.T) {
	e := newPTEnv()
	metrics := &ptMetrics{}
	history := &ptTunnelHistory{}
	e.h.Observe = edge.Observers{Metrics: metrics, History: history}
	l := ptAdmit(t, e.reg, "b", ptProvider("ollama", domain.ProviderOllama, "base:latest"))
	la := ptAdmit(t, e.reg, "c", ptProvider("claude", domain.ProviderAnthropic, "claude-sonnet-4-5"))
	spellings := []string{"BASE:latest", "Base", "library/bAse:LATEST", "registry.ollama.ai/library/base", "base:latest"}
	for _, model := range spellings {
		body := `{"model":"` + model + `"}`
		tun, err := e.h.Handle(context.Background(), edge.SubmitProviderTunnel{Model: model, ProviderType: domain.ProviderOllama,
			Method: "POST", Path: "/api/chat", Body: []byte(body)})
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		if _, err := ptDrain(t, tun); err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		calls := l.calls()
		if got := string(calls[len(calls)-1].req.Body); got != body {
			t.Fatalf("the provider got %s, want the caller's %s", got, body)
		}
	}
	tun, err := e.h.Handle(context.Background(), edge.SubmitProviderTunnel{Model: "claude-sonnet-4-5-20250929", ProviderType: domain.ProviderAnthropic,
		Method: "POST", Path: "/v1/messages", Body: []byte(`{"model":"claude-sonnet-4-5-20250929"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ptDrain(t, tun); err != nil {
		t.Fatal(err)
	}
	if got := string(la.calls()[0].req.Body); got != `{"model":"claude-sonnet-4-5-20250929"}` {
		t.Fatalf("the provider got %s", got)
	}
	want := "[base:latest base:latest base:latest base:latest base:latest claude-sonnet-4-5]"
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	if got := fmt.Sprint(metrics.models); got != want {
		t.Fatalf("model labels %s, want %s", got, want)
	}
	history.mu.Lock()
	defer history.mu.Unlock()
	if got := fmt.Sprint(history.models); got != want {
		t.Fatalf("history models %s, want %s", got, want)
	}
	for _, line := range e.ledger.Snapshot() {
		if line.Model != "base:latest" && line.Model != "claude-sonnet-4-5" {
			t.Fatalf("ledger line %+v", line)
		}
	}
}
