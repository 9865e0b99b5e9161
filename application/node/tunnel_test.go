package node_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"iop/application/node"
	"iop/domain"
	"iop/ports"
)

// tnFactory builds no adapters: the tunnel tests configure providers only.
type tnFactory struct{}

func (tnFactory) Build(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error) {
	return nil, errors.New("no adapters in tunnel tests")
}

// tnRead is one scripted answer of a provider body.
type tnRead struct {
	data string
	err  error
}

// tnBody replays reads; after the script it returns io.EOF. It counts
// reads and records Close.
type tnBody struct {
	mu     sync.Mutex
	script []tnRead
	reads  int
	closed bool
}

func (b *tnBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reads++
	if len(b.script) == 0 {
		return 0, io.EOF
	}
	r := b.script[0]
	b.script = b.script[1:]
	return copy(p, r.data), r.err
}

func (b *tnBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}

// tnClient is a ports.ProviderClient answering with a scripted response or
// error, recording what it was asked.
type tnClient struct {
	resp *ports.ProviderResponse
	err  error

	calls   int
	gotP    domain.ProviderConfig
	gotReq  domain.TunnelRequest
	gotBody []byte
}

func (c *tnClient) Do(ctx context.Context, p domain.ProviderConfig, req domain.TunnelRequest, body io.Reader) (*ports.ProviderResponse, error) {
	c.calls++
	c.gotP, c.gotReq = p, req
	if body != nil {
		c.gotBody, _ = io.ReadAll(body)
	}
	return c.resp, c.err
}

// tnSink records frames; failAt (1-based) makes that Send and every later
// one fail.
type tnSink struct {
	frames []domain.TunnelFrame
	failAt int
	sends  int
	// refuseHeader, if set, is how the sink refuses a header frame (the
	// link cannot carry it); the sink stays usable.
	refuseHeader error
}

func (s *tnSink) Send(f domain.TunnelFrame) error {
	s.sends++
	if s.failAt > 0 && s.sends >= s.failAt {
		return errors.New("edge went away")
	}
	if f.Kind == domain.TunnelHeader && s.refuseHeader != nil {
		return s.refuseHeader
	}
	// The port lets the caller reuse f.Body once Send returns: keep a copy,
	// as the real sink does.
	f.Body = append([]byte(nil), f.Body...)
	s.frames = append(s.frames, f)
	return nil
}

func (s *tnSink) kinds() string {
	names := map[domain.TunnelFrameKind]string{
		domain.TunnelStatus: "status", domain.TunnelHeader: "header", domain.TunnelBody: "body",
		domain.TunnelUsage: "usage", domain.TunnelMetadata: "metadata", domain.TunnelEnd: "end", domain.TunnelError: "error",
	}
	out := make([]string, len(s.frames))
	for i, f := range s.frames {
		out[i] = names[f.Kind]
	}
	return strings.Join(out, ",")
}

func (s *tnSink) body() string {
	var b strings.Builder
	for _, f := range s.frames {
		if f.Kind == domain.TunnelBody {
			b.Write(f.Body)
		}
	}
	return b.String()
}

func (s *tnSink) last() domain.TunnelFrame { return s.frames[len(s.frames)-1] }

var tnProvider = domain.ProviderConfig{Name: "local", Type: domain.ProviderOllama, BaseURL: "http://127.0.0.1:11434"}

func newTunnelHandler(t *testing.T, c ports.ProviderClient) *node.TunnelHandler {
	t.Helper()
	rt := node.NewRuntime(tnFactory{}, nil)
	if err := rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 1, Providers: []domain.ProviderConfig{tnProvider}}); err != nil {
		t.Fatal(err)
	}
	return node.NewTunnelHandler(rt, c, nil)
}

func TestTunnelRelaysFramesInOrder(t *testing.T) {
	body := &tnBody{script: []tnRead{{data: "{\"a\":1}\n"}, {data: "{\"done\":"}, {data: "true}\n", err: io.EOF}}}
	usage := &domain.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}
	c := &tnClient{resp: &ports.ProviderResponse{
		Status: 200, Header: domain.Header{"Content-Type": {"application/x-ndjson"}}, Body: body,
		Usage: func() *domain.Usage { return usage },
	}}
	h := newTunnelHandler(t, c)
	sink := &tnSink{}
	req := domain.TunnelRequest{Provider: "local", Method: http.MethodPost, Path: "/api/chat", Body: []byte(`{"model":"m"`)}
	h.OpenTunnel(context.Background(), req, strings.NewReader(`,"stream":true}`), sink)

	if got, want := sink.kinds(), "status,header,body,body,body,usage,end"; got != want {
		t.Fatalf("frames = %s, want %s", got, want)
	}
	if sink.frames[0].Status != 200 || sink.frames[1].Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status/header frames = %+v %+v", sink.frames[0], sink.frames[1])
	}
	if got := sink.body(); got != "{\"a\":1}\n{\"done\":true}\n" {
		t.Fatalf("body = %q", got)
	}
	if u := sink.frames[5].Usage; u == nil || *u != *usage {
		t.Fatalf("usage frame = %+v", sink.frames[5].Usage)
	}
	if !body.closed {
		t.Fatal("upstream body not closed")
	}
	if c.gotP.Name != tnProvider.Name || c.gotP.BaseURL != tnProvider.BaseURL || c.gotReq.Path != "/api/chat" || string(c.gotBody) != `,"stream":true}` {
		t.Fatalf("client got provider %+v, req %+v, streamed body %q", c.gotP, c.gotReq, c.gotBody)
	}
}

