package edge

import (
	"context"
	"log/slog"
	"time"

	"iop/domain"
)

// Bounds of a session's recall from the history: how long the run waits
// for it, and how many of the session's newest runs are looked at.
const (
	sessionRecallTimeout = 2 * time.Second
	sessionRecallRuns    = 8
)

// recallSession binds a session the edge has no node for to the node of
// its newest run in the history that a node took, so the session's next
// turn still goes where its history lives (a chat's messages, an agent's
// resume id) although this edge restarted, forgot the session among 10,000
// more recent ones, or never saw it (another edge sharing the history's
// database ran it). A history that fails or is slow only costs the
// binding: the run is placed as any other.
func (h *SubmitRunHandler) recallSession(ctx context.Context, adapter, session string) {
	if h.Sessions == nil || session == "" {
		return
	}
	if h.reg.knowsSession(adapter, session) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, sessionRecallTimeout)
	defer cancel()
	page, err := h.Sessions.ListRuns(ctx, domain.RunQuery{Adapter: adapter, Session: session, Limit: sessionRecallRuns})
	if err != nil {
		h.log.Warn("session's node not recalled from the history; the run is placed afresh", "adapter", adapter, "session", session, "err", err)
		return
	}
	for _, r := range page.Runs {
		if tookSession(r) {
			h.reg.recallSession(adapter, session, r.Node)
			if h.log.Enabled(ctx, slog.LevelDebug) {
				h.log.Debug("session's node recalled from the history", "adapter", adapter, "session", session, "node", r.Node, "run", r.ID)
			}
			return
		}
	}
}

// tookSession reports whether r's node holds its session: it ran the run,
// or refused it only because the session was busy there. A run refused
// before it started (unknown adapter or target, no free slot, …) left the
// session where it was.
func tookSession(r domain.RunRecord) bool {
	if r.Status != domain.RunFailed {
		return true
	}
	switch r.ErrorCode {
	case domain.CodeAdapterNotFound, domain.CodeTargetNotFound, domain.CodeAtCapacity, domain.CodeInvalidRequest,
		domain.CodeSessionUnsupported, domain.CodeShuttingDown, domain.CodeNoNodeAvailable:
		return false
	}
	return true
}
