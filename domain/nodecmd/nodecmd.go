// Package nodecmd is the one contract between edge and node for node
// commands: their names, their arguments and their results. The node
// answers with these types, the edge reads them, and the iop CLI decodes
// them; the JSON form is also what GET/POST /v1/nodes/{id}/commands callers
// see, so field names are public API. Standard library only.
package nodecmd

import "time"

// The built-in commands every node answers. Adapter command families
// (ollama.*) are named by the adapters that serve them.
const (
	CmdCapabilities    = "capabilities"
	CmdTransportStatus = "transport_status"
	CmdUsageStatus     = "usage_status"
	CmdSessionList     = "session_list"
	CmdRuns            = "runs"
	CmdRunGet          = "run_get"
)

// Builtin lists the commands every node answers.
var Builtin = []string{CmdCapabilities, CmdTransportStatus, CmdUsageStatus, CmdSessionList, CmdRuns, CmdRunGet}

// Selector are the argument keys any adapter command (a dotted name, such
// as ollama.pull) may carry to pick who answers when the node has several:
// Adapter names an adapter, Provider a provider (not both). The one named
// answers alone: the node refuses the command when it lacks it
// (adapter_not_found, provider_not_found) or it does not serve the command
// (command_unsupported). With neither, the first adapter by name that
// serves the command answers, else the first such provider.
type Selector struct {
	Adapter  string `json:"adapter,omitempty"`
	Provider string `json:"provider,omitempty"`
}

// RunsArgs are the arguments of "runs": one page of the node's runs,
// newest first (by creation; ties by run id, descending). Status and
// Adapter filter them (empty: every run); Limit is the page's size (0:
// 50; at most 1000); Cursor continues after the page that returned it as
// NextCursor (pass the same filters again: the cursor holds only the
// position).
type RunsArgs struct {
	Status  string `json:"status,omitempty"`
	Adapter string `json:"adapter,omitempty"`
	Limit   int    `json:"limit"`
	Cursor  string `json:"cursor,omitempty"`
}

// RunGetArgs are the arguments of "run_get".
type RunGetArgs struct {
	RunID string `json:"run_id"`
}

// Capabilities answers "capabilities".
type Capabilities struct {
	NodeID        string    `json:"node_id"`
	ConfigVersion uint64    `json:"config_version"`
	Version       string    `json:"version"`
	OS            string    `json:"os"`
	Arch          string    `json:"arch"`
	Hostname      string    `json:"hostname"`
	Adapters      []Adapter `json:"adapters"`
	Commands      []string  `json:"commands"`
}

// Adapter describes one runtime adapter instance.
type Adapter struct {
	Name           string   `json:"name"`
	Type           string   `json:"type"`
	MaxConcurrency int      `json:"max_concurrency"`
	InFlight       int      `json:"in_flight"`
	Sessions       bool     `json:"sessions"`
	Commands       []string `json:"commands,omitempty"`
}

// TransportStatus answers "transport_status".
type TransportStatus struct {
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

// UsageStatus answers "usage_status".
type UsageStatus struct {
	Adapters []AdapterUsage `json:"adapters"`
	// Tunnels is the edge's part: the node counts runs and leaves it empty,
	// the edge fills in the provider tunnels it relayed for that node.
	Tunnels []TunnelUsage `json:"tunnels"`
}

// TunnelUsage is the usage of provider tunnels summed for one node, caller
// key, provider and model. Its JSON form is also GET /v1/usage's.
type TunnelUsage struct {
	Node string `json:"node"`
	// Key names the API key of the callers ("anonymous" without keys).
	Key      string `json:"key"`
	Provider string `json:"provider"`
	Model    string `json:"model"`
	// Requests counts finished tunnels; Errors those that ended with an
	// error (link lost, provider failure, caller gone) rather than an end,
	// or whose provider reported an error inside a 2xx stream.
	Requests         int64 `json:"requests"`
	Errors           int64 `json:"errors"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	// BodyBytes counts response body bytes relayed to callers.
	BodyBytes int64 `json:"body_bytes"`
}

// AdapterUsage is one adapter's run counts and token sums.
type AdapterUsage struct {
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

// SessionListArgs are the arguments of "session_list": one page of the
// node's sessions, newest first (by last use; ties by adapter, then
// session id, descending). Limit is the page's size (0: 100; at most
// 1000); Adapter keeps one adapter's sessions; Cursor continues after the
// page that returned it as NextCursor.
type SessionListArgs struct {
	Adapter string `json:"adapter,omitempty"`
	Limit   int    `json:"limit,omitempty"`
	Cursor  string `json:"cursor,omitempty"`
}

// SessionList answers "session_list". NextCursor, absent on the last
// page, continues the listing (SessionListArgs.Cursor).
type SessionList struct {
	Sessions   []Session `json:"sessions"`
	NextCursor string    `json:"next_cursor,omitempty"`
}

// Session is one logical session.
type Session struct {
	Adapter        string    `json:"adapter"`
	Target         string    `json:"target,omitempty"`
	SessionID      string    `json:"session_id"`
	Turns          int       `json:"turns"`
	LastUsed       time.Time `json:"last_used"`
	AgentSessionID string    `json:"agent_session_id,omitempty"`
}

// RunList answers "runs". NextCursor, absent on the last page, continues
// the listing (RunsArgs.Cursor).
type RunList struct {
	Runs       []Run  `json:"runs"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// Run is one run as recorded in the node's store ("run_get").
type Run struct {
	RunID      string     `json:"run_id"`
	Node       string     `json:"node,omitempty"`
	Adapter    string     `json:"adapter"`
	Target     string     `json:"target,omitempty"`
	SessionID  string     `json:"session_id,omitempty"`
	Background bool       `json:"background"`
	Status     string     `json:"status"`
	CreatedAt  time.Time  `json:"created_at"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Error      *Error     `json:"error,omitempty"`
	Usage      *Tokens    `json:"usage,omitempty"`
}

// Error is a code and message.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Tokens is a run's token usage.
type Tokens struct {
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	TotalTokens      int64   `json:"total_tokens"`
	CostUSD          float64 `json:"cost_usd,omitempty"`
}