func TestTunnelWithoutUsageEndsAfterBody(t *testing.T) {
	c := &tnClient{resp: &ports.ProviderResponse{
		Status: 429, Header: domain.Header{"Retry-After": {"2"}},
		Body:  &tnBody{script: []tnRead{{data: `{"error":"slow down"}`}}},
		Usage: func() *domain.Usage { return nil },
	}}
	sink := &tnSink{}
	newTunnelHandler(t, c).OpenTunnel(context.Background(), domain.TunnelRequest{Provider: "local", Path: "/api/chat"}, nil, sink)
	if got, want := sink.kinds(), "status,header,body,end"; got != want {
		t.Fatalf("frames = %s, want %s", got, want)
	}
	if sink.frames[0].Status != 429 || sink.body() != `{"error":"slow down"}` {
		t.Fatalf("status %d body %q", sink.frames[0].Status, sink.body())
	}
}

// A provider's 101 (the lean client returns it rather than skip it) is
// not relayed as the caller's final answer: the caller asked for no
// upgrade.
func TestTunnelProviderSwitchingProtocolsIsAnError(t *testing.T) {
	body := &tnBody{script: []tnRead{{data: "RAWBYTES"}}}
	c := &tnClient{resp: &ports.ProviderResponse{
		Status: http.StatusSwitchingProtocols, Header: domain.Header{"Upgrade": {"websocket"}, "Connection": {"Upgrade"}},
		Body: body, Usage: func() *domain.Usage { return nil },
	}}
	sink := &tnSink{}
	newTunnelHandler(t, c).OpenTunnel(context.Background(), domain.TunnelRequest{Provider: "local", Path: "/v1/chat/completions"}, nil, sink)
	if sink.kinds() != "error" || sink.frames[0].Error.Code != domain.CodeProviderError || !strings.Contains(sink.frames[0].Error.Message, "switch protocols") {
		t.Fatalf("frames = %s %+v, want one provider_error", sink.kinds(), sink.frames)
	}
	if !body.closed {
		t.Error("the provider's response was not closed")
	}
}

func TestTunnelProviderNotFound(t *testing.T) {
	c := &tnClient{}
	sink := &tnSink{}
	newTunnelHandler(t, c).OpenTunnel(context.Background(), domain.TunnelRequest{Provider: "nope", Path: "/v1/models"}, nil, sink)
	if sink.kinds() != "error" || sink.frames[0].Error.Code != domain.CodeProviderNotFound {
		t.Fatalf("frames = %s %+v", sink.kinds(), sink.frames)
	}
	if c.calls != 0 {
		t.Fatal("provider client was called for an unknown provider")
	}
}

func TestTunnelUpstreamErrorBeforeHeaders(t *testing.T) {
	cases := []struct {
		name string
		err  error
		code string
	}{
		{"timeout keeps its code", domain.Errorf(domain.CodeTimeout, "no headers"), domain.CodeTimeout},
		{"unreachable keeps its code", domain.Errorf(domain.CodeProviderUnreachable, "connection refused"), domain.CodeProviderUnreachable},
		{"uncoded error becomes unreachable", errors.New("dial tcp: refused"), domain.CodeProviderUnreachable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sink := &tnSink{}
			newTunnelHandler(t, &tnClient{err: tc.err}).OpenTunnel(context.Background(), domain.TunnelRequest{Provider: "local", Path: "/api/tags"}, nil, sink)
			if sink.kinds() != "error" || sink.frames[0].Error.Code != tc.code {
				t.Fatalf("frames = %s %+v, want one error %s", sink.kinds(), sink.frames, tc.code)
			}
		})
	}
}

