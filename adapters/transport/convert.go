package transport

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"iop/domain"
	ioppb "iop/proto/iop"
)

// Conversions between wire and domain types live here and nowhere else.

var eventTypeToProto = map[domain.EventType]ioppb.EventType{
	domain.EventStart:          ioppb.EventType_EVENT_TYPE_START,
	domain.EventDelta:          ioppb.EventType_EVENT_TYPE_DELTA,
	domain.EventReasoningDelta: ioppb.EventType_EVENT_TYPE_REASONING_DELTA,
	domain.EventMetadata:       ioppb.EventType_EVENT_TYPE_METADATA,
	domain.EventComplete:       ioppb.EventType_EVENT_TYPE_COMPLETE,
	domain.EventError:          ioppb.EventType_EVENT_TYPE_ERROR,
	domain.EventCancelled:      ioppb.EventType_EVENT_TYPE_CANCELLED,
}

var eventTypeToDomain = func() map[ioppb.EventType]domain.EventType {
	m := map[ioppb.EventType]domain.EventType{}
	for k, v := range eventTypeToProto {
		m[v] = k
	}
	return m
}()

func runEventToProto(ev domain.RunEvent) *ioppb.RunEvent {
	p := &ioppb.RunEvent{
		RunId: ev.RunID, Seq: ev.Seq, Type: eventTypeToProto[ev.Type], Text: ev.Text,
		Usage: usageToProto(ev.Usage), MetadataJson: ev.Metadata,
	}
	if !ev.Time.IsZero() {
		p.TimeUnixNano = ev.Time.UnixNano()
	}
	if ev.Error != nil {
		p.Error = &ioppb.Error{Code: ev.Error.Code, Message: ev.Error.Message}
	}
	return p
}

func runEventToDomain(p *ioppb.RunEvent) (domain.RunEvent, bool) {
	t, ok := eventTypeToDomain[p.GetType()]
	if !ok {
		return domain.RunEvent{}, false
	}
	ev := domain.RunEvent{
		RunID: p.GetRunId(), Seq: p.GetSeq(), Type: t, Text: p.GetText(),
		Usage: usageToDomain(p.GetUsage()), Metadata: p.GetMetadataJson(),
	}
	if p.GetTimeUnixNano() != 0 {
		ev.Time = time.Unix(0, p.GetTimeUnixNano())
	}
	if e := p.GetError(); e != nil {
		ev.Error = peerError(e)
	}
	return ev, true
}

func usageToProto(u *domain.Usage) *ioppb.Usage {
	if u == nil {
		return nil
	}
	return &ioppb.Usage{
		PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens,
		CostUsd: u.CostUSD, DurationMs: u.DurationMS, StopReason: u.StopReason, Model: u.Model,
	}
}

// finite is c, or 0 for a NaN or an infinity, which no cost is (and which
// JSON cannot carry to the caller).
func finite(c float64) float64 {
	if math.IsNaN(c) || math.IsInf(c, 0) {
		return 0
	}
	return c
}

// usageToDomain converts usage a node reported. Counts, cost and duration
// below zero (a buggy or hostile node) are 0: summed per key and node,
// they would otherwise lower the totals /v1/usage reports.
func usageToDomain(p *ioppb.Usage) *domain.Usage {
	if p == nil {
		return nil
	}
	return &domain.Usage{
		PromptTokens: max(p.GetPromptTokens(), 0), CompletionTokens: max(p.GetCompletionTokens(), 0), TotalTokens: max(p.GetTotalTokens(), 0),
		CostUSD: max(finite(p.GetCostUsd()), 0), DurationMS: max(p.GetDurationMs(), 0), StopReason: p.GetStopReason(), Model: p.GetModel(),
	}
}

func runRequestToProto(r domain.RunRequest) *ioppb.RunRequest {
	return &ioppb.RunRequest{
		RunId: r.RunID, Adapter: r.Adapter, Target: r.Target, Input: r.Input,
		SessionId: r.SessionID, Background: r.Background, OptionsJson: r.Options,
	}
}

func runRequestToDomain(p *ioppb.RunRequest) domain.RunRequest {
	return domain.RunRequest{
		RunID: p.GetRunId(), Adapter: p.GetAdapter(), Target: p.GetTarget(), Input: p.GetInput(),
		SessionID: p.GetSessionId(), Background: p.GetBackground(), Options: p.GetOptionsJson(),
	}
}

