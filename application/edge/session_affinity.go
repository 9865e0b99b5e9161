package edge

import (
	"container/list"
	"context"
	"fmt"
	"sync"

	"iop/domain"
)

// DefaultSessionAffinity bounds how many sessions the edge remembers the
// node of (least recently used forgotten first).
const DefaultSessionAffinity = 10000

// sessionKey names one logical session as the edge routes it.
type sessionKey struct{ adapter, session string }

type sessionEntry struct {
	key  sessionKey
	node string
	// owner names the API key the session belongs to (see claimSession);
	// empty until a key claims it.
	owner string
	// claims counts owner's runs whose claim waits on their admission
	// (see unclaimSession): while there are any, the claim is tentative.
	// created: the first of those claims made the entry.
	claims  int
	created bool
}

// sessionNodes remembers which node last admitted a run of each session, so
// the session's next turn goes where its history (a chat's messages, a CLI
// agent's resume id) lives: in that node's own store. It holds at most max
// entries, evicting the least recently used. Not safe for concurrent use:
// the Registry guards it with its mutex.
type sessionNodes struct {
	max   int
	order *list.List // of *sessionEntry, most recently used first
	index map[sessionKey]*list.Element
}

func newSessionNodes(max int) *sessionNodes {
	return &sessionNodes{max: max, order: list.New(), index: map[sessionKey]*list.Element{}}
}

// get returns the node of k and marks k used.
func (s *sessionNodes) get(k sessionKey) (string, bool) {
	e, ok := s.index[k]
	if !ok {
		return "", false
	}
	s.order.MoveToFront(e)
	return e.Value.(*sessionEntry).node, true
}

// put records node as k's node, evicting the least recently used entry
// when full. An entry's owner stays as it was.
func (s *sessionNodes) put(k sessionKey, node string) {
	s.add(k).node = node
}

// add returns k's entry, marked used, creating it unbound and unowned if
// k is not remembered (evicting the least recently used entry when full).
// With no room at all (max <= 0) the entry returned is remembered nowhere.
func (s *sessionNodes) add(k sessionKey) *sessionEntry {
	if e, ok := s.index[k]; ok {
		s.order.MoveToFront(e)
		return e.Value.(*sessionEntry)
	}
	se := &sessionEntry{key: k}
	if s.max <= 0 {
		return se
	}
	for s.order.Len() >= s.max {
		last := s.order.Back()
		delete(s.index, last.Value.(*sessionEntry).key)
		s.order.Remove(last)
	}
	s.index[k] = s.order.PushFront(se)
	return se
}

// drop unbinds k if it is node's. The entry stays, bound to no node, so
// that the session is not recalled from the history (where its runs still
// name node) until a run of it is admitted again. A k the edge does not
// remember (it restarted, or forgot k among more recent sessions) gets
// such an entry too: its history may well name node.
func (s *sessionNodes) drop(k sessionKey, node string) {
	e, ok := s.index[k]
	switch {
	case !ok:
		s.put(k, "")
	case e.Value.(*sessionEntry).node == node:
		e.Value.(*sessionEntry).node = ""
	}
}

// dropNode unbinds every session of node, as drop does.
func (s *sessionNodes) dropNode(node string) {
	for e := s.order.Front(); e != nil; e = e.Next() {
		if se := e.Value.(*sessionEntry); se.node == node {
			se.node = ""
		}
	}
}

// moveNode binds every session of node from to node to.
func (s *sessionNodes) moveNode(from, to string) {
	for e := s.order.Front(); e != nil; e = e.Next() {
		if se := e.Value.(*sessionEntry); se.node == from {
			se.node = to
		}
	}
}

func (s *sessionNodes) len() int { return s.order.Len() }

// RememberSession records that node admitted a run of session on adapter:
// the session's next run with no node named goes there while it is
// connected and offers adapter (see PickForTarget).
func (r *Registry) RememberSession(adapter, session, node string) {
	if session == "" {
		return
	}
	r.admitSession(adapter, session, node, domain.Principal{})
}

// admitSession is RememberSession for a run of key, and confirms key's
// claim: the session is key's from now on. A tentative claim of another
// key, made while key's run waited (the edge forgot key's claim among more
// recent sessions), gives way to the run that was admitted. An admin key's
// run (admin) takes no session this way: an admin owns only a session it
// claimed (sessionGuard.use), not one it merely used. Nor does an admin
// limited to some nodes move another key's session bound to a node it may
// not see: its turn went elsewhere only because that node does not exist
// for it, and the owner's next turn still belongs where the session's
// history is.
func (r *Registry) admitSession(adapter, session, node string, p domain.Principal) {
	if session == "" {
		return
	}
	key, admin := p.Name, p.Allows(domain.ScopeAdmin)
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.sessions.add(sessionKey{adapter, session})
	if e.node != "" && e.owner != "" && e.owner != key && !p.SeesNode(e.node) {
		return
	}
	e.node = node
	if key != "" && !admin && (e.owner == "" || e.claims > 0) {
		e.owner = key
	}
	if key != "" && e.owner == key {
		e.created, e.claims = false, 0
	}
}

// ForgetSession drops session's affinity to node (the session was ended
// there); an affinity to another node stays.
func (r *Registry) ForgetSession(adapter, session, node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sessions.drop(sessionKey{adapter, session}, node)
}