func TestTunnelBodyErrorMidStream(t *testing.T) {
	body := &tnBody{script: []tnRead{{data: "data: {\"x\":1}\n\n"}, {err: errors.New("connection reset by peer")}}}
	c := &tnClient{resp: &ports.ProviderResponse{
		Status: 200, Header: domain.Header{"Content-Type": {"text/event-stream"}}, Body: body,
		Usage: func() *domain.Usage { return &domain.Usage{TotalTokens: 1} },
	}}
	sink := &tnSink{}
	newTunnelHandler(t, c).OpenTunnel(context.Background(), domain.TunnelRequest{Provider: "local", Path: "/v1/chat/completions"}, nil, sink)
	if got, want := sink.kinds(), "status,header,body,usage,error"; got != want {
		t.Fatalf("frames = %s, want %s (the usage read so far, then an error, never end)", got, want)
	}
	if u := sink.frames[3].Usage; u == nil || u.TotalTokens != 1 {
		t.Fatalf("usage frame = %+v", sink.frames[3].Usage)
	}
	if e := sink.last().Error; e.Code != domain.CodeProviderError || !strings.Contains(e.Message, "reset") {
		t.Fatalf("error frame = %+v", e)
	}
	if !body.closed {
		t.Fatal("upstream body not closed")
	}
}

func TestTunnelBodyErrorAfterCallerLeftSendsNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	body := &tnBody{script: []tnRead{{data: "x"}, {err: context.Canceled}}}
	c := &tnClient{resp: &ports.ProviderResponse{Status: 200, Header: domain.Header{}, Body: body}}
	sink := &tnSink{}
	h := newTunnelHandler(t, c)
	cancel()
	h.OpenTunnel(ctx, domain.TunnelRequest{Provider: "local", Path: "/api/chat"}, nil, sink)
	if got, want := sink.kinds(), "status,header,body"; got != want {
		t.Fatalf("frames = %s, want %s", got, want)
	}
}

func TestTunnelSinkFailureStopsReading(t *testing.T) {
	for _, failAt := range []int{1, 2, 3} { // status, header, first body frame
		body := &tnBody{script: []tnRead{{data: "a"}, {data: "b"}, {data: "c"}, {data: "d"}}}
		usageCalled := false
		c := &tnClient{resp: &ports.ProviderResponse{
			Status: 200, Header: domain.Header{}, Body: body,
			Usage: func() *domain.Usage { usageCalled = true; return nil },
		}}
		sink := &tnSink{failAt: failAt}
		newTunnelHandler(t, c).OpenTunnel(context.Background(), domain.TunnelRequest{Provider: "local", Path: "/api/chat"}, nil, sink)
		if sink.sends != failAt {
			t.Fatalf("failAt %d: %d sends after the sink failed, want none", failAt, sink.sends-failAt)
		}
		if wantReads := max(failAt-2, 0); body.reads != wantReads {
			t.Fatalf("failAt %d: body read %d times, want %d", failAt, body.reads, wantReads)
		}
		if !body.closed || usageCalled {
			t.Fatalf("failAt %d: closed=%v usage read=%v", failAt, body.closed, usageCalled)
		}
	}
}

// Headers the link cannot carry in one frame (over a quarter of the
// stream window; the provider client itself takes up to 10 MiB) end the
// tunnel with a provider_error that says so, and the node logs it: before,
// the edge saw only a reset stream and answered a bare 502.
func TestTunnelHeadersTooLargeToRelay(t *testing.T) {
	body := &tnBody{script: []tnRead{{data: "ok"}}}
	c := &tnClient{resp: &ports.ProviderResponse{Status: 200, Header: domain.Header{"X-Big": {strings.Repeat("x", 100<<10)}}, Body: body}}
	sink := &tnSink{refuseHeader: &ports.FrameTooLargeError{Size: 102431, Max: 65536}}
	var logs bytes.Buffer
	rt := node.NewRuntime(tnFactory{}, nil)
	if err := rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 1, Providers: []domain.ProviderConfig{tnProvider}}); err != nil {
		t.Fatal(err)
	}
	h := node.NewTunnelHandler(rt, c, slog.New(slog.NewTextHandler(&logs, nil)))
	h.OpenTunnel(context.Background(), domain.TunnelRequest{Provider: "local", Path: "/api/chat"}, nil, sink)
	if got, want := sink.kinds(), "status,error"; got != want {
		t.Fatalf("frames = %s, want %s", got, want)
	}
	e := sink.last().Error
	if e.Code != domain.CodeProviderError || e.Message != "the provider's response headers are too large to relay (102431 bytes, at most 65536)" {
		t.Fatalf("error frame = %+v", e)
	}
	if !strings.Contains(logs.String(), "too large to relay") || !strings.Contains(logs.String(), "provider=local") {
		t.Fatalf("node log %q does not say why", logs.String())
	}
	if !body.closed || body.reads != 0 {
		t.Fatalf("body closed=%v reads=%d, want closed unread", body.closed, body.reads)
	}
}