func configToProto(c domain.NodeConfig) *ioppb.NodeConfigPayload {
	p := &ioppb.NodeConfigPayload{NodeId: c.NodeID, Version: c.Version}
	for _, a := range c.Adapters {
		pa := &ioppb.AdapterConfig{
			Name: a.Name, Type: a.Type, MaxConcurrency: uint32(a.MaxConcurrency),
			BaseUrl: a.BaseURL, PathPrefix: a.PathPrefix, ApiKeyEnv: a.APIKeyEnv, Models: a.Models,
			Command: a.Command, Args: a.Args, WorkDir: a.WorkDir, TimeoutMs: a.Timeout.Milliseconds(),
			Env: a.Env, InheritEnv: a.InheritEnv, MaxHistoryBytes: uint32(a.MaxHistoryBytes),
		}
		if len(a.Targets) > 0 {
			pa.Targets = map[string]*ioppb.ExecTarget{}
			for name, t := range a.Targets {
				pa.Targets[name] = &ioppb.ExecTarget{Command: t.Command, TimeoutMs: t.Timeout.Milliseconds(), Dir: t.Dir, Env: t.Env, InheritEnv: t.InheritEnv}
			}
		}
		p.Adapters = append(p.Adapters, pa)
	}
	for _, pr := range c.Providers {
		p.Providers = append(p.Providers, &ioppb.ProviderConfig{
			Name: pr.Name, Type: pr.Type, BaseUrl: pr.BaseURL, PathPrefix: pr.PathPrefix, ApiKeyEnv: pr.APIKeyEnv, Models: pr.Models,
		})
	}
	return p
}

func configToDomain(p *ioppb.NodeConfigPayload) domain.NodeConfig {
	c := domain.NodeConfig{NodeID: p.GetNodeId(), Version: p.GetVersion()}
	for _, a := range p.GetAdapters() {
		da := domain.AdapterConfig{
			Name: a.GetName(), Type: a.GetType(), MaxConcurrency: int(a.GetMaxConcurrency()),
			BaseURL: a.GetBaseUrl(), PathPrefix: a.GetPathPrefix(), APIKeyEnv: a.GetApiKeyEnv(), Models: a.GetModels(),
			Command: a.GetCommand(), Args: a.GetArgs(), WorkDir: a.GetWorkDir(), Timeout: time.Duration(a.GetTimeoutMs()) * time.Millisecond,
			Env: a.GetEnv(), InheritEnv: a.GetInheritEnv(), MaxHistoryBytes: int(a.GetMaxHistoryBytes()),
		}
		if len(a.GetTargets()) > 0 {
			da.Targets = map[string]domain.ExecTarget{}
			for name, t := range a.GetTargets() {
				da.Targets[name] = domain.ExecTarget{Command: t.GetCommand(), Timeout: time.Duration(t.GetTimeoutMs()) * time.Millisecond, Dir: t.GetDir(), Env: t.GetEnv(), InheritEnv: t.GetInheritEnv()}
			}
		}
		c.Adapters = append(c.Adapters, da)
	}
	for _, pr := range p.GetProviders() {
		c.Providers = append(c.Providers, domain.ProviderConfig{
			Name: pr.GetName(), Type: pr.GetType(), BaseURL: pr.GetBaseUrl(), PathPrefix: pr.GetPathPrefix(), APIKeyEnv: pr.GetApiKeyEnv(), Models: pr.GetModels(),
		})
	}
	return c
}

// headerDrops counts the header values headersToProto left out because the
// peer could not read them, and names a header that lost one.
type headerDrops struct {
	values int
	name   string
}

