package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"

	"iop/domain"
	"iop/ports"
)

// AgentSessionStore maps run session ids to CLI agent session ids in SQLite.
type AgentSessionStore struct {
	db  *bun.DB
	raw *DB
}

var _ ports.AgentSessionStore = (*AgentSessionStore)(nil)

// NewAgentSessionStore returns an AgentSessionStore on db.
func NewAgentSessionStore(db *DB) *AgentSessionStore {
	return &AgentSessionStore{db: db.bun, raw: db}
}

type agentSessionRow struct {
	bun.BaseModel `bun:"table:agent_sessions"`

	Adapter   string `bun:"adapter,pk"`
	SessionID string `bun:"session_id,pk"`
	AgentID   string `bun:"agent_id,notnull"`
	Target    string `bun:"target,notnull"`
	Turns     int    `bun:"turns,notnull,default:0"`
	// The agent's running totals as of the last completed turn.
	TotalInput  int64     `bun:"total_input,notnull,default:0"`
	TotalCached int64     `bun:"total_cached,notnull,default:0"`
	TotalOutput int64     `bun:"total_output,notnull,default:0"`
	UpdatedAt   time.Time `bun:"updated_at,notnull"`
}

// agentSessionColumns are the columns added to agent_sessions after its
// first release, with their definitions, for databases created before.
var agentSessionColumns = [][2]string{
	{"turns", "INTEGER NOT NULL DEFAULT 0"},
	{"total_input", "INTEGER NOT NULL DEFAULT 0"},
	{"total_cached", "INTEGER NOT NULL DEFAULT 0"},
	{"total_output", "INTEGER NOT NULL DEFAULT 0"},
}

// addColumns adds to table the columns (name, definition) a database
// created by an older version lacks, and runs each one's backfill
// statement, if any, right after adding it.
func addColumns(ctx context.Context, tx bun.Tx, table string, columns [][2]string, backfill map[string]string) error {
	// The catalog query is the one dialect-specific bit: SQLite's
	// table_info pragma, the information schema elsewhere (PostgreSQL).
	query := "SELECT name FROM pragma_table_info('" + table + "')"
	if tx.Dialect().Name() != dialect.SQLite {
		query = "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = '" + table + "'"
	}
	rows, err := tx.QueryContext(ctx, query)
	if err != nil {
		return fmt.Errorf("read %s columns: %w", table, err)
	}
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return fmt.Errorf("read %s columns: %w", table, err)
		}
		have[name] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s columns: %w", table, err)
	}
	for _, c := range columns {
		if have[c[0]] {
			continue
		}
		if _, err := tx.ExecContext(ctx, "ALTER TABLE "+table+" ADD COLUMN "+c[0]+" "+c[1]); err != nil {
			return fmt.Errorf("add column %s.%s: %w", table, c[0], err)
		}
		if q := backfill[c[0]]; q != "" {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("fill column %s.%s: %w", table, c[0], err)
			}
		}
	}
	return nil
}

// hasTable reports whether the database has table (in the current schema,
// on PostgreSQL).
func hasTable(ctx context.Context, tx bun.Tx, table string) (bool, error) {
	query := "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
	if tx.Dialect().Name() != dialect.SQLite {
		query = "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?"
	}
	var n int
	if err := tx.QueryRowContext(ctx, query, table).Scan(&n); err != nil {
		return false, fmt.Errorf("look up table %s: %w", table, err)
	}
	return n > 0, nil
}

// GetAgentSession returns the agent session id stored for the session; ok is
// false, with a nil error, when there is none.
func (s *AgentSessionStore) GetAgentSession(ctx context.Context, adapter, sessionID string) (domain.AgentSession, bool, error) {
	row := new(agentSessionRow)
	err := s.db.NewSelect().Model(row).Where("adapter = ? AND session_id = ?", adapter, sessionID).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return domain.AgentSession{}, false, nil
	}
	if err != nil {
		return domain.AgentSession{}, false, fmt.Errorf("select agent session %s/%s: %w", adapter, sessionID, err)
	}
	return domain.AgentSession{
		AgentID: row.AgentID, Turns: row.Turns,
		Totals: domain.AgentTotals{Input: row.TotalInput, Cached: row.TotalCached, Output: row.TotalOutput},
	}, true, nil
}

