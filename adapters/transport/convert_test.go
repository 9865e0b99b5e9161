package transport

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"iop/domain"
	ioppb "iop/proto/iop"
)

func TestConfigRoundTrip(t *testing.T) {
	want := testNodeConfig()
	want.Adapters[0].Targets["env"] = domain.ExecTarget{Command: []string{"env"}, InheritEnv: []string{"HF_TOKEN"}}
	want.Adapters = append(want.Adapters, domain.AdapterConfig{
		Name: "oa", Type: domain.AdapterOpenAI, MaxConcurrency: 4, BaseURL: "http://x", PathPrefix: "/api",
		APIKeyEnv: "KEY", Models: []string{"a", "b"}, Command: "claude", Args: []string{"-p"}, WorkDir: "/w", Timeout: 90 * time.Second,
		Env: map[string]string{"BASE": "http://z"}, InheritEnv: []string{"SECRET_KEY"}, MaxHistoryBytes: 3 << 20,
	})
	want.Providers = append(want.Providers, domain.ProviderConfig{Name: "ol", Type: domain.ProviderOllama, BaseURL: "http://y", PathPrefix: "/p", APIKeyEnv: "K2"})
	got := configToDomain(configToProto(want))
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("config round trip:\n got %+v\nwant %+v", got, want)
	}
	if got := configToDomain(nil); !reflect.DeepEqual(got, domain.NodeConfig{}) {
		t.Errorf("nil payload: %+v", got)
	}
}

func TestRunEventRoundTrip(t *testing.T) {
	now := time.Unix(1700000000, 123456789)
	for _, typ := range []domain.EventType{domain.EventStart, domain.EventDelta, domain.EventReasoningDelta, domain.EventMetadata, domain.EventComplete, domain.EventError, domain.EventCancelled} {
		want := domain.RunEvent{RunID: "r", Seq: 4, Type: typ, Text: "t", Time: now, Metadata: []byte(`{"a":1}`),
			Usage: &domain.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3, CostUSD: 0.25, DurationMS: 5, StopReason: "stop", Model: "m"},
			Error: &domain.ErrorInfo{Code: "c", Message: "m"}}
		got, ok := runEventToDomain(runEventToProto(want))
		if !ok || !reflect.DeepEqual(got, want) || !got.Time.Equal(want.Time) {
			t.Errorf("%s: got %+v (%v), want %+v", typ, got, ok, want)
		}
	}
	if _, ok := runEventToDomain(&ioppb.RunEvent{Type: ioppb.EventType_EVENT_TYPE_UNSPECIFIED}); ok {
		t.Error("unspecified event type accepted")
	}
	if _, ok := runEventToDomain(&ioppb.RunEvent{Type: ioppb.EventType(99)}); ok {
		t.Error("unknown event type accepted")
	}
}

func TestRunRequestRoundTrip(t *testing.T) {
	want := domain.RunRequest{RunID: "r", Adapter: "a", Target: "t", Input: []byte("i"), SessionID: "s", Background: true, Options: []byte(`{}`)}
	if got := runRequestToDomain(runRequestToProto(want)); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestTunnelFrameRoundTrip(t *testing.T) {
	frames := []domain.TunnelFrame{
		{Kind: domain.TunnelStatus, Status: 201},
		{Kind: domain.TunnelHeader, Header: domain.Header{"Content-Type": {"text/event-stream"}, "X-Multi": {"a", "b"}}},
		{Kind: domain.TunnelBody, Body: []byte("data: x\n\n")},
		{Kind: domain.TunnelUsage, Usage: &domain.Usage{TotalTokens: 7}},
		{Kind: domain.TunnelMetadata, Metadata: []byte(`{"m":1}`)},
		{Kind: domain.TunnelEnd},
		{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderUnreachable, Message: "dial"}},
	}
	for _, want := range frames {
		got, ok := tunnelFrameToDomain(tunnelFrameToProto(want, true, new(headerDrops)))
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("kind %d: got %+v, want %+v", want.Kind, got, want)
		}
	}
	// An error frame without details still says provider_error.
	got, _ := tunnelFrameToDomain(tunnelFrameToProto(domain.TunnelFrame{Kind: domain.TunnelError}, true, new(headerDrops)))
	if got.Error == nil || got.Error.Code != domain.CodeProviderError {
		t.Errorf("bare error frame: %+v", got)
	}
	if _, ok := tunnelFrameToDomain(&ioppb.ProviderTunnelFrame{}); ok {
		t.Error("empty tunnel frame accepted")
	}
}