// headersToProto converts h for the wire. Values go as the bytes HTTP
// carried; one that is not UTF-8 goes only when raw (the peer agreed to
// raw_header_values: an older peer reads values as protobuf strings and
// would reject the whole frame) and is otherwise left out and counted in
// d. A header whose name is not UTF-8 is left out whole (the name is a
// string on the wire); no HTTP parser lets such a name through.
//
// Every tunnel request and response carries a header block, so the block
// is built in four allocations whatever its size (the headers, their
// pointers, the value slices and one buffer all values' bytes share)
// rather than three per header and one per value; the block is only
// marshaled, never changed.
func headersToProto(h domain.Header, raw bool, d *headerDrops) []*ioppb.Header {
	nv, nb := 0, 0
	for _, vs := range h {
		nv += len(vs)
		for _, v := range vs {
			nb += len(v)
		}
	}
	out := make([]*ioppb.Header, 0, len(h))
	hs := make([]ioppb.Header, len(h))
	all := make([][]byte, 0, nv)
	buf := make([]byte, 0, nb)
	for k, vs := range h {
		if !utf8.ValidString(k) {
			d.note(strings.ToValidUTF8(k, "?"), max(len(vs), 1))
			continue
		}
		first := len(all)
		for _, v := range vs {
			if !raw && !utf8.ValidString(v) {
				d.note(k, 1)
				continue
			}
			start := len(buf)
			buf = append(buf, v...)
			all = append(all, buf[start:len(buf):len(buf)])
		}
		if values := all[first:len(all):len(all)]; len(values) > 0 || len(vs) == 0 {
			x := &hs[len(out)]
			x.Name, x.Values = k, values
			out = append(out, x)
		}
	}
	return out
}

func (d *headerDrops) note(name string, n int) {
	d.values += n
	if d.name == "" {
		d.name = name
	}
}

// headersToDomain reads a header block from the wire, names canonical.
// Like headersToProto it allocates per block, not per header: the values
// are slices of one string holding all their bytes, and the headers'
// value lists share one backing array (each capped at its own length, so
// appending to one copies it instead of overwriting the next).
func headersToDomain(hs []*ioppb.Header) domain.Header {
	nv, nb := 0, 0
	for _, x := range hs {
		nv += len(x.GetValues())
		for _, v := range x.GetValues() {
			nb += len(v)
		}
	}
	var sb strings.Builder
	sb.Grow(nb)
	for _, x := range hs {
		for _, v := range x.GetValues() {
			sb.Write(v)
		}
	}
	joined := sb.String()
	all := make([]string, 0, nv)
	h := make(domain.Header, len(hs))
	off := 0
	for _, x := range hs {
		k := http.CanonicalHeaderKey(x.GetName())
		first := len(all)
		for _, v := range x.GetValues() {
			all = append(all, joined[off:off+len(v)])
			off += len(v)
		}
		vs := all[first:len(all):len(all)]
		if prev, ok := h[k]; ok {
			vs = append(prev, vs...) // the same name twice (unlike case): prev is capped, so this copies
		}
		h[k] = vs
	}
	return h
}

// validText makes s valid UTF-8 for a protobuf string field, each run of
// invalid bytes replaced by U+FFFD. Error messages quote what a provider or
// process sent (a malformed header line, a tool's output), and a frame
// holding a string that is not UTF-8 cannot be sent: the error would reach
// the peer as a bare stream reset instead of itself.
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

func errorToProto(err error) *ioppb.Error {
	if err == nil {
		return nil
	}
	return &ioppb.Error{Code: validText(domain.CodeOf(err)), Message: validText(domain.MessageOf(err))}
}

func errorToDomain(e *ioppb.Error) error {
	if e == nil {
		return nil
	}
	info := peerError(e)
	return &domain.Error{Code: info.Code, Message: info.Message}
}

// peerError is an error the node reported, its code kept only if shaped
// like one (domain.PeerCode): a caller's answer, an event or the history
// never carries arbitrary text as a code.
func peerError(e *ioppb.Error) *domain.ErrorInfo {
	code, msg := domain.PeerError(e.GetCode(), e.GetMessage())
	return &domain.ErrorInfo{Code: code, Message: msg}
}

