package edgestore

import (
	"strings"
	"time"

	"github.com/uptrace/bun"

	"iop/adapters/store/internal/sqltext"
	"iop/domain"
)

// maxText bounds free-text columns (targets, session ids, paths). An error
// message is kept as its run event has it (domain.MaxPeerMessage, cut with
// domain.ClipMessage's marker beyond): cut here to 2 KiB, without a marker,
// GET /v1/runs/{id} showed a shorter message than the run's error event, as
// if it were the whole of it.
const maxText = 2048

type runRow struct {
	bun.BaseModel `bun:"table:edge_runs"`

	ID               string  `bun:"id,pk"`
	EdgeID           string  `bun:"edge_id"`
	Node             string  `bun:"node"`
	Adapter          string  `bun:"adapter"`
	Target           string  `bun:"target"`
	SessionID        string  `bun:"session_id"`
	KeyName          string  `bun:"key_name"`
	Background       bool    `bun:"background"`
	Status           string  `bun:"status"`
	CreatedUS        int64   `bun:"created_us"`
	FinishedUS       int64   `bun:"finished_us"`
	ErrorCode        string  `bun:"error_code"`
	ErrorMessage     string  `bun:"error_message"`
	Model            string  `bun:"model"`
	PromptTokens     int64   `bun:"prompt_tokens"`
	CompletionTokens int64   `bun:"completion_tokens"`
	TotalTokens      int64   `bun:"total_tokens"`
	CostUSD          float64 `bun:"cost_usd"`
	HasUsage         bool    `bun:"has_usage"`
}

type tunnelRow struct {
	bun.BaseModel `bun:"table:edge_tunnels"`

	ID               string  `bun:"id,pk"`
	EdgeID           string  `bun:"edge_id"`
	Node             string  `bun:"node"`
	Provider         string  `bun:"provider"`
	Model            string  `bun:"model"`
	Path             string  `bun:"path"`
	KeyName          string  `bun:"key_name"`
	Status           int     `bun:"status"`
	ErrorCode        string  `bun:"error_code"`
	BodyBytes        int64   `bun:"body_bytes"`
	PromptTokens     int64   `bun:"prompt_tokens"`
	CompletionTokens int64   `bun:"completion_tokens"`
	TotalTokens      int64   `bun:"total_tokens"`
	CostUSD          float64 `bun:"cost_usd"`
	StartedUS        int64   `bun:"started_us"`
	FinishedUS       int64   `bun:"finished_us"`
	// ResponseID is the stored response the tunnel created; NULL for none
	// (most tunnels), which its index leaves out.
	ResponseID string `bun:"response_id,nullzero"`
	// UsageOf is the stored response whose usage the tunnel counted
	// without creating it; NULL for none (nearly all tunnels), which its
	// index leaves out.
	UsageOf string `bun:"usage_of,nullzero"`
}

// hasUsage reports whether the row records usage: a tunnel that counted
// none records zeros.
func (row tunnelRow) hasUsage() bool {
	return row.PromptTokens != 0 || row.CompletionTokens != 0 || row.TotalTokens != 0 || row.CostUSD != 0
}

// maxResponseID bounds a stored response id as kept (and looked up).
const maxResponseID = 255

// responseID is id as the history keeps it: whole, or not at all ("") when
// it is longer than the column or holds a NUL — cut or changed, two ids
// could match one row, and one key follow up another's response.
func responseID(id string) string {
	if len(id) > maxResponseID || strings.ContainsRune(id, 0) {
		return ""
	}
	return id
}

func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

func fromMicros(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && s[len(s)-1]&0xC0 == 0x80 {
		s = s[:len(s)-1]
	}
	if len(s) > 0 && s[len(s)-1] >= 0xC0 {
		s = s[:len(s)-1]
	}
	return s
}

// text is s fit for a text column of at most n bytes: every NUL byte
// replaced by U+FFFD, then clipped. PostgreSQL refuses NUL in text (and
// bun refuses to inline it), so one such value would fail its statement —
// a whole batch of other callers' rows. NULs reach history from outside
// (a decoded URL path, an exec run's stderr tail); every text column goes
// through here so none is missed, SQLite alike so both stores hold the same.
func text(s string, n int) string {
	return clip(sqltext.NoNUL(s), n)
}