// unbindSession unbinds session of adapter if it is bound to node (which
// does not keep it), and remembers nothing of a session it does not know:
// an end refused as session_not_found says nothing of where it runs.
func (r *Registry) unbindSession(adapter, session, node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.sessions.index[sessionKey{adapter, session}]; ok && e.Value.(*sessionEntry).node == node {
		e.Value.(*sessionEntry).node = ""
	}
}

// MoveNodeSessions binds the sessions bound to node from to node to: a
// reload renamed the node (its entry keeps its token under the new id), so
// it registers again as to, with the sessions' histories in its store.
func (r *Registry) MoveNodeSessions(from, to string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sessions.moveNode(from, to)
}

// ForgetNodeSessions drops every session affinity to node (it left the
// config).
func (r *Registry) ForgetNodeSessions(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sessions.dropNode(node)
}

// SessionNode reports the node session of adapter is bound to, if any.
func (r *Registry) SessionNode(adapter, session string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sessions.index[sessionKey{adapter, session}]
	if !ok || e.Value.(*sessionEntry).node == "" {
		return "", false
	}
	return e.Value.(*sessionEntry).node, true
}

// visibleSessionNode is SessionNode for a node caller p may see.
func (r *Registry) visibleSessionNode(p domain.Principal, adapter, session string) (string, bool) {
	node, ok := r.SessionNode(adapter, session)
	if !ok {
		return "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.visible(p)[node]; !seen {
		return "", false
	}
	return node, true
}

// sessionOwner reports the key session of adapter belongs to ("" if no
// key claimed it) and whether the edge remembers the session at all, bound
// to a node or ended (unbound): either way the history has no node to add.
func (r *Registry) sessionOwner(adapter, session string) (owner string, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.sessions.index[sessionKey{adapter, session}]
	if !ok {
		return "", false
	}
	return e.Value.(*sessionEntry).owner, true
}

// claimSession makes session of adapter key's unless another key owns it
// already, and reports whether it is key's now. A session the edge does
// not remember is remembered from now on, bound to no node until a run of
// it is admitted. Checking and claiming under one lock, two keys starting
// the same new session at once cannot both get it.
func (r *Registry) claimSession(adapter, session, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := sessionKey{adapter, session}
	_, existed := r.sessions.index[k]
	e := r.sessions.add(k)
	switch {
	case e.owner == "":
		e.owner, e.created, e.claims = key, !existed, 1
	case e.owner == key && e.claims > 0:
		e.claims++
	}
	return e.owner == key
}

// unclaimSession gives back key's claim on session of adapter made for a
// run that was then refused, unless a run of the session was admitted
// since (RememberSession): a key must not take a session id by sending
// runs of it that never run. An entry the claim made goes too, so that
// the session's node is still recalled from the history.
func (r *Registry) unclaimSession(adapter, session, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := sessionKey{adapter, session}
	el, ok := r.sessions.index[k]
	if !ok {
		return
	}
	e := el.Value.(*sessionEntry)
	if e.owner != key || e.claims == 0 {
		return
	}
	if e.claims--; e.claims > 0 {
		return // another run of key's still waits on the claim
	}
	if e.created && e.node == "" {
		delete(r.sessions.index, k)
		r.sessions.order.Remove(el)
		return
	}
	e.owner, e.created, e.claims = "", false, 0
}

// placement is a run of a session being placed while the session is
// bound to no node: done is closed once the run is admitted or refused;
// waiting counts the session's runs waiting for that.
type placement struct {
	done    chan struct{}
	waiting int
}

// placeSession orders the placing of session's runs with no node named
// while the session is bound to no node that can take them: one run at a
// time is placed, and the next waits until it is admitted (which binds the
// session to its node: the next goes there) or refused. Two first runs of
// a new session sent at once used to land on two nodes, each then holding
// half its history. done ends this run's turn; it is called once its
// placement is settled. Waiting ends with ctx (the caller left).
func (r *Registry) placeSession(ctx context.Context, p domain.Principal, adapter, session string) (done func(), err error) {
	if session == "" {
		return func() {}, nil
	}
	k := sessionKey{adapter, session}
	for {
		r.mu.Lock()
		if r.sessionNode(r.taking(r.visible(p)), adapter, session) != nil {
			r.mu.Unlock()
			return func() {}, nil
		}
		turn := r.placing[k]
		if turn == nil {
			pl := &placement{done: make(chan struct{})}
			r.placing[k] = pl
			r.mu.Unlock()
			return sync.OnceFunc(func() {
				r.mu.Lock()
				delete(r.placing, k)
				r.mu.Unlock()
				close(pl.done)
			}), nil
		}
		turn.waiting++
		r.mu.Unlock()
		select {
		case <-turn.done:
		case <-ctx.Done():
		}
		r.mu.Lock()
		turn.waiting--
		r.mu.Unlock()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", domain.Errorf(domain.CodeCancelled, "the caller left while an earlier run of session %q was being placed", session), ctx.Err())
		}
	}
}

// recallSession binds session of adapter to node unless it is bound
// already (a run admitted meanwhile knows better than the history).
func (r *Registry) recallSession(adapter, session, node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := sessionKey{adapter, session}
	if _, ok := r.sessions.index[k]; !ok {
		r.sessions.put(k, node)
	}
}
