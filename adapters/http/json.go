package httpapi

import (
	"encoding/json"
	"time"

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
	Connected      bool           `json:"connected"`
	DisconnectedAt *time.Time     `json:"disconnected_at,omitempty"`
	Remote         string         `json:"remote,omitempty"`
	ConnectedAt    *time.Time     `json:"connected_at,omitempty"`
	Version        string         `json:"version,omitempty"`
	OS             string         `json:"os,omitempty"`
	Arch           string         `json:"arch,omitempty"`
	Hostname       string         `json:"hostname,omitempty"`
	ConfigVersion  uint64         `json:"config_version"`
	RunsInFlight   int            `json:"runs_in_flight"`
	Adapters       []adapterJSON  `json:"adapters"`
	Providers      []providerJSON `json:"providers"`
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
		Arch: n.Info.Arch, Hostname: n.Info.Hostname, ConfigVersion: n.Config.Version, RunsInFlight: n.RunsInFlight,
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
	}
	return out
}
