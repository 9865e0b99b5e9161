package domain

import "time"

// RunRecord is one run in the edge's history: where it ran, who asked, how
// it ended and what it used. Inputs and output are never part of it.
type RunRecord struct {
	ID         string
	Node       string
	Adapter    string
	Target     string
	SessionID  string
	Key        string // the caller's key name, or AnonymousName
	Background bool
	Status     RunStatus
	CreatedAt  time.Time
	FinishedAt time.Time // zero while the run is in flight
	ErrorCode  string
	ErrorMsg   string
	Usage      *Usage
}

// TunnelRecord is one provider tunnel in the edge's history, without any
// body.
type TunnelRecord struct {
	ID         string
	Node       string
	Provider   string
	Model      string
	Path       string
	Key        string
	Status     int    // the provider's HTTP status; 0 if none arrived
	ErrorCode  string // "" when the tunnel ended normally
	BodyBytes  int64  // response body bytes relayed to the caller
	Usage      *Usage
	StartedAt  time.Time
	FinishedAt time.Time
}

// Duration is how long the tunnel was open.
func (t TunnelRecord) Duration() time.Duration { return t.FinishedAt.Sub(t.StartedAt) }

// RunQuery selects runs from the history, newest first. Zero fields match
// everything; Cursor continues a previous page.
type RunQuery struct {
	Node    string
	Adapter string
	Status  RunStatus
	Key     string
	Session string    // runs of this session_id
	Since   time.Time // created at or after
	Until   time.Time // created before
	Limit   int
	Cursor  string
	// Nodes, when not empty, limits the runs to these nodes (a caller
	// whose key is limited to them).
	Nodes []string
}

// RunPage is one page of a RunQuery; Next is empty on the last page.
type RunPage struct {
	Runs []RunRecord
	Next string
}

// Usage groupings of GET /v1/usage.
const (
	GroupByKey   = "key"
	GroupByNode  = "node"
	GroupByModel = "model"
	GroupByDay   = "day"
)

// UsageQuery sums runs and tunnels created in [Since, Until) by GroupBy.
type UsageQuery struct {
	GroupBy string
	Since   time.Time
	Until   time.Time
	Nodes   []string // when not empty, only these nodes
}

// UsageTotal is the usage of one group: runs and tunnels together.
type UsageTotal struct {
	Group            string  `json:"group"`
	Runs             int64   `json:"runs"`
	Tunnels          int64   `json:"tunnels"`
	Requests         int64   `json:"requests"`
	Errors           int64   `json:"errors"`
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	TotalTokens      int64   `json:"total_tokens"`
	CostUSD          float64 `json:"cost_usd"`
	BodyBytes        int64   `json:"body_bytes"`
}
