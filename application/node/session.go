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
// sessions answer session_unsupported rather than pretending to succeed. A
// session neither the adapter keeps nor a run in flight uses is
// session_not_found; one whose only run was stopped (its first turn, not
// yet stored) is ended. A session whose run in flight started on an
// adapter a refresh has since removed, renamed or given a type without
// sessions is ended on that run's instance: the run is stopped and what
// the session stored forgotten, as before the refresh.
func (h *SessionHandler) TerminateSession(ctx context.Context, adapter, target, sessionID string) error {
	in, ok := h.rt.lookup(adapter)
	if !ok || !keepsSessions(in) {
		if r := h.runs.sessionRun(adapter, sessionID); r != nil && keepsSessions(r) {
			in, ok = r, true
		}
	}
	if !ok {
		return domain.Errorf(domain.CodeAdapterNotFound, "adapter %q is not configured on this node", adapter)
	}
	if !keepsSessions(in) {
		return domain.Errorf(domain.CodeSessionUnsupported, "adapter %q (%s) does not keep sessions", adapter, in.cfg.Type)
	}
	st := in.adapter.(ports.SessionTerminator)
	release, stopped, err := h.runs.endSession(ctx, adapter, sessionID)
	if err != nil {
		return err
	}
	defer release()
	err = st.TerminateSession(ctx, target, sessionID)
	if domain.CodeOf(err) == domain.CodeSessionNotFound {
		if stopped {
			return nil
		}
		return domain.Errorf(domain.CodeSessionNotFound, "adapter %q on this node has no session %q", adapter, sessionID)
	}
	return err
}

// keepsSessions reports whether in's adapter keeps sessions and can end
// them.
func keepsSessions(in *instance) bool {
	_, ok := in.adapter.(ports.SessionTerminator)
	return ok && in.caps.Sessions
}

// ListSessions returns the page q asks for of the sessions of adapter
// ("" means every session-keeping adapter), in listing order
// (domain.SessionKey) across adapters, and whether more follow it. Each
// adapter is asked for one more than the page holds, so the page is
// merged from the adapters' own pages: no adapter's whole list is read.
// An adapter the node lacks is adapter_not_found.
func (h *SessionHandler) ListSessions(ctx context.Context, adapter string, q domain.SessionQuery) (page []domain.SessionInfo, more bool, err error) {
	limit := q.PageLimit()
	ask := domain.SessionQuery{Limit: limit + 1, After: q.After}
	found := false
	var all []domain.SessionInfo
	for _, in := range h.rt.instances() {
		if adapter != "" && in.cfg.Name != adapter {
			continue
		}
		found = true
		sl, ok := in.adapter.(ports.SessionLister)
		if !ok {
			continue
		}
		ss, err := sl.ListSessions(ctx, ask)
		if err != nil {
			return nil, false, err
		}
		for _, s := range ss {
			s.Adapter = in.cfg.Name
			all = append(all, s)
		}
	}
	if adapter != "" && !found {
		return nil, false, domain.Errorf(domain.CodeAdapterNotFound, "adapter %q is not configured on this node", adapter)
	}
	// In order and after the cursor whatever an adapter returned.
	all = domain.PageSessions(all, ask)
	if len(all) > limit {
		return all[:limit], true, nil
	}
	return all, false, nil
}