// A stream error crosses the wire as the metadata JSON docs/wire.md gives;
// what the edge reads back is cut to its bounds, and a metadata frame that
// is not such JSON carries none.
func TestTunnelStreamErrorRoundTrip(t *testing.T) {
	f := domain.TunnelFrame{Kind: domain.TunnelMetadata, StreamError: &domain.ProviderStreamError{Type: "overloaded_error", Message: "Overloaded"}}
	p := tunnelFrameToProto(f, true, new(headerDrops))
	if got, want := string(p.GetMetadataJson()), `{"stream_error":{"type":"overloaded_error","message":"Overloaded"}}`; got != want {
		t.Fatalf("metadata_json = %s, want %s", got, want)
	}
	got, ok := tunnelFrameToDomain(p)
	if !ok || got.Kind != domain.TunnelMetadata || got.StreamError == nil || *got.StreamError != *f.StreamError {
		t.Fatalf("got %+v, want the stream error back", got)
	}
	long := []byte(`{"stream_error":{"type":"` + strings.Repeat("t", 300) + `","message":"` + strings.Repeat("m", 3000) + `"},"later":1}`)
	got, _ = tunnelFrameToDomain(&ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_MetadataJson{MetadataJson: long}})
	if e := got.StreamError; e == nil || len(e.Type) != domain.MaxStreamErrorType || len(e.Message) != domain.MaxStreamErrorMessage {
		t.Fatalf("a long stream error came back as %+v", got.StreamError)
	}
	for _, b := range []string{`{"m":1}`, `not json`, `{"stream_error":null}`, `{"stream_error":"x"}`} {
		got, _ := tunnelFrameToDomain(&ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_MetadataJson{MetadataJson: []byte(b)}})
		if got.StreamError != nil {
			t.Errorf("%s: stream error %+v", b, got.StreamError)
		}
	}
}

func TestHeadersCanonicalised(t *testing.T) {
	h := headersToDomain([]*ioppb.Header{{Name: "content-type", Values: [][]byte{[]byte("a")}}, {Name: "Content-Type", Values: [][]byte{[]byte("b")}}})
	if got := h["Content-Type"]; !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("got %v", got)
	}
}

// TestHeaderBlockRoundTrip: a header block goes to the wire and back whole
// (empty values, several values, a header with none), and the values of
// one header, which share their backing with the others', can be appended
// to without changing another header.
func TestHeaderBlockRoundTrip(t *testing.T) {
	in := benchHeaders()
	in["X-Empty"] = []string{""}
	in["X-None"] = []string{}
	var d headerDrops
	out := headersToDomain(headersToProto(in, false, &d))
	if d.values != 0 || !reflect.DeepEqual(out, in) {
		t.Fatalf("got %v (dropped %+v), want %v", out, d, in)
	}
	want := append([]string(nil), out["Date"]...)
	for k := range out {
		out[k] = append(out[k], "appended")
	}
	if got := out["Date"]; !reflect.DeepEqual(got, append(want, "appended")) {
		t.Errorf("Date after appending to every header: %q", got)
	}
	ps := headersToProto(in, false, &d)
	ps[0].Values = append(ps[0].Values, []byte("appended"))
	for _, x := range ps[1:] {
		if !reflect.DeepEqual(headersToDomain([]*ioppb.Header{x})[http.CanonicalHeaderKey(x.Name)], in[x.Name]) {
			t.Errorf("%s changed by appending to %s", x.Name, ps[0].Name)
		}
	}
}

