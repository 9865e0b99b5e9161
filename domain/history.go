package domain

import (
	"slices"
	"time"
)

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
	// Edge is the store.edge_id of the edge that first recorded the run
	// (its dispatch; a later write of the row keeps it), as read from the
	// history ("" in a record not read from it): edges sharing one
	// PostgreSQL history each reach only their own nodes. A record written
	// carries the writer's own id whatever Edge says.
	Edge string
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
	// Response is the id of the stored response the tunnel created (a
	// Responses API create), "" for none: whose it is, and where its
	// follow-ups go, for an edge that no longer remembers it.
	Response string
	// UsageOf is the id of the stored response whose usage the tunnel
	// counted without creating it ("" for none): the first retrieval of a
	// background response that reported its usage. The history keeps it
	// so that an edge that no longer remembers the response does not
	// count that usage again.
	UsageOf string
	// UsageCounted, in the record of a response's creation as the history
	// recalls it (ports.ResponseHistory), says that its usage is not for
	// this edge to count (any more): the creating tunnel or a later one
	// (UsageOf) counted it, or it was created through another edge
	// sharing the history, whose to count it is. Not written.
	UsageCounted bool
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
	// Took limits the runs to those a node took: not the failed runs that
	// were refused before they started (RefusedBeforeStart).
	Took bool
	// ExcludeKeys, when not empty, leaves out the runs of these key names.
	ExcludeKeys []string
	// Own limits the runs to those this edge wrote: where edges may share
	// the history (PostgreSQL), the rows carrying the store's edge id; a
	// history only one edge uses (an SQLite file) holds its rows alone, all
	// of them, whatever edge id (host name) wrote them.
	Own bool
}

// refusedBeforeStart are the error codes of a failed run that no node
// took: it was refused before it started (unknown adapter or target, no
// free slot, …), so it left its session where it was.
var refusedBeforeStart = []string{
	CodeAdapterNotFound, CodeTargetNotFound, CodeAtCapacity, CodeInvalidRequest,
	CodeSessionUnsupported, CodeShuttingDown, CodeNoNodeAvailable,
}

// RefusedBeforeStart reports whether a failed run with error code was
// refused before any node took it.
func RefusedBeforeStart(code string) bool { return slices.Contains(refusedBeforeStart, code) }

// RefusedBeforeStartCodes returns the codes RefusedBeforeStart reports.
func RefusedBeforeStartCodes() []string { return slices.Clone(refusedBeforeStart) }

// Took reports whether a node took r, so that it holds r's session: it
// ran the run, or refused it only because the session was busy there.
func (r RunRecord) Took() bool {
	return r.Status != RunFailed || !RefusedBeforeStart(r.ErrorCode)
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
