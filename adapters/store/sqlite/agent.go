package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"iop/domain"
	"iop/ports"
)

// AgentSessionStore maps run session ids to CLI agent session ids in SQLite.
type AgentSessionStore struct {
	db *bun.DB
}

var _ ports.AgentSessionStore = (*AgentSessionStore)(nil)

// NewAgentSessionStore returns an AgentSessionStore on db.
func NewAgentSessionStore(db *DB) *AgentSessionStore {
	return &AgentSessionStore{db: db.bun}
}

type agentSessionRow struct {
	bun.BaseModel `bun:"table:agent_sessions"`

	Adapter   string    `bun:"adapter,pk"`
	SessionID string    `bun:"session_id,pk"`
	AgentID   string    `bun:"agent_id,notnull"`
	Target    string    `bun:"target,notnull"`
	UpdatedAt time.Time `bun:"updated_at,notnull"`
}

// GetAgentSession returns the agent session id stored for the session; ok is
// false, with a nil error, when there is none.
func (s *AgentSessionStore) GetAgentSession(ctx context.Context, adapter, sessionID string) (string, bool, error) {
	row := new(agentSessionRow)
	err := s.db.NewSelect().Model(row).Where("adapter = ? AND session_id = ?", adapter, sessionID).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("select agent session %s/%s: %w", adapter, sessionID, err)
	}
	return row.AgentID, true, nil
}

// PutAgentSession stores or replaces the mapping for the session.
func (s *AgentSessionStore) PutAgentSession(ctx context.Context, adapter, target, sessionID, agentID string) error {
	row := &agentSessionRow{Adapter: adapter, SessionID: sessionID, AgentID: agentID, Target: target, UpdatedAt: time.Now().UTC()}
	_, err := s.db.NewInsert().Model(row).
		On("CONFLICT (adapter, session_id) DO UPDATE").
		Set("agent_id = EXCLUDED.agent_id").
		Set("target = EXCLUDED.target").
		Set("updated_at = EXCLUDED.updated_at").
		Exec(ctx)
	if err != nil {
		return fmt.Errorf("upsert agent session %s/%s: %w", adapter, sessionID, err)
	}
	return nil
}

// DeleteAgentSession removes the mapping; deleting an unknown one is not an error.
func (s *AgentSessionStore) DeleteAgentSession(ctx context.Context, adapter, sessionID string) error {
	_, err := s.db.NewDelete().Model((*agentSessionRow)(nil)).
		Where("adapter = ? AND session_id = ?", adapter, sessionID).
		Exec(ctx)
	if err != nil {
		return fmt.Errorf("delete agent session %s/%s: %w", adapter, sessionID, err)
	}
	return nil
}

// ListAgentSessions describes the stored mappings of adapter ("" means every
// adapter), ordered by adapter and session id. LastUsed is the last Put.
func (s *AgentSessionStore) ListAgentSessions(ctx context.Context, adapter string) ([]domain.SessionInfo, error) {
	var rows []agentSessionRow
	q := s.db.NewSelect().Model(&rows).Order("adapter", "session_id")
	if adapter != "" {
		q = q.Where("adapter = ?", adapter)
	}
	if err := q.Scan(ctx); err != nil {
		return nil, fmt.Errorf("select agent sessions: %w", err)
	}
	out := make([]domain.SessionInfo, len(rows))
	for i, r := range rows {
		out[i] = domain.SessionInfo{
			Adapter: r.Adapter, Target: r.Target, SessionID: r.SessionID,
			LastUsed: r.UpdatedAt.UTC(), AgentSessionID: r.AgentID,
		}
	}
	return out, nil
}