// tunnelFrameToProto converts f for the wire; raw and d are
// headersToProto's, for a header frame.
func tunnelFrameToProto(f domain.TunnelFrame, raw bool, d *headerDrops) *ioppb.ProviderTunnelFrame {
	p := &ioppb.ProviderTunnelFrame{}
	switch f.Kind {
	case domain.TunnelStatus:
		p.Kind = &ioppb.ProviderTunnelFrame_Status{Status: uint32(f.Status)}
	case domain.TunnelHeader:
		p.Kind = &ioppb.ProviderTunnelFrame_Header{Header: &ioppb.HeaderBlock{Headers: headersToProto(f.Header, raw, d)}}
	case domain.TunnelBody:
		p.Kind = &ioppb.ProviderTunnelFrame_Body{Body: f.Body}
	case domain.TunnelUsage:
		p.Kind = &ioppb.ProviderTunnelFrame_Usage{Usage: usageToProto(f.Usage)}
	case domain.TunnelMetadata:
		p.Kind = &ioppb.ProviderTunnelFrame_MetadataJson{MetadataJson: tunnelMetaToJSON(f)}
	case domain.TunnelEnd:
		p.Kind = &ioppb.ProviderTunnelFrame_End{End: &ioppb.End{}}
	case domain.TunnelError:
		e := f.Error
		if e == nil {
			e = &domain.ErrorInfo{Code: domain.CodeProviderError}
		}
		p.Kind = &ioppb.ProviderTunnelFrame_Error{Error: &ioppb.Error{Code: validText(e.Code), Message: validText(e.Message)}}
	}
	return p
}

// tunnelMeta is a tunnel metadata frame's JSON object (docs/wire.md).
// Fields a reader does not know are ignored: an edge of an earlier
// version ignores the frame altogether.
type tunnelMeta struct {
	StreamError *streamErrorJSON `json:"stream_error,omitempty"`
}

type streamErrorJSON struct {
	Type    string `json:"type,omitempty"`
	Message string `json:"message,omitempty"`
}

// tunnelMetaToJSON is the metadata JSON of f: its stream error, if it has
// one, else its raw metadata.
func tunnelMetaToJSON(f domain.TunnelFrame) []byte {
	if f.StreamError == nil {
		return f.Metadata
	}
	e := f.StreamError.Bounded()
	b, _ := json.Marshal(tunnelMeta{StreamError: &streamErrorJSON{Type: e.Type, Message: e.Message}}) // strings only: never fails
	return b
}

// streamErrorFromJSON is the stream error a node's metadata JSON states,
// cut to its bounds; nil if it states none (or is not JSON).
func streamErrorFromJSON(b []byte) *domain.ProviderStreamError {
	var m tunnelMeta
	if json.Unmarshal(b, &m) != nil || m.StreamError == nil {
		return nil
	}
	e := domain.ProviderStreamError{Type: m.StreamError.Type, Message: m.StreamError.Message}.Bounded()
	if e.Type == "" && e.Message == "" {
		e.Message = "the provider reported an error"
	}
	return &e
}

func tunnelFrameToDomain(p *ioppb.ProviderTunnelFrame) (domain.TunnelFrame, bool) {
	switch k := p.GetKind().(type) {
	case *ioppb.ProviderTunnelFrame_Status:
		// An HTTP status outside 100–999 would make the edge's response
		// writer panic; it is the node's fault, reported as such.
		if k.Status < 100 || k.Status > 999 {
			return domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderError, Message: fmt.Sprintf("node relayed invalid HTTP status %d", k.Status)}}, true
		}
		return domain.TunnelFrame{Kind: domain.TunnelStatus, Status: int(k.Status)}, true
	case *ioppb.ProviderTunnelFrame_Header:
		return domain.TunnelFrame{Kind: domain.TunnelHeader, Header: headersToDomain(k.Header.GetHeaders())}, true
	case *ioppb.ProviderTunnelFrame_Body:
		return domain.TunnelFrame{Kind: domain.TunnelBody, Body: k.Body}, true
	case *ioppb.ProviderTunnelFrame_Usage:
		return domain.TunnelFrame{Kind: domain.TunnelUsage, Usage: usageToDomain(k.Usage)}, true
	case *ioppb.ProviderTunnelFrame_MetadataJson:
		return domain.TunnelFrame{Kind: domain.TunnelMetadata, Metadata: k.MetadataJson, StreamError: streamErrorFromJSON(k.MetadataJson)}, true
	case *ioppb.ProviderTunnelFrame_End:
		return domain.TunnelFrame{Kind: domain.TunnelEnd}, true
	case *ioppb.ProviderTunnelFrame_Error:
		return domain.TunnelFrame{Kind: domain.TunnelError, Error: peerError(k.Error)}, true
	}
	return domain.TunnelFrame{}, false
}
