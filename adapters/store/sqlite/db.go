// Package sqlite implements the node's stores (ports.RunStore,
// ports.ChatSessionStore, ports.AgentSessionStore) with bun on SQLite.
package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/driver/sqliteshim"

	"iop/adapters/store/internal/dbfile"
	"iop/adapters/store/internal/reclaim"
	"iop/adapters/store/internal/sqlprep"
)

// DefaultDSN is the database the node opens when no flag or config names one.
const DefaultDSN = "file:iop.db?cache=shared&mode=rwc"

// DB is an open node database with its schema in place. It is safe for
// concurrent use; the stores built on it share its single connection.
type DB struct {
	bun      *bun.DB
	postgres bool // opened by OpenPostgres
	stmts    sqlprep.Cache
	runs     unfinished  // SQLite only
	group    groupCommit // SQLite only: the run store's writes
	narrowed []string    // files Open made private, for the caller to log
	pruner   pruner      // StartPruning's goroutine
}

// Open opens the SQLite database named by dsn and creates any missing tables
// and indexes. Existing data is kept. The database's files are the owner's
// alone (0600): a new one is created so, an existing one narrowed (see
// Narrowed).
//
// The pool holds exactly one connection. SQLite allows one writer at a time
// anyway, and with several connections a read-then-write transaction (as in
// UpdateRun) can fail with SQLITE_BUSY on the lock upgrade without ever
// waiting for busy_timeout, while with cache=shared (the default DSN) the
// failure is SQLITE_LOCKED, which busy_timeout does not cover at all. One
// connection turns all of that into ordinary queueing inside database/sql.
// It also keeps a ":memory:" database alive for the life of the DB.
func Open(ctx context.Context, dsn string) (*DB, error) {
	if dsn == "" {
		return nil, errors.New("open sqlite: empty dsn")
	}
	if err := checkNotTruncated(dsn); err != nil {
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	created, narrowed, err := dbfile.Private(dsn)
	if err != nil {
		return nil, privateError(dsn, err)
	}
	sqlprep.HoldAllocatorPages()
	sqldb := sql.OpenDB(&connector{dsn: dsn, drv: sqliteshim.Driver(), pragmas: pragmasFor(dsn)})
	sqldb.SetMaxOpenConns(1)
	sqldb.SetMaxIdleConns(1)
	sqldb.SetConnMaxLifetime(0)
	sqldb.SetConnMaxIdleTime(0)

	db := &DB{bun: bun.NewDB(sqldb, sqlitedialect.New()), stmts: sqlprep.Cache{DB: sqldb}, narrowed: narrowed}
	if err := db.createSchema(ctx); err != nil {
		_ = db.bun.Close()
		if created {
			// Left empty, the file would be refused as truncated next time.
			dbfile.Undo(dsn)
		}
		return nil, openError(dsn, err)
	}
	return db, nil
}

// Narrowed lists the files of an existing database that group or others
// could read and Open made the owner's alone.
func (db *DB) Narrowed() []string { return db.narrowed }

// Close stops pruning (StartPruning) and closes the database; stores
// built on it stop working.
func (db *DB) Close() error {
	db.StopPruning()
	db.stmts.Close()
	return db.bun.Close()
}

// pragmasFor returns the per-connection settings. busy_timeout and
// foreign_keys are per connection, so they are applied by the connector
// rather than once after opening: a connection database/sql replaces after a
// driver.ErrBadConn gets them too. WAL (persistent in the file) lets readers
// in other processes, such as the sqlite3 shell, work while the node writes;
// synchronous=NORMAL is the usual companion of WAL: it cannot corrupt the
// database, only lose the last commits on power loss.
func pragmasFor(dsn string) []string {
	p := []string{"PRAGMA busy_timeout = 5000", "PRAGMA foreign_keys = ON"}
	if !isMemoryDSN(dsn) {
		// reclaim.Pragma takes effect only on a new file, before anything
		// is written to it (so before WAL), and lets the pages a prune
		// frees be given back (Reclaim). It writes, so a read-only
		// connection (the sqlite3 shell's, a test's) goes without.
		if !dbfile.ReadOnly(dsn) {
			p = append(p, reclaim.Pragma)
		}
		p = append(p, "PRAGMA journal_mode = WAL", "PRAGMA synchronous = NORMAL")
	}
	return p
}

// Reclaim gives the pages a prune freed back to the file system, so the
// file shrinks, and returns the bytes given back: nothing on PostgreSQL, in
// memory, or on a file made before the store set incremental auto-vacuum
// (see package reclaim).
func (db *DB) Reclaim(ctx context.Context) (int64, error) {
	if db.postgres {
		return 0, nil
	}
	return reclaim.Free(ctx, db.stmts.DB)
}

func isMemoryDSN(dsn string) bool {
	return strings.Contains(dsn, ":memory:") || strings.Contains(dsn, "mode=memory")
}

func (db *DB) createSchema(ctx context.Context) error {
	return db.bun.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		hadChatSessions, err := hasTable(ctx, tx, "chat_sessions")
		if err != nil {
			return err
		}
		for _, model := range []any{(*runRow)(nil), (*chatMessageRow)(nil), (*agentSessionRow)(nil), (*chatSessionRow)(nil)} {
			if _, err := tx.NewCreateTable().Model(model).IfNotExists().Exec(ctx); err != nil {
				return fmt.Errorf("create table: %w", err)
			}
		}
		if err := addColumns(ctx, tx, "agent_sessions", agentSessionColumns, nil); err != nil {
			return err
		}
		if err := addColumns(ctx, tx, "chat_messages", chatMessageColumns, chatMessageBackfill); err != nil {
			return err
		}
		if !hadChatSessions {
			// Once, for the sessions of a database made before the table.
			if _, err := tx.ExecContext(ctx, fillChatSessionsSQL); err != nil {
				return fmt.Errorf("fill chat_sessions: %w", err)
			}
		}
		indexes := []struct {
			model   any
			name    string
			columns []string
		}{
			{(*runRow)(nil), "runs_created_at_idx", []string{"created_at"}},
			{(*runRow)(nil), "runs_status_idx", []string{"status"}},
			// session_list's pages of each adapter, newest first (sessionPage).
			{(*chatSessionRow)(nil), "chat_sessions_used_idx", []string{"adapter", "last_used", "session_id"}},
			{(*agentSessionRow)(nil), "agent_sessions_used_idx", []string{"adapter", "updated_at", "session_id"}},
		}
		for _, ix := range indexes {
			if _, err := tx.NewCreateIndex().Model(ix.model).Index(ix.name).Column(ix.columns...).IfNotExists().Exec(ctx); err != nil {
				return fmt.Errorf("create index %s: %w", ix.name, err)
			}
		}
		return nil
	})
}

// connector opens connections through the sqliteshim driver and applies the
// pragmas to each new one before database/sql hands it out.
type connector struct {
	dsn     string
	drv     driver.Driver
	pragmas []string
}

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	for _, p := range c.pragmas {
		if err := execConn(ctx, conn, p); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	return conn, nil
}

func (c *connector) Driver() driver.Driver { return c.drv }

func execConn(ctx context.Context, conn driver.Conn, query string) error {
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		return fmt.Errorf("driver %T cannot execute statements directly", conn)
	}
	_, err := ex.ExecContext(ctx, query, nil)
	return err
}
