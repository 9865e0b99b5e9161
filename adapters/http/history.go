package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"iop/application/edge"
	"iop/domain"
)

// runRecordJSON is a run from the edge's history, in the shape nodes use
// for their runs (GET /v1/runs), plus the caller's key name.
type runRecordJSON struct {
	RunID      string            `json:"run_id"`
	Node       string            `json:"node"`
	Adapter    string            `json:"adapter"`
	Target     string            `json:"target"`
	SessionID  string            `json:"session_id"`
	Key        string            `json:"key"`
	Background bool              `json:"background"`
	Status     string            `json:"status"`
	CreatedAt  time.Time         `json:"created_at"`
	FinishedAt *time.Time        `json:"finished_at"`
	Error      *errorInfoJSON    `json:"error,omitempty"`
	Usage      *historyUsageJSON `json:"usage,omitempty"`
}

type historyUsageJSON struct {
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	TotalTokens      int64   `json:"total_tokens"`
	CostUSD          float64 `json:"cost_usd"`
	Model            string  `json:"model,omitempty"`
}

type errorInfoJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func toRunRecordJSON(r domain.RunRecord) runRecordJSON {
	out := runRecordJSON{RunID: r.ID, Node: r.Node, Adapter: r.Adapter, Target: r.Target, SessionID: r.SessionID, Key: r.Key,
		Background: r.Background, Status: string(r.Status), CreatedAt: r.CreatedAt}
	if !r.FinishedAt.IsZero() {
		t := r.FinishedAt
		out.FinishedAt = &t
	}
	if r.ErrorCode != "" {
		out.Error = &errorInfoJSON{Code: r.ErrorCode, Message: r.ErrorMsg}
	}
	if u := r.Usage; u != nil {
		out.Usage = &historyUsageJSON{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.Total(),
			CostUSD: u.CostUSD, Model: u.Model}
	}
	return out
}

// parseTime reads an RFC 3339 time or a date (YYYY-MM-DD, UTC midnight),
// and returns it in UTC: /v1/usage echoes it, and the API answers every
// time in UTC.
// The zero time is refused: the queries take it for "no bound", so
// until=0001-01-01, which bounds everything away, listed every run.
func parseTime(name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		t, err = time.Parse(time.DateOnly, v)
	}
	if i := strings.LastIndexByte(v, ' '); err != nil && i > 0 {
		// "?since=2026-03-01T09:00:00+02:00" typed into curl or a browser
		// arrives with its "+" decoded as a space; no time has a space
		// there, so it can only have been the offset's sign.
		t, err = time.Parse(time.RFC3339Nano, v[:i]+"+"+v[i+1:])
	}
	switch {
	case err != nil:
		return time.Time{}, domain.Errorf(domain.CodeInvalidRequest, "%s must be an RFC 3339 time or a date (YYYY-MM-DD), not %q", name, v)
	case t.IsZero():
		return time.Time{}, domain.Errorf(domain.CodeInvalidRequest, "%s %q is the zero time, which the history cannot take as a bound; leave %s out for none", name, v, name)
	}
	return t.UTC(), nil
}

// handleHistoryRuns answers GET /v1/runs from the edge's history:
// ?node=&adapter=&status=&key=&session=&since=&until=&limit=&cursor= →
// {"runs":[…],"next_cursor":"…"} (next_cursor absent on the last page).
func (s *Server) handleHistoryRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rq := domain.RunQuery{Node: q.Get("node"), Adapter: q.Get("adapter"), Status: domain.RunStatus(q.Get("status")),
		Key: q.Get("key"), Session: q.Get("session"), Cursor: q.Get("cursor")}
	if err := domain.CheckIDs("node", rq.Node, "adapter", rq.Adapter, "status", string(rq.Status), "key", rq.Key,
		"session", rq.Session, "cursor", rq.Cursor); err != nil {
		writeError(w, err)
		return
	}
	var err error
	if v := q.Get("limit"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 0 {
			writeError(w, domain.Errorf(domain.CodeInvalidRequest, "limit must be a non-negative integer, not %q", v))
			return
		}
		rq.Limit = n
	}
	if rq.Since, err = parseTime("since", q.Get("since")); err != nil {
		writeError(w, err)
		return
	}
	if rq.Until, err = parseTime("until", q.Get("until")); err != nil {
		writeError(w, err)
		return
	}
	page, err := s.deps.History.List(r.Context(), rq)
	if err != nil {
		writeHistoryError(w, err)
		return
	}
	out := struct {
		Runs       []runRecordJSON `json:"runs"`
		NextCursor string          `json:"next_cursor,omitempty"`
	}{Runs: make([]runRecordJSON, 0, len(page.Runs)), NextCursor: page.Next}
	for _, run := range page.Runs {
		out.Runs = append(out.Runs, toRunRecordJSON(run))
	}
	writeJSON(w, http.StatusOK, out)
}