// benchHeaders is a provider's response header block.
func benchHeaders() domain.Header {
	return domain.Header{
		"Content-Type": {"text/event-stream; charset=utf-8"}, "Cache-Control": {"no-cache"},
		"Date": {"Wed, 02 Dec 2026 16:40:52 GMT"}, "X-Request-Id": {"req_0123456789abcdef"},
		"Openai-Processing-Ms": {"412"}, "Set-Cookie": {"a=1; Path=/", "b=2; Path=/"},
		"Vary": {"Origin", "Accept-Encoding"},
	}
}

// BenchmarkHeaderBlock is one tunnel header block, to the wire and back.
func BenchmarkHeaderBlock(b *testing.B) {
	h := benchHeaders()
	b.ReportAllocs()
	for b.Loop() {
		var d headerDrops
		if out := headersToDomain(headersToProto(h, false, &d)); len(out) != len(h) {
			b.Fatal(out)
		}
	}
}

func TestErrorMapping(t *testing.T) {
	if errorToProto(nil) != nil || errorToDomain(nil) != nil {
		t.Fatal("nil errors must stay nil")
	}
	err := fmt.Errorf("lookup: %w", domain.Errorf(domain.CodeRunNotFound, "run %s", "r1"))
	back := errorToDomain(errorToProto(err))
	if !errors.Is(back, domain.ErrRunNotFound) || back.Error() != "run_not_found: run r1" {
		t.Errorf("got %v", back)
	}
	plain := errorToDomain(errorToProto(errors.New("boom")))
	if !errors.Is(plain, &domain.Error{Code: domain.CodeInternal}) || domain.MessageOf(plain) != "boom" {
		t.Errorf("plain error: %v", plain)
	}
}

func TestConfigVerify(t *testing.T) {
	if err := DefaultConfig().Verify(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if err := (Config{}).Verify(); err != nil {
		t.Fatalf("zero config (defaults): %v", err)
	}
	bad := []Config{
		{HeartbeatInterval: time.Second, HeartbeatTimeout: time.Second},
		{MaxFrameSize: 1024},
		{StreamWindow: 1024},
	}
	for _, c := range bad {
		if err := c.Verify(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := NewServer("127.0.0.1:0", Config{StreamWindow: 1024}, newFakeEdge()).Start(); err == nil {
		t.Error("server started with an unusable config")
	}
}

// Every stream window Verify accepts must let a full data chunk through,
// or tunnel bodies could never be sent.
func TestMinimumWindowCarriesFullChunks(t *testing.T) {
	w := uint32(4 * maxDataChunk)
	for ; (Config{StreamWindow: w}).Verify() != nil; w += 1024 {
	}
	chunk := make([]byte, maxDataChunk)
	frames := []*ioppb.Frame{
		{StreamId: 1<<63 + 1, Body: &ioppb.Frame_TunnelRequestBody{TunnelRequestBody: &ioppb.TunnelRequestBody{Data: chunk, End: true}}},
		{StreamId: 1<<63 + 1, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Body{Body: chunk}}}},
		{StreamId: 1<<63 + 1, Body: &ioppb.Frame_NodeCommandResponse{NodeCommandResponse: &ioppb.NodeCommandResponse{ResultJson: chunk}}},
	}
	for _, f := range frames {
		if cost := frameCost(f); cost > int(w)/4 {
			t.Errorf("smallest accepted window %d: a full %T chunk costs %d > quarter window %d", w, f.Body, cost, w/4)
		}
	}
}

func TestInvalidRelayedStatusBecomesError(t *testing.T) {
	for _, st := range []uint32{0, 99, 1000, 1 << 31} {
		f, ok := tunnelFrameToDomain(&ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Status{Status: st}})
		if !ok || f.Kind != domain.TunnelError || f.Error.Code != domain.CodeProviderError {
			t.Fatalf("status %d → %+v", st, f)
		}
	}
	f, _ := tunnelFrameToDomain(&ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Status{Status: 429}})
	if f.Kind != domain.TunnelStatus || f.Status != 429 {
		t.Fatalf("429 → %+v", f)
	}
}