// PutAgentSession stores or replaces the mapping for the session, keeping
// its turn count; a new agent id restarts the totals.
func (s *AgentSessionStore) PutAgentSession(ctx context.Context, adapter, target, sessionID, agentID string) error {
	row := &agentSessionRow{Adapter: adapter, SessionID: sessionID, AgentID: agentID, Target: target, UpdatedAt: time.Now().UTC()}
	_, err := s.db.NewInsert().Model(row).
		On("CONFLICT (adapter, session_id) DO UPDATE").
		Set("total_input = CASE WHEN ?TableAlias.agent_id = EXCLUDED.agent_id THEN ?TableAlias.total_input ELSE 0 END").
		Set("total_cached = CASE WHEN ?TableAlias.agent_id = EXCLUDED.agent_id THEN ?TableAlias.total_cached ELSE 0 END").
		Set("total_output = CASE WHEN ?TableAlias.agent_id = EXCLUDED.agent_id THEN ?TableAlias.total_output ELSE 0 END").
		Set("agent_id = EXCLUDED.agent_id").
		Set("target = EXCLUDED.target").
		Set("updated_at = EXCLUDED.updated_at").
		Exec(ctx)
	if err != nil {
		return fmt.Errorf("upsert agent session %s/%s: %w", adapter, sessionID, err)
	}
	return nil
}

// EndAgentTurn counts a completed turn and keeps the totals.
func (s *AgentSessionStore) EndAgentTurn(ctx context.Context, adapter, sessionID string, totals domain.AgentTotals) error {
	_, err := s.db.NewUpdate().Model((*agentSessionRow)(nil)).
		Set("turns = turns + 1").
		Set("total_input = ?", totals.Input).
		Set("total_cached = ?", totals.Cached).
		Set("total_output = ?", totals.Output).
		Set("updated_at = ?", time.Now().UTC()).
		Where("adapter = ? AND session_id = ?", adapter, sessionID).
		Exec(ctx)
	if err != nil {
		return fmt.Errorf("end turn of agent session %s/%s: %w", adapter, sessionID, err)
	}
	return nil
}

// DeleteAgentSession removes the mapping and reports whether there was
// one; deleting an unknown one is not an error.
func (s *AgentSessionStore) DeleteAgentSession(ctx context.Context, adapter, sessionID string) (bool, error) {
	res, err := s.db.NewDelete().Model((*agentSessionRow)(nil)).
		Where("adapter = ? AND session_id = ?", adapter, sessionID).
		Exec(ctx)
	if err != nil {
		return false, fmt.Errorf("delete agent session %s/%s: %w", adapter, sessionID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("delete agent session %s/%s: %w", adapter, sessionID, err)
	}
	return n > 0, nil
}

// ListAgentSessions returns the page q asks for of the stored mappings of
// adapter ("" means every adapter), newest first (domain.SessionQuery),
// through agent_sessions_used_idx. LastUsed is the last Put or
// EndAgentTurn.
func (s *AgentSessionStore) ListAgentSessions(ctx context.Context, adapter string, q domain.SessionQuery) ([]domain.SessionInfo, error) {
	var rows []agentSessionRow
	if err := s.raw.sessionPage(s.db.NewSelect().Model(&rows), "updated_at", adapter, q).Scan(ctx); err != nil {
		return nil, fmt.Errorf("select agent sessions: %w", err)
	}
	out := make([]domain.SessionInfo, len(rows))
	for i, r := range rows {
		out[i] = domain.SessionInfo{
			Adapter: r.Adapter, Target: r.Target, SessionID: r.SessionID, Turns: r.Turns,
			LastUsed: r.UpdatedAt.UTC(), AgentSessionID: r.AgentID,
		}
	}
	return out, nil
}