// handleHistoryRun answers GET /v1/runs/{id} from the history, and asks the
// nodes only for a run the history does not have (one from before the
// store existed, or dispatched by another edge).
func (s *Server) handleHistoryRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := domain.CheckPathID("run id", id); err != nil {
		writeError(w, err)
		return
	}
	rec, err := s.deps.History.Get(r.Context(), id)
	if errors.Is(err, domain.ErrRunNotFound) {
		s.handleNodeRun(w, r)
		return
	}
	if err != nil && domain.CodeOf(err) != domain.CodeInvalidRequest {
		// The history cannot be read (its database is down, or the read
		// timed out): a run a connected node knows is answered as for one
		// the history lacks, so iop run-get still follows the runs in
		// flight; otherwise the history's error. It answered 503 even for
		// a run this edge was streaming.
		if raw, nerr := s.deps.GetRun.Handle(r.Context(), id); nerr == nil {
			writeRawJSON(w, http.StatusOK, raw)
			return
		}
	}
	if err != nil {
		writeHistoryError(w, err)
		return
	}
	w.Header().Set(headerNode, rec.Node)
	writeJSON(w, http.StatusOK, toRunRecordJSON(rec))
}

// handleHistoryUsage answers GET /v1/usage?group_by=key|node|model|day
// (default node)&since=&until= from the history; "tunnels" keeps the live
// tunnel ledger of this edge process (?node= filters it).
func (s *Server) handleHistoryUsage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	uq := domain.UsageQuery{GroupBy: q.Get("group_by")}
	if uq.GroupBy == "" {
		uq.GroupBy = domain.GroupByNode
	}
	var err error
	if uq.Since, err = parseTime("since", q.Get("since")); err != nil {
		writeError(w, err)
		return
	}
	if uq.Until, err = parseTime("until", q.Get("until")); err != nil {
		writeError(w, err)
		return
	}
	totals, err := s.deps.History.Usage(r.Context(), uq)
	if err != nil {
		writeHistoryError(w, err)
		return
	}
	if totals == nil {
		totals = []domain.UsageTotal{}
	}
	out := map[string]any{"group_by": uq.GroupBy, "usage": totals}
	if !uq.Since.IsZero() {
		out["since"] = uq.Since
	}
	if !uq.Until.IsZero() {
		out["until"] = uq.Until
	}
	if s.deps.TunnelUsage != nil {
		caller := domain.PrincipalFrom(r.Context())
		lines := []edge.UsageLine{}
		for _, l := range s.deps.TunnelUsage(q.Get("node")) {
			if caller.SeesNode(l.Node) {
				lines = append(lines, l)
			}
		}
		out["tunnels"] = lines
	}
	writeJSON(w, http.StatusOK, out)
}

// writeHistoryError answers a history read that failed. A database fault is
// a 503 history_unavailable (the detail goes to the log, never to the
// caller): runs keep working while the history is down, only reading it
// does not.
func writeHistoryError(w http.ResponseWriter, err error) {
	if domain.CodeOf(err) != domain.CodeInternal || errors.Is(err, context.DeadlineExceeded) {
		writeError(w, err)
		return
	}
	noteInternal(w, err)
	writeJSONError(w, http.StatusServiceUnavailable, domain.CodeHistoryUnavailable,
		"the run history cannot be read right now (its database is unreachable); the edge's log has the details")
}