// A node's stats reach the edge cut to bounds: a node cannot grow the
// edge's metrics without limit.
func TestNodeStatsBounded(t *testing.T) {
	p := &ioppb.NodeStats{ChildProcesses: 1, StoreBytes: -5}
	for i := 0; i < maxStatsEntries+10; i++ {
		p.Adapters = append(p.Adapters, &ioppb.AdapterSlots{Name: strings.Repeat("a", 300), MaxConcurrency: 2, InFlight: 1})
		p.Providers = append(p.Providers, &ioppb.ProviderLatency{Name: "p", Count: 1, Seconds: -1})
	}
	s := statsToDomain(p)
	if len(s.Adapters) != maxStatsEntries || len(s.Providers) != maxStatsEntries || len(s.Adapters[0].Name) != maxStatsName ||
		s.StoreBytes != 0 || s.Providers[0].Seconds != 0 || s.ChildProcesses != 1 || s.Adapters[0].Max != 2 {
		t.Fatalf("stats not bounded: %d adapters, %d providers, name %d, store %d, seconds %v",
			len(s.Adapters), len(s.Providers), len(s.Adapters[0].Name), s.StoreBytes, s.Providers[0].Seconds)
	}
}

// A cost that is not a number, from a node, arrives as 0: no cost is
// infinite, and the edge's history and JSON answers cannot carry it.
func TestNonFiniteCostArrivesAsZero(t *testing.T) {
	for _, c := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if u := usageToDomain(&ioppb.Usage{CostUsd: c, PromptTokens: 3}); u.CostUSD != 0 || u.PromptTokens != 3 {
			t.Errorf("cost %v arrived as %+v", c, u)
		}
	}
	if u := usageToDomain(&ioppb.Usage{CostUsd: 0.25}); u.CostUSD != 0.25 {
		t.Errorf("cost 0.25 arrived as %v", u.CostUSD)
	}
}

// An error code a node reports reaches the edge as it is when it is shaped
// like one (a newer node's), and as provider_error otherwise, its text only
// quoted (cut) in the message: in a tunnel's error frame, a run's error
// event and a command's or cancel's answer alike.
func TestNodeErrorCodesAreShapedLikeCodes(t *testing.T) {
	junk := strings.Repeat("Ünicode {junk} ", 100)
	for code, want := range map[string]string{
		"newer_code": "newer_code",
		junk:         domain.CodeProviderError,
		"":           domain.CodeProviderError,
	} {
		pe := &ioppb.Error{Code: code, Message: "boom"}
		tf, ok := tunnelFrameToDomain(&ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Error{Error: pe}})
		ev, ok2 := runEventToDomain(&ioppb.RunEvent{Type: ioppb.EventType_EVENT_TYPE_ERROR, Error: pe})
		if !ok || !ok2 {
			t.Fatal("frames dropped")
		}
		err := errorToDomain(pe)
		for what, got := range map[string]*domain.ErrorInfo{
			"tunnel": tf.Error, "run event": ev.Error, "answer": {Code: domain.CodeOf(err), Message: domain.MessageOf(err)},
		} {
			if got.Code != want || !strings.HasSuffix(got.Message, "boom") || len(got.Message) > 200 {
				t.Errorf("%s with code %.20q: %+v, want code %s", what, code, got, want)
			}
		}
	}
}

// Usage below zero from a node arrives as 0, in a run's events and a
// tunnel's usage frame alike: summed per key and node, it would lower the
// totals /v1/usage reports.
func TestNegativeUsageArrivesAsZero(t *testing.T) {
	pu := &ioppb.Usage{PromptTokens: -1 << 40, CompletionTokens: 7, TotalTokens: -5, CostUsd: -3.5, DurationMs: -1, Model: "m"}
	ev, ok := runEventToDomain(&ioppb.RunEvent{Type: ioppb.EventType_EVENT_TYPE_COMPLETE, Usage: pu})
	tf, ok2 := tunnelFrameToDomain(&ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Usage{Usage: pu}})
	if !ok || !ok2 {
		t.Fatal("frames dropped")
	}
	want := domain.Usage{CompletionTokens: 7, Model: "m"}
	for what, u := range map[string]*domain.Usage{"run event": ev.Usage, "tunnel": tf.Usage} {
		if u == nil || *u != want {
			t.Errorf("%s usage %+v, want %+v", what, u, want)
		}
	}
}
