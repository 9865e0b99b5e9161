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
	n, err := h.reg.resolve(domain.PrincipalFrom(ctx), cmd.Node)
	if err != nil {
		return err
	}
	// Only the session's key (or an admin) may end it.
	log := h.Log
	if log == nil {
		log = slog.Default()
	}
	if _, err := (sessionGuard{h.reg, h.Sessions, log, h.AdminKey}).use(ctx, cmd.Adapter, cmd.SessionID, false, false); err != nil {
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
