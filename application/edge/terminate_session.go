package edge

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"iop/domain"
	"iop/ports"
)

// TerminateSession ends one logical session of one adapter on one node.
type TerminateSession struct {
	Node      string
	Adapter   string
	Target    string
	SessionID string
}

// TerminateSessionHandler sends TERMINATE_SESSION to a node.
type TerminateSessionHandler struct {
	reg     *Registry
	timeout time.Duration
	// Sessions, if set, is the history a session's owner is recalled from
	// when the edge has none in memory (sessionGuard).
	Sessions ports.HistoryReader
	// Log, if set, gets the failures to recall an owner (else slog.Default).
	Log *slog.Logger
	// AdminKey: as SubmitRunHandler's.
	AdminKey func(name string) bool
	// Edge: as CancelRunHandler's (set only for a history other edges may
	// share): a session whose node is not connected here, last run by
	// another edge, is refused naming that edge.
	Edge string
}

// NewTerminateSessionHandler refuses nil dependencies.
func NewTerminateSessionHandler(reg *Registry) *TerminateSessionHandler {
	if reg == nil {
		panic("edge.NewTerminateSessionHandler: nil dependency")
	}
	return &TerminateSessionHandler{reg: reg, timeout: 30 * time.Second}
}

// Handle ends the session. An adapter without sessions answers
// session_unsupported, a session the node does not keep session_not_found
// (naming the node the session is bound to, when the edge knows one the
// caller may see); the node is optional when exactly one is connected.
// A session another API key owns is refused (forbidden) unless the caller
// is an admin.
func (h *TerminateSessionHandler) Handle(ctx context.Context, cmd TerminateSession) error {
	if err := domain.PrincipalFrom(ctx).Require(domain.ScopeRuns); err != nil {
		return err
	}
	if err := domain.CheckPathIDs("session id", cmd.SessionID, "node", cmd.Node); err != nil {
		return err
	}
	if err := domain.CheckIDs("adapter", cmd.Adapter, "target", cmd.Target); err != nil {
		return err
	}
	if cmd.Adapter == "" || cmd.SessionID == "" {
		return domain.Errorf(domain.CodeInvalidRequest, "adapter and session id are required")
	}
	// Only the session's key (or an admin) may end it.
	log := h.Log
	if log == nil {
		log = slog.Default()
	}
	guard := func() error {
		_, err := (sessionGuard{h.reg, h.Sessions, log, h.AdminKey}).use(ctx, cmd.Adapter, cmd.SessionID, false, false)
		return err
	}
	n, err := h.reg.resolve(domain.PrincipalFrom(ctx), cmd.Node)
	if err != nil {
		if domain.CodeOf(err) == domain.CodeNodeNotFound && h.Edge != "" && h.Sessions != nil && guard() == nil {
			if other := h.otherEdge(ctx, cmd); other != "" {
				return domain.Errorf(domain.CodeNodeNotFound,
					"node %q is not connected to this edge (%q); session %q of adapter %q last ran through edge %q (store.edge_id) on it: end it through edge %q",
					cmd.Node, h.Edge, cmd.SessionID, cmd.Adapter, other, other)
			}
		}
		return err
	}
	if err := guard(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	err = n.Link.TerminateSession(ctx, cmd.Adapter, cmd.Target, cmd.SessionID)
	if err == nil {
		// The session is gone from that node: its next run may go anywhere.
		h.reg.ForgetSession(cmd.Adapter, cmd.SessionID, n.ID)
	}
	if domain.CodeOf(err) == domain.CodeSessionNotFound {
		// Not on that node: no run of it goes there for it, but where it
		// runs, if elsewhere, is still to be remembered or recalled.
		h.reg.unbindSession(cmd.Adapter, cmd.SessionID, n.ID)
		msg := fmt.Sprintf("node %q keeps no session %q of adapter %q", n.ID, cmd.SessionID, cmd.Adapter)
		if at, ok := h.reg.visibleSessionNode(domain.PrincipalFrom(ctx), cmd.Adapter, cmd.SessionID); ok && at != n.ID {
			msg += fmt.Sprintf("; it runs on node %q: name that node", at)
		}
		return domain.Errorf(domain.CodeSessionNotFound, "%s", msg)
	}
	return err
}

// otherEdge names the edge, other than this one, that recorded the newest
// run a node took of cmd's session, when that run was on cmd.Node: edges
// sharing a history reach only their own nodes. "" when there is none, or
// the history cannot say.
func (h *TerminateSessionHandler) otherEdge(ctx context.Context, cmd TerminateSession) string {
	ctx, cancel := context.WithTimeout(ctx, sessionRecallTimeout)
	defer cancel()
	page, err := h.Sessions.ListRuns(ctx, domain.RunQuery{Adapter: cmd.Adapter, Session: cmd.SessionID, Took: true, Limit: 1})
	if err != nil || len(page.Runs) == 0 {
		return ""
	}
	if r := page.Runs[0]; r.Node == cmd.Node && byOtherEdge(r.Edge, h.Edge) {
		return r.Edge
	}
	return ""
}
