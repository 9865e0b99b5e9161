package memory

import (
	"context"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

type agentSession struct {
	agentID   string
	target    string
	turns     int
	totals    domain.AgentTotals
	updatedAt time.Time
}

// AgentSessionStore is a map-backed ports.AgentSessionStore.
type AgentSessionStore struct {
	mu       sync.Mutex
	sessions map[sessionKey]agentSession
}

var _ ports.AgentSessionStore = (*AgentSessionStore)(nil)

// NewAgentSessionStore returns an empty AgentSessionStore.
func NewAgentSessionStore() *AgentSessionStore {
	return &AgentSessionStore{sessions: map[sessionKey]agentSession{}}
}

// GetAgentSession returns the agent session id stored for the session; ok is
// false, with a nil error, when there is none.
func (s *AgentSessionStore) GetAgentSession(_ context.Context, adapter, sessionID string) (domain.AgentSession, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.sessions[sessionKey{adapter, sessionID}]
	if !ok {
		return domain.AgentSession{}, false, nil
	}
	return domain.AgentSession{AgentID: a.agentID, Turns: a.turns, Totals: a.totals}, true, nil
}

// PutAgentSession stores or replaces the mapping for the session, keeping
// its turn count; a new agent id restarts the totals.
func (s *AgentSessionStore) PutAgentSession(_ context.Context, adapter, target, sessionID, agentID string) error {
	now := storedTime(time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sessionKey{adapter, sessionID}
	old := s.sessions[k]
	a := agentSession{agentID: agentID, target: target, turns: old.turns, updatedAt: now}
	if old.agentID == agentID {
		a.totals = old.totals
	}
	s.sessions[k] = a
	return nil
}

// EndAgentTurn counts a completed turn and keeps the totals.
func (s *AgentSessionStore) EndAgentTurn(_ context.Context, adapter, sessionID string, totals domain.AgentTotals) error {
	now := storedTime(time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sessionKey{adapter, sessionID}
	a, ok := s.sessions[k]
	if !ok {
		return nil
	}
	a.turns++
	a.totals = totals
	a.updatedAt = now
	s.sessions[k] = a
	return nil
}

// DeleteAgentSession removes the mapping and reports whether there was
// one; deleting an unknown one is not an error.
func (s *AgentSessionStore) DeleteAgentSession(_ context.Context, adapter, sessionID string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sessionKey{adapter, sessionID}
	_, found := s.sessions[k]
	delete(s.sessions, k)
	return found, nil
}

// ListAgentSessions returns the page q asks for of the stored mappings of
// adapter ("" means every adapter), newest first (domain.SessionQuery).
// LastUsed is the last Put or EndAgentTurn.
func (s *AgentSessionStore) ListAgentSessions(_ context.Context, adapter string, q domain.SessionQuery) ([]domain.SessionInfo, error) {
	s.mu.Lock()
	out := []domain.SessionInfo{}
	for k, a := range s.sessions {
		if adapter == "" || k.adapter == adapter {
			out = append(out, domain.SessionInfo{
				Adapter: k.adapter, Target: a.target, SessionID: k.sessionID, Turns: a.turns, LastUsed: a.updatedAt, AgentSessionID: a.agentID,
			})
		}
	}
	s.mu.Unlock()
	return domain.PageSessions(out, q), nil
}
