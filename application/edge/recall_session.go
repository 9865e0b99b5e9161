package edge

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"iop/domain"
	"iop/ports"
)

// Bounds of a session's recall from the history: how long the run waits
// for it, and how many of the session's runs are read per query.
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
// ran the session's runs in the history (recallOwners): a caller whose key
// is not among them is refused (a session the history knows no run of a
// node took, or only the anonymous caller's, is the caller's). A history
// that answers in a way no owner can be told from is as one that fails. The caller then claims the session — an admin key only
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
		keys, byAdmins, err := g.recallOwners(ctx, adapter, session)
		if err != nil {
			if !admin {
				g.log.Warn("session's owner not recalled from the history; the run is refused", "adapter", adapter, "session", session, "key", p.Name, "err", err)
				return undo, domain.Errorf(domain.CodeHistoryUnavailable, "session %q of adapter %q: the edge's history, which says whose it is, cannot be read now; retry later", session, adapter)
			}
			g.log.Warn("session's node and owner not recalled from the history; the run is placed afresh", "adapter", adapter, "session", session, "err", err)
			return undo, nil
		}
		if !admin && len(keys) > 0 && !slices.Contains(keys, p.Name) {
			return undo, errSessionNotYours(adapter, session)
		}
		// An admin claims a session nobody owns, or one that admin keys
		// alone ran and it is among: never a key's, nor another admin's.
		ownedByOther = len(keys) > 0 && !(byAdmins && slices.Contains(keys, p.Name))
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

// recallOwners returns the owners of a session the history holds runs of:
// the keys that ran its runs a node took (a refused run claims nothing),
// leaving out the anonymous caller of an edge that had no keys then. Those
// are the keys without the admin scope among its 8 newest such runs, or,
// if none, of its newest such run by a key without the admin scope; or,
// when no key without the admin scope ever ran it, the admin keys that
// did (byAdmins): an admin owns a session it started, but using another
// key's session, however often, does not make it the admin's. No keys
// means that no key ran the session (the history holds no run of it a
// node took, or only the anonymous caller's): it is the first key's to
// use. The session is bound besides, unless it is already, to the node of
// its newest run a node took.
//
// The history is asked for the runs a node took, so that refused runs
// (a caller retrying on at_capacity) hide neither the owner nor the node;
// then, while it has found only admin keys and there are more runs, for
// runs by keys it has not seen yet — one more query per admin key found.
func (g sessionGuard) recallOwners(ctx context.Context, adapter, session string) (keys []string, byAdmins bool, err error) {
	q := domain.RunQuery{Adapter: adapter, Session: session, Took: true, Limit: sessionRecallRuns}
	page, err := g.hist.ListRuns(ctx, q)
	if err != nil {
		return nil, false, err
	}
	g.recall(ctx, adapter, session, page.Runs)
	seen := []string{"", domain.AnonymousName} // keys that own nothing, then admins seen
	var admins []string
	for {
		excluded := len(seen)
		for _, r := range page.Runs {
			if !tookSession(r) || slices.Contains(seen, r.Key) || slices.Contains(keys, r.Key) {
				continue
			}
			if g.admin != nil && g.admin(r.Key) {
				seen = append(seen, r.Key)
				admins = append(admins, r.Key)
				continue
			}
			keys = append(keys, r.Key)
		}
		if len(keys) > 0 {
			return keys, false, nil
		}
		if page.Next == "" {
			// Every run a node took is by an admin or the anonymous
			// caller: those admins own it.
			return admins, len(admins) > 0, nil
		}
		// Older runs remain: look past the admins seen so far. Each query
		// either finds a key without the admin scope, or an admin key not
		// seen yet, or the end.
		if q.ExcludeKeys != nil && len(seen) == excluded {
			return nil, false, errors.New("the history answered runs of keys the query left out")
		}
		q.ExcludeKeys = slices.Clone(seen)
		if page, err = g.hist.ListRuns(ctx, q); err != nil {
			return nil, false, err
		}
	}
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
// session where it was. The history is asked for such runs only; this
// checks its answer again.
func tookSession(r domain.RunRecord) bool { return r.Took() }
