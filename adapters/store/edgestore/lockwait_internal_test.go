package edgestore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"iop/adapters/store/pgtest"
)

// pgdriver cannot cancel a statement, it only closes its socket, so the
// server must bound the store's statements itself or each one given up
// on a lock another session holds leaves a backend behind waiting (one
// more per batch, read or start, until max_connections is reached and the
// database refuses every client).

// lockTable holds an ACCESS EXCLUSIVE lock on table of dsn's database
// until the test ends (on a connection of holder's, closed then).
func lockTable(t *testing.T, holder *DB, table string) {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() { _ = holder.Close() })
	tx, err := holder.bun.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	if _, err := tx.ExecContext(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
}

// lockedStore opens a store on a fresh PostgreSQL database whose table
// another session (holder) locks for the rest of the test.
func lockedStore(t *testing.T, table string) (*Store, *DB) {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	db, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	holder, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	lockTable(t, holder, table)
	return &Store{db: db}, holder
}

// noneWaitOnLocks fails t unless, soon, no backend of the database waits
// on a lock. Without a server-side bound they wait as long as the lock is
// held: the test's end.
func noneWaitOnLocks(t *testing.T, on *DB) {
	t.Helper()
	var waiting int
	for range 200 {
		if err := on.read.QueryRowContext(context.Background(),
			"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%d backends still wait on the lock for statements the store gave up", waiting)
}

func TestPostgresTimedOutWriteEndsOnTheServer(t *testing.T) {
	ctx := context.Background()
	s, holder := lockedStore(t, "edge_tunnels")
	for i := range 3 {
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		lost, err := s.writeBatch(wctx, []any{tunnelRow{ID: fmt.Sprintf("tun_%d", i), Path: "/x"}})
		cancel()
		if lost != 1 {
			t.Fatalf("batch %d under the lock: lost %d (%v), want 1", i, lost, err)
		}
	}
	noneWaitOnLocks(t, holder)
}

// A migration at start given up on a lock ends on the server too: left
// waiting, it would hold the migration lock, and every edge started after
// it would wait for that lock in vain.
func TestPostgresTimedOutMigrationEndsOnTheServer(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	holder, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	// Back to schema 2: migration 3 builds an index on edge_runs.
	for _, q := range []string{"DROP INDEX edge_runs_live_idx", "DELETE FROM edge_schema_migrations WHERE version = 3"} {
		if _, err := holder.bun.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	lockTable(t, holder, "edge_runs")
	octx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = Open(octx, dsn)
	cancel()
	if err == nil {
		t.Fatal("Open migrated under another session's lock")
	}
	noneWaitOnLocks(t, holder)
}

// The reads' connections carry a statement_timeout a second past the
// read bound, unless the DSN sets its own.
func TestPostgresReadsAreBoundOnTheServer(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	for _, c := range []struct{ dsn, want string }{
		{dsn, "31s"},
		{dsn + "&statement_timeout=7000", "7s"},
	} {
		db, err := Open(ctx, c.dsn)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = db.read.QueryRowContext(ctx, "SHOW statement_timeout").Scan(&got)
		_ = db.Close()
		if err != nil || got != c.want {
			t.Fatalf("%s: the reads' statement_timeout is %q (%v), want %q", strings.TrimPrefix(c.dsn, dsn), got, err, c.want)
		}
	}
}

// A history prune given up on a lock ends on the server too: it runs
// hourly, so under a lock held for long each pass left one more backend
// waiting.
func TestPostgresTimedOutPruneEndsOnTheServer(t *testing.T) {
	ctx := context.Background()
	s, holder := lockedStore(t, "edge_runs")
	for i := range 3 {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := s.Prune(pctx, time.Now())
		cancel()
		if err == nil {
			t.Fatalf("prune %d under the lock succeeded", i)
		}
	}
	noneWaitOnLocks(t, holder)
}
