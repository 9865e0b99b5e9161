package memory

import (
	"context"
	"slices"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

type agentSession struct {
	agentID   string
	target    string
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
func (s *AgentSessionStore) GetAgentSession(_ context.Context, adapter, sessionID string) (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.sessions[sessionKey{adapter, sessionID}]
	return a.agentID, ok, nil
}

// PutAgentSession stores or replaces the mapping for the session.
func (s *AgentSessionStore) PutAgentSession(_ context.Context, adapter, target, sessionID, agentID string) error {
	now := storedTime(time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sessions[sessionKey{adapter, sessionID}] = agentSession{agentID: agentID, target: target, updatedAt: now}
	return nil
}

// DeleteAgentSession removes the mapping; deleting an unknown one is not an error.
func (s *AgentSessionStore) DeleteAgentSession(_ context.Context, adapter, sessionID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, sessionKey{adapter, sessionID})
	return nil
}

// ListAgentSessions describes the stored mappings of adapter ("" means every
// adapter), ordered by adapter and session id. LastUsed is the last Put.
func (s *AgentSessionStore) ListAgentSessions(_ context.Context, adapter string) ([]domain.SessionInfo, error) {
	s.mu.Lock()
	out := []domain.SessionInfo{}
	for k, a := range s.sessions {
		if adapter == "" || k.adapter == adapter {
			out = append(out, domain.SessionInfo{
				Adapter: k.adapter, Target: a.target, SessionID: k.sessionID, LastUsed: a.updatedAt, AgentSessionID: a.agentID,
			})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, compareSessions)
	return out, nil
}