func toRunRow(edgeID string, r domain.RunRecord) runRow {
	row := runRow{
		ID: text(r.ID, 64), EdgeID: text(edgeID, 255), Node: text(r.Node, 255), Adapter: text(r.Adapter, 255),
		Target: text(r.Target, maxText), SessionID: text(r.SessionID, maxText), KeyName: text(keyOr(r.Key), 255),
		Background: r.Background, Status: text(string(r.Status), 16), CreatedUS: micros(r.CreatedAt), FinishedUS: micros(r.FinishedAt),
		ErrorCode: text(r.ErrorCode, 64), ErrorMessage: domain.ClipMessage(sqltext.NoNUL(r.ErrorMsg), domain.MaxPeerMessage),
	}
	if u := r.Usage; u != nil {
		row.HasUsage = true
		row.Model = text(u.Model, 255)
		row.PromptTokens, row.CompletionTokens, row.TotalTokens, row.CostUSD = storedUsage(*u)
	}
	return row
}

// storedUsage is u's token counts and cost as stored: each within the
// bounds of domain.Usage.Bounded (a negative count, as a NaN or infinite
// cost, is 0), the total from the bounded counts when u has none. Runs and
// tunnels, on SQLite and PostgreSQL, go through here; the node's store
// bounds what it keeps alike.
func storedUsage(u domain.Usage) (prompt, completion, total int64, costUSD float64) {
	b := u.Bounded()
	return b.PromptTokens, b.CompletionTokens, domain.BoundTokens(b.Total()), b.CostUSD
}

func (row runRow) record() domain.RunRecord {
	r := domain.RunRecord{
		ID: row.ID, Node: row.Node, Adapter: row.Adapter, Target: row.Target, SessionID: row.SessionID, Key: row.KeyName,
		Background: row.Background, Status: domain.RunStatus(row.Status), CreatedAt: fromMicros(row.CreatedUS),
		FinishedAt: fromMicros(row.FinishedUS), ErrorCode: row.ErrorCode, ErrorMsg: row.ErrorMessage, Edge: row.EdgeID,
	}
	if row.HasUsage {
		r.Usage = &domain.Usage{PromptTokens: row.PromptTokens, CompletionTokens: row.CompletionTokens,
			TotalTokens: row.TotalTokens, CostUSD: row.CostUSD, Model: row.Model}
	}
	return r
}

func toTunnelRow(edgeID string, t domain.TunnelRecord) tunnelRow {
	row := tunnelRow{
		ID: text(t.ID, 64), EdgeID: text(edgeID, 255), Node: text(t.Node, 255), Provider: text(t.Provider, 255),
		Model: text(t.Model, 255), Path: text(t.Path, maxText), KeyName: text(keyOr(t.Key), 255), Status: t.Status,
		ErrorCode: text(t.ErrorCode, 64), BodyBytes: t.BodyBytes, StartedUS: micros(t.StartedAt), FinishedUS: micros(t.FinishedAt),
		ResponseID: responseID(t.Response), UsageOf: responseID(t.UsageOf),
	}
	if u := t.Usage; u != nil {
		row.PromptTokens, row.CompletionTokens, row.TotalTokens, row.CostUSD = storedUsage(*u)
		if row.Model == "" {
			row.Model = text(u.Model, 255)
		}
	}
	return row
}

func keyOr(k string) string {
	if k == "" {
		return domain.AnonymousName
	}
	return k
}

// args are the row's values in the order of runColumns.
func (row *runRow) args() []any {
	return []any{row.ID, row.EdgeID, row.Node, row.Adapter, row.Target, row.SessionID, row.KeyName, row.Background,
		row.Status, row.CreatedUS, row.FinishedUS, row.ErrorCode, row.ErrorMessage, row.Model, row.PromptTokens,
		row.CompletionTokens, row.TotalTokens, row.CostUSD, row.HasUsage}
}

// args are the row's values in the order of tunnelColumns.
func (row *tunnelRow) args() []any {
	return []any{row.ID, row.EdgeID, row.Node, row.Provider, row.Model, row.Path, row.KeyName, int64(row.Status),
		row.ErrorCode, row.BodyBytes, row.PromptTokens, row.CompletionTokens, row.TotalTokens, row.CostUSD,
		row.StartedUS, row.FinishedUS, nullString(row.ResponseID), nullString(row.UsageOf)}
}

// nullString is s as a value to bind: NULL for "".
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// record is the tunnel row as read back, without its usage.
func (row tunnelRow) record() domain.TunnelRecord {
	return domain.TunnelRecord{
		ID: row.ID, Node: row.Node, Provider: row.Provider, Model: row.Model, Path: row.Path, Key: row.KeyName,
		Status: row.Status, ErrorCode: row.ErrorCode, BodyBytes: row.BodyBytes,
		StartedAt: fromMicros(row.StartedUS), FinishedAt: fromMicros(row.FinishedUS), Response: row.ResponseID,
	}
}
