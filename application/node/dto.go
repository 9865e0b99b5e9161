package node

import "time"

// The JSON shapes of node command results. The edge passes them through to
// HTTP callers unchanged, so field names are part of the public API.

// CapabilitiesDTO answers "capabilities".
type CapabilitiesDTO struct {
	NodeID        string       `json:"node_id"`
	ConfigVersion uint64       `json:"config_version"`
	Version       string       `json:"version"`
	OS            string       `json:"os"`
	Arch          string       `json:"arch"`
	Hostname      string       `json:"hostname"`
	Adapters      []AdapterDTO `json:"adapters"`
	Commands      []string     `json:"commands"`
}

// AdapterDTO describes one runtime adapter instance.
type AdapterDTO struct {
	Name           string   `json:"name"`
	Type           string   `json:"type"`
	MaxConcurrency int      `json:"max_concurrency"`
	InFlight       int      `json:"in_flight"`
	Sessions       bool     `json:"sessions"`
	Commands       []string `json:"commands,omitempty"`
}

// TransportStatusDTO answers "transport_status".
type TransportStatusDTO struct {
	Connected      bool       `json:"connected"`
	ConnectedSince *time.Time `json:"connected_since,omitempty"`
	Reconnects     int64      `json:"reconnects"`
	LastRTTMillis  float64    `json:"last_rtt_ms"`
	FramesIn       int64      `json:"frames_in"`
	FramesOut      int64      `json:"frames_out"`
	BytesIn        int64      `json:"bytes_in"`
	BytesOut       int64      `json:"bytes_out"`
	Edge           string     `json:"edge"`
	RunsInFlight   int        `json:"runs_in_flight"`
}

// UsageStatusDTO answers "usage_status".
type UsageStatusDTO struct {
	Adapters []UsageDTO `json:"adapters"`
}

// UsageDTO is one adapter's run counts and token sums.
type UsageDTO struct {
	Adapter          string  `json:"adapter"`
	RunsTotal        int64   `json:"runs_total"`
	Succeeded        int64   `json:"succeeded"`
	Failed           int64   `json:"failed"`
	Cancelled        int64   `json:"cancelled"`
	Running          int64   `json:"running"`
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	TotalTokens      int64   `json:"total_tokens"`
	CostUSD          float64 `json:"cost_usd"`
}

// SessionListDTO answers "session_list".
type SessionListDTO struct {
	Sessions []SessionDTO `json:"sessions"`
}

// SessionDTO is one logical session.
type SessionDTO struct {
	Adapter        string    `json:"adapter"`
	Target         string    `json:"target,omitempty"`
	SessionID      string    `json:"session_id"`
	Turns          int       `json:"turns"`
	LastUsed       time.Time `json:"last_used"`
	AgentSessionID string    `json:"agent_session_id,omitempty"`
}

// RunListDTO answers "runs".
type RunListDTO struct {
	Runs []RunDTO `json:"runs"`
}

// RunDTO is one run as recorded in the node's store ("run_get").
type RunDTO struct {
	RunID      string          `json:"run_id"`
	Node       string          `json:"node,omitempty"`
	Adapter    string          `json:"adapter"`
	Target     string          `json:"target,omitempty"`
	SessionID  string          `json:"session_id,omitempty"`
	Background bool            `json:"background"`
	Status     string          `json:"status"`
	CreatedAt  time.Time       `json:"created_at"`
	StartedAt  *time.Time      `json:"started_at,omitempty"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
	Error      *ErrorDTO       `json:"error,omitempty"`
	Usage      *UsageTokensDTO `json:"usage,omitempty"`
}

// ErrorDTO is a code and message.
type ErrorDTO struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// UsageTokensDTO is a run's token usage.
type UsageTokensDTO struct {
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	TotalTokens      int64   `json:"total_tokens"`
	CostUSD          float64 `json:"cost_usd,omitempty"`
}
