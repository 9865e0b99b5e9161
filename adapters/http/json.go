package httpapi

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"iop/application/edge"
	"iop/domain"
)

// The API's JSON shapes and their converters from domain types.

type runEventJSON struct {
	RunID    string          `json:"run_id,omitempty"`
	Node     string          `json:"node,omitempty"`
	Seq      uint64          `json:"seq,omitempty"`
	Type     string          `json:"type"`
	Text     string          `json:"text,omitempty"`
	Usage    *usageJSON      `json:"usage,omitempty"`
	Error    *errorJSON      `json:"error,omitempty"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

type usageJSON struct {
	PromptTokens     int64   `json:"prompt_tokens,omitempty"`
	CompletionTokens int64   `json:"completion_tokens,omitempty"`
	TotalTokens      int64   `json:"total_tokens,omitempty"`
	CostUSD          float64 `json:"cost_usd,omitempty"`
	DurationMS       int64   `json:"duration_ms,omitempty"`
	StopReason       string  `json:"stop_reason,omitempty"`
	Model            string  `json:"model,omitempty"`
}

func toUsageJSON(u *domain.Usage) *usageJSON {
	if u == nil {
		return nil
	}
	return &usageJSON{
		PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens,
		CostUSD: u.CostUSD, DurationMS: u.DurationMS, StopReason: u.StopReason, Model: u.Model,
	}
}

func toRunEventJSON(node string, ev domain.RunEvent) runEventJSON {
	out := runEventJSON{RunID: ev.RunID, Node: node, Seq: ev.Seq, Type: string(ev.Type), Text: ev.Text, Usage: toUsageJSON(ev.Usage)}
	if ev.Error != nil {
		out.Error = &errorJSON{Code: ev.Error.Code, Message: ev.Error.Message}
	}
	if len(ev.Metadata) > 0 {
		if json.Valid(ev.Metadata) {
			out.Metadata = ev.Metadata
		} else {
			// Never let a malformed extra break the stream: carry it as a string.
			out.Metadata, _ = json.Marshal(string(ev.Metadata))
		}
	}
	return out
}

type busEventJSON struct {
	Type   string        `json:"type"`
	Time   time.Time     `json:"time"`
	Node   string        `json:"node,omitempty"`
	Reason string        `json:"reason,omitempty"`
	Remote string        `json:"remote,omitempty"`
	Key    string        `json:"key,omitempty"`
	Run    *runEventJSON `json:"run,omitempty"`
	Tunnel *tunnelJSON   `json:"tunnel,omitempty"`
}

type tunnelJSON struct {
	ID         string     `json:"id"`
	Provider   string     `json:"provider,omitempty"`
	Model      string     `json:"model,omitempty"`
	Path       string     `json:"path,omitempty"`
	Status     int        `json:"status,omitempty"`
	BodyBytes  int64      `json:"body_bytes"`
	DurationMS int64      `json:"duration_ms"`
	Usage      *usageJSON `json:"usage,omitempty"`
	Error      string     `json:"error,omitempty"`
}

func toBusEventJSON(ev domain.BusEvent) busEventJSON {
	out := busEventJSON{Type: ev.Type, Time: ev.Time.UTC(), Node: ev.Node, Reason: ev.Reason, Remote: ev.Remote, Key: ev.Key}
	if ev.Run != nil {
		r := toRunEventJSON(ev.Node, *ev.Run)
		out.Run = &r
	}
	if t := ev.Tunnel; t != nil {
		out.Tunnel = &tunnelJSON{
			ID: t.ID, Provider: t.Provider, Model: t.Model, Path: t.Path, Status: t.Status, BodyBytes: t.BodyBytes,
			DurationMS: t.Duration.Milliseconds(), Usage: toUsageJSON(t.Usage), Error: t.Error,
		}
	}
	return out
}

type nodeJSON struct {
	ID string `json:"id"`
	// Connected is false for a node of the config that is not connected;
	// such a node has no remote, connected_at, version or platform, and
	// its adapters and providers are those of the config.
	Connected      bool       `json:"connected"`
	DisconnectedAt *time.Time `json:"disconnected_at,omitempty"`
	// DisconnectReason says why it left then (a heartbeat timeout, the node
	// shutting down, a config it refused …).
	DisconnectReason string         `json:"disconnect_reason,omitempty"`
	Remote           string         `json:"remote,omitempty"`
	ConnectedAt      *time.Time     `json:"connected_at,omitempty"`
	Version          string         `json:"version,omitempty"`
	OS               string         `json:"os,omitempty"`
	Arch             string         `json:"arch,omitempty"`
	Hostname         string         `json:"hostname,omitempty"`
	ConfigVersion    uint64         `json:"config_version"`
	RunsInFlight     int            `json:"runs_in_flight"`
	Adapters         []adapterJSON  `json:"adapters"`
	Providers        []providerJSON `json:"providers"`
	// Draining: the node is stopping; it gets no new runs while those in
	// flight end.
	Draining bool `json:"draining,omitempty"`
}

type adapterJSON struct {
	Name           string `json:"name"`
	Type           string `json:"type"`
	MaxConcurrency int    `json:"max_concurrency"`
	InFlight       int    `json:"in_flight"`
}

type providerJSON struct {
	Name   string   `json:"name"`
	Type   string   `json:"type"`
	Models []string `json:"models"`
}

// toNodeJSON describes a live node. In-flight counts are the runs this edge
// has dispatched there; secrets in the node's config are never included.
func toNodeJSON(n edge.NodeView) nodeJSON {
	connectedAt := n.ConnectedAt.UTC()
	out := nodeJSON{
		ID: n.ID, Connected: true, Remote: n.Remote, ConnectedAt: &connectedAt, Version: n.Info.Version, OS: n.Info.OS,
		Arch: n.Info.Arch, Hostname: n.Info.Hostname, ConfigVersion: n.Config.Version, RunsInFlight: n.RunsInFlight, Draining: n.Draining,
		Adapters: []adapterJSON{}, Providers: []providerJSON{},
	}
	for _, a := range n.Adapters {
		out.Adapters = append(out.Adapters, adapterJSON{Name: a.Name, Type: a.Type, MaxConcurrency: a.MaxConcurrency, InFlight: a.InFlight})
	}
	for _, p := range n.Config.Providers {
		models := p.Models
		if models == nil {
			models = []string{}
		}
		out.Providers = append(out.Providers, providerJSON{Name: p.Name, Type: p.Type, Models: models})
	}
	return out
}

// toNodeEntryJSON describes a node of the node list, connected or not.
func toNodeEntryJSON(e edge.NodeEntry) nodeJSON {
	out := toNodeJSON(e.View)
	if e.Connected {
		return out
	}
	out.Connected, out.ConnectedAt = false, nil
	if !e.DisconnectedAt.IsZero() {
		t := e.DisconnectedAt.UTC()
		out.DisconnectedAt = &t
		out.DisconnectReason = e.DisconnectReason
	}
	return out
}

// appendRunEventJSON appends json.Marshal(toRunEventJSON(node, ev)) to b,
// byte for byte, without reflection: a run's events are most of what a run
// costs the edge to relay. Events with metadata or a cost fall back to
// json.Marshal (metadata is compacted and checked there; a cost is a float).
func appendRunEventJSON(b []byte, node string, ev domain.RunEvent) ([]byte, error) {
	if len(ev.Metadata) > 0 || (ev.Usage != nil && ev.Usage.CostUSD != 0) {
		js, err := json.Marshal(toRunEventJSON(node, ev))
		return append(b, js...), err
	}
	b = append(b, '{')
	if ev.RunID != "" {
		b = append(b, `"run_id":`...)
		b = appendJSONString(b, ev.RunID)
		b = append(b, ',')
	}
	if node != "" {
		b = append(b, `"node":`...)
		b = appendJSONString(b, node)
		b = append(b, ',')
	}
	if ev.Seq != 0 {
		b = append(b, `"seq":`...)
		b = strconv.AppendUint(b, ev.Seq, 10)
		b = append(b, ',')
	}
	b = append(b, `"type":`...)
	b = appendJSONString(b, string(ev.Type))
	if ev.Text != "" {
		b = append(b, `,"text":`...)
		b = appendJSONString(b, ev.Text)
	}
	if u := ev.Usage; u != nil {
		b = append(b, `,"usage":{`...)
		n := len(b)
		b = appendJSONInt(b, "prompt_tokens", u.PromptTokens)
		b = appendJSONInt(b, "completion_tokens", u.CompletionTokens)
		b = appendJSONInt(b, "total_tokens", u.TotalTokens)
		b = appendJSONInt(b, "duration_ms", u.DurationMS)
		if u.StopReason != "" {
			b = append(b, `,"stop_reason":`...)
			b = appendJSONString(b, u.StopReason)
		}
		if u.Model != "" {
			b = append(b, `,"model":`...)
			b = appendJSONString(b, u.Model)
		}
		if len(b) > n { // drop the first field's comma
			b = append(b[:n], b[n+1:]...)
		}
		b = append(b, '}')
	}
	if e := ev.Error; e != nil {
		b = append(b, `,"error":{"code":`...)
		b = appendJSONString(b, e.Code)
		b = append(b, `,"message":`...)
		b = appendJSONString(b, e.Message)
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

// appendJSONInt appends `,"name":v` unless v is 0 (omitempty).
func appendJSONInt(b []byte, name string, v int64) []byte {
	if v == 0 {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, v, 10)
}

// appendJSONString appends s quoted as encoding/json quotes it with its
// default HTML escaping: <, > and & as \u003c…, invalid UTF-8 as \ufffd,
// U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
