package edge

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"iop/domain"
	"iop/ports"
)

// Bounds of a session's recall from the history: how long the run waits
// for it, and how many of the session's newest runs are looked at.
const (
	sessionRecallTimeout = 2 * time.Second
	sessionRecallRuns    = 8
)

// sessionGuard decides whether a caller may use a session, and recalls
// from the history the node and owner of a session the edge does not
// remember.
//
// A session belongs to the API key that first used it: session ids are
// strings callers choose, so without this a key that guessed another's id
// would continue that key's conversation on its node (the node replays the
// chat's history to the model, or resumes the agent) or end it. The edge
// is the boundary: nodes key sessions by adapter and session id only.
// A key with the admin scope (the anonymous caller of an edge without keys
// among them) may use any session, and owns those it started: it claims a
// session no other key owns. On an edge without keys every caller is the
// one anonymous admin, so nothing is refused.
type sessionGuard struct {
	reg *Registry
	// hist, if set, is the history a session's node and owner are
	// recalled from when the edge does not remember them.
	hist ports.HistoryReader
	log  *slog.Logger
	// admin, if set, reports whether a key name holds the admin scope: its
	// runs in the history make it a session's owner only when no other
	// key's do (see owners).
	admin func(key string) bool
}

// errSessionNotYours refuses a session another key owns. It names neither
// that key nor its node.
func errSessionNotYours(adapter, session string) error {
	return domain.Errorf(domain.CodeForbidden, "session %q of adapter %q belongs to another API key", session, adapter)
}

// use lets the caller in ctx use session of adapter, or refuses it
// (forbidden) when the session is another key's. The owner is the one
// the edge remembers; for a session it remembers none for, the keys that
// ran the session's newest runs in the history (owners): a caller whose
// key is not among them is refused (a session the history knows no run of
// is the caller's). The caller then claims the session — an admin key only
// if no key without the admin scope owns it, as an admin may use any
// session but takes none from its owner. A history that fails refuses a
// caller without the admin scope, as the owner is unknown; an admin's run
// then only loses the recall of its node and claims nothing.
//
// recallNode asks, besides, for a session bound to no node in memory to be
// bound to the node of its newest run in the history that a node took, so
// that its next turn still goes where its history lives (a chat's
// messages, an agent's resume id) although this edge restarted, forgot
// the session among 10,000 more recent ones, or never saw it (another edge
// sharing the history's database ran it). Whenever the history is read the
// node it names is recalled, as the run has waited for it anyway.
//
// With claim, a key without the admin scope claims a session no key owns;
// undo gives the claim back, for a run that was then refused (a claim
// stands once a run of the session is admitted: RememberSession). Without
// claim (ending a session) the caller is only checked. undo is never nil.
func (g sessionGuard) use(ctx context.Context, adapter, session string, recallNode, claim bool) (undo func(), err error) {
	undo = func() {}
	if session == "" {
		return undo, nil
	}
	p := domain.PrincipalFrom(ctx)
	admin := p.Allows(domain.ScopeAdmin)
	owner, known := g.reg.sessionOwner(adapter, session)
	if owner != "" {
		if admin || owner == p.Name {
			return undo, nil
		}
		return undo, errSessionNotYours(adapter, session)
	}
	// Whose it is must be known to let a key in, and to let an admin claim
	// it; a run of an unremembered session also recalls its node. The
	// anonymous admin of an edge without keys is every caller: it claims
	// nothing, and the history is asked only for the node.
	anonymous := p.Name == domain.AnonymousName
	needOwner := !admin || (claim && !anonymous)
	ownedByOther := false // the history names an owner that is not this admin
	if g.hist != nil && (needOwner || (recallNode && !known)) {
		ctx, cancel := context.WithTimeout(ctx, sessionRecallTimeout)
		defer cancel()
		page, err := g.hist.ListRuns(ctx, domain.RunQuery{Adapter: adapter, Session: session, Limit: sessionRecallRuns})
		if err != nil {
			if !admin {
				g.log.Warn("session's owner not recalled from the history; the run is refused", "adapter", adapter, "session", session, "key", p.Name, "err", err)
				return undo, domain.Errorf(domain.CodeHistoryUnavailable, "session %q of adapter %q: the edge's history, which says whose it is, cannot be read now; retry later", session, adapter)
			}
			g.log.Warn("session's node and owner not recalled from the history; the run is placed afresh", "adapter", adapter, "session", session, "err", err)
			return undo, nil
		}
		whole := len(page.Runs) < sessionRecallRuns
		keys, byAdmins := g.owners(page.Runs, whole)
		if !admin && len(keys) > 0 && !slices.Contains(keys, p.Name) {
			return undo, errSessionNotYours(adapter, session)
		}
		// An admin claims a session nobody owns, or one that admin keys
		// started and it is among: never a key's, nor another admin's, nor
		// one whose first run is beyond the window (whose it is unknown).
		ownedByOther = (len(keys) > 0 && !(byAdmins && slices.Contains(keys, p.Name))) || (!whole && len(keys) == 0)
		g.recall(ctx, adapter, session, page.Runs)
	}
	if !claim || (admin && (ownedByOther || anonymous)) {
		return undo, nil
	}
	if !g.reg.claimSession(adapter, session, p.Name) {
		if admin {
			return undo, nil // claimed by a key meanwhile: the admin uses it
		}
		return undo, errSessionNotYours(adapter, session)
	}
	return func() { g.reg.unclaimSession(adapter, session, p.Name) }, nil
}

// owners are the keys that ran the runs (newest first) of a session the
// history holds, as its owner is recalled from them: runs a node took
// (tookSession: a refused run claims nothing), by keys that may own a
// session — not the anonymous caller of an edge that had no keys then.
// Keys with the admin scope count only when no other key ran the session
// and the runs are all of it (whole: fewer than the recall reads), so
// they include its first: an admin owns a session it started, but using
// another key's session, however often, does not make it the admin's.
func (g sessionGuard) owners(runs []domain.RunRecord, whole bool) (keys []string, byAdmins bool) {
	var admins []string
	for _, r := range runs {
		if r.Key == "" || r.Key == domain.AnonymousName || !tookSession(r) {
			continue
		}
		if g.admin != nil && g.admin(r.Key) {
			admins = append(admins, r.Key)
			continue
		}
		keys = append(keys, r.Key)
	}
	if len(keys) == 0 && whole && len(admins) > 0 {
		return admins, true
	}
	return keys, false
}

// recall binds session of adapter, unless it is bound already, to the node
// of its newest run among runs (newest first) that a node took.
func (g sessionGuard) recall(ctx context.Context, adapter, session string, runs []domain.RunRecord) {
	for _, r := range runs {
		if tookSession(r) {
			g.reg.recallSession(adapter, session, r.Node)
			if g.log.Enabled(ctx, slog.LevelDebug) {
				g.log.Debug("session's node recalled from the history", "adapter", adapter, "session", session, "node", r.Node, "run", r.ID)
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
