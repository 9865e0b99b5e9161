package node

import (
	"context"

	"iop/domain"
	"iop/ports"
)

// SessionHandler ends logical sessions and lists them.
type SessionHandler struct {
	rt   *Runtime
	runs *RunManager
}

// NewSessionHandler refuses nil dependencies.
func NewSessionHandler(rt *Runtime, runs *RunManager) *SessionHandler {
	if rt == nil || runs == nil {
		panic("node.NewSessionHandler: nil dependency")
	}
	return &SessionHandler{rt: rt, runs: runs}
}

// TerminateSession cancels any run in flight in the session and waits for it
// to stop, then asks the adapter to forget the session; runs of the session
// that arrive meanwhile are refused (session_busy). Adapters without
// sessions answer session_unsupported rather than pretending to succeed.
func (h *SessionHandler) TerminateSession(ctx context.Context, adapter, target, sessionID string) error {
	in, ok := h.rt.lookup(adapter)
	if !ok {
		return domain.Errorf(domain.CodeAdapterNotFound, "adapter %q is not configured on this node", adapter)
	}
	st, ok := in.adapter.(ports.SessionTerminator)
	if !ok || !in.caps.Sessions {
		return domain.Errorf(domain.CodeSessionUnsupported, "adapter %q (%s) does not keep sessions", adapter, in.cfg.Type)
	}
	release, err := h.runs.endSession(ctx, adapter, sessionID)
	if err != nil {
		return err
	}
	defer release()
	return st.TerminateSession(ctx, target, sessionID)
}

// ListSessions returns the sessions of every session-keeping adapter.
func (h *SessionHandler) ListSessions(ctx context.Context) ([]domain.SessionInfo, error) {
	var out []domain.SessionInfo
	for _, in := range h.rt.instances() {
		sl, ok := in.adapter.(ports.SessionLister)
		if !ok {
			continue
		}
		ss, err := sl.ListSessions(ctx)
		if err != nil {
			return nil, err
		}
		for _, s := range ss {
			s.Adapter = in.cfg.Name
			out = append(out, s)
		}
	}
	return out, nil
}
