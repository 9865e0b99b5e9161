package sqlite

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

// stmts holds the prepared statements of the hot paths (a run's insert,
// select by id and update): SQL that bun builds has every value spelled
// into its text, so SQLite would parse and plan each one afresh, and that
// parse was about a fifth of the run store's CPU. These are prepared once
// per connection (the SQLite pool has one) with $N placeholders, which both
// SQLite and PostgreSQL accept, numbered in order of appearance.
type stmts struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

// get returns query prepared, preparing it on first use; a failed prepare is
// retried on the next call.
func (s *stmts) get(ctx context.Context, query string) (*sql.Stmt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.m[query]; ok {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if s.m == nil {
		s.m = map[string]*sql.Stmt{}
	}
	s.m[query] = st
	return st, nil
}

// close closes every statement, before the database itself closes.
func (s *stmts) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.m {
		_ = st.Close()
	}
	s.m = nil
}

// sqliteTime is the text bun writes for a time on SQLite (UTC, microseconds,
// trailing zeros dropped, "+00:00"). The prepared statements write the same
// text, so rows sort by created_at the same whichever path wrote them.
const sqliteTime = "2006-01-02 15:04:05.999999-07:00"

// timeArg is t as a statement argument for the database's dialect; the zero
// time is NULL.
func (db *DB) timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	if db.postgres {
		return t.UTC()
	}
	return t.UTC().Format(sqliteTime)
}