// Headers too many for one frame (more elements than the edge decodes in
// one) end the tunnel with a provider_error that counts them.
func TestTunnelHeadersTooManyToRelay(t *testing.T) {
	body := &tnBody{script: []tnRead{{data: "ok"}}}
	c := &tnClient{resp: &ports.ProviderResponse{Status: 200, Header: domain.Header{"Set-Cookie": make([]string, 20000)}, Body: body}}
	sink := &tnSink{refuseHeader: &ports.FrameTooLargeError{Elements: 20005, MaxElements: 16384}}
	var logs bytes.Buffer
	rt := node.NewRuntime(tnFactory{}, nil)
	if err := rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 1, Providers: []domain.ProviderConfig{tnProvider}}); err != nil {
		t.Fatal(err)
	}
	h := node.NewTunnelHandler(rt, c, slog.New(slog.NewTextHandler(&logs, nil)))
	h.OpenTunnel(context.Background(), domain.TunnelRequest{Provider: "local", Path: "/api/chat"}, nil, sink)
	if got, want := sink.kinds(), "status,error"; got != want {
		t.Fatalf("frames = %s, want %s", got, want)
	}
	e := sink.last().Error
	if e.Code != domain.CodeProviderError || e.Message != "the provider's response has too many headers to relay (20005 header entries, names and values, at most 16384)" {
		t.Fatalf("error frame = %+v", e)
	}
	if !strings.Contains(logs.String(), "too many to relay") || !body.closed || body.reads != 0 {
		t.Fatalf("log %q, body closed=%v reads=%d", logs.String(), body.closed, body.reads)
	}
}

// tnBlockingClient answers once release is closed (or ctx ends), telling
// asked when a request reaches it.
type tnBlockingClient struct {
	asked   chan struct{}
	release chan struct{}
}

func (c *tnBlockingClient) Do(ctx context.Context, p domain.ProviderConfig, req domain.TunnelRequest, body io.Reader) (*ports.ProviderResponse, error) {
	c.asked <- struct{}{}
	select {
	case <-c.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &ports.ProviderResponse{Status: 200, Header: domain.Header{}, Body: &tnBody{}, Usage: func() *domain.Usage { return nil }}, nil
}

// Idle counts the tunnels open, waiting for their provider included, and
// its channel closes when the last one ends (a stopping node waits on it).
func TestTunnelIdleWaitsForOpenTunnels(t *testing.T) {
	c := &tnBlockingClient{asked: make(chan struct{}, 2), release: make(chan struct{})}
	h := newTunnelHandler(t, c)
	if open, idle := h.Idle(); open != 0 {
		t.Fatalf("open = %d before any tunnel", open)
	} else {
		<-idle // closed: nothing to wait for
	}
	var done sync.WaitGroup
	for range 2 {
		done.Go(func() {
			h.OpenTunnel(context.Background(), domain.TunnelRequest{Provider: "local", Path: "/api/chat"}, nil, &tnSink{})
		})
	}
	<-c.asked
	<-c.asked
	open, idle := h.Idle()
	if open != 2 {
		t.Fatalf("open = %d with two tunnels waiting for their provider, want 2", open)
	}
	select {
	case <-idle:
		t.Fatal("idle closed while two tunnels are open")
	default:
	}
	close(c.release)
	<-idle
	done.Wait()
	if open, _ := h.Idle(); open != 0 {
		t.Fatalf("open = %d after both ended", open)
	}
}

// An error the provider stated inside a successful stream goes to the edge
// as a metadata sideband after the usage, before the end; the body frames
// are the provider's bytes. The same scan of a failed (non-2xx) answer is
// not sent: that answer's status says it already.
func TestTunnelSendsAStreamErrorAsSideband(t *testing.T) {
	for _, status := range []int{200, 500} {
		data := "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
		c := &tnClient{resp: &ports.ProviderResponse{
			Status: status, Header: domain.Header{"Content-Type": {"text/event-stream"}},
			Body:  &tnBody{script: []tnRead{{data: data, err: io.EOF}}},
			Usage: func() *domain.Usage { return &domain.Usage{PromptTokens: 12} },
			StreamError: func() *domain.ProviderStreamError {
				return &domain.ProviderStreamError{Type: "overloaded_error", Message: "Overloaded"}
			},
		}}
		sink := &tnSink{}
		newTunnelHandler(t, c).OpenTunnel(context.Background(), domain.TunnelRequest{Provider: "local", Path: "/v1/messages"}, nil, sink)
		want := "status,header,body,usage,metadata,end"
		if status != 200 {
			want = "status,header,body,usage,end"
		}
		if got := sink.kinds(); got != want {
			t.Fatalf("%d: frames = %s, want %s", status, got, want)
		}
		if sink.body() != data {
			t.Fatalf("%d: body %q", status, sink.body())
		}
		if status == 200 {
			if e := sink.frames[4].StreamError; e == nil || e.Type != "overloaded_error" || e.Message != "Overloaded" {
				t.Fatalf("metadata frame = %+v", sink.frames[4])
			}
		}
	}
}
