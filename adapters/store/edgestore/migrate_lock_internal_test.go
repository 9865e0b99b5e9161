package edgestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/uptrace/bun/driver/pgdriver"

	"iop/adapters/store/pgtest"
)

// holdMigrationLock takes the migration lock on a connection of its own,
// as another edge migrating the database does; release gives it back.
func holdMigrationLock(t *testing.T, dsn string) (conn *sql.Conn, release func()) {
	t.Helper()
	ctx := context.Background()
	sqldb := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn), pgdriver.WithTimeout(30*time.Second)))
	t.Cleanup(func() { _ = sqldb.Close() })
	conn, err := sqldb.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SELECT pg_advisory_lock(%d)", int64(migrationLock))); err != nil {
		t.Fatal(err)
	}
	return conn, func() {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", int64(migrationLock))); err != nil {
			t.Fatal(err)
		}
	}
}

// An edge whose migration waits for another edge's (two edges starting
// together on one fresh database, the first one slow) waits past its
// connection's read timeout, and migrates once the lock is free. The wait
// used to be one blocked statement, cut off by the read timeout:
// "migration lock: read tcp …: i/o timeout".
func TestPostgresMigrationWaitsForTheLockPastTheReadTimeout(t *testing.T) {
	const readTimeout = 250 * time.Millisecond
	dsn := pgtest.DSN(t)
	conn, release := holdMigrationLock(t, dsn)

	type opened struct {
		db  *DB
		err error
	}
	done := make(chan opened, 1)
	go func() {
		db, err := Open(context.Background(), dsn+"&read_timeout="+readTimeout.String())
		done <- opened{db, err}
	}()
	// Open is at the lock once its session has asked for it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := conn.QueryRowContext(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND query LIKE '%advisory_xact_lock%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Open never asked for the migration lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The other edge's migration goes on for several read timeouts.
	time.Sleep(4 * readTimeout)
	select {
	case o := <-done:
		t.Fatalf("Open returned while another edge held the migration lock: %v", o.err)
	default:
	}
	release()
	o := <-done
	if o.err != nil {
		t.Fatalf("Open after the lock was released: %v", o.err)
	}
	defer o.db.Close()
	var version int
	if err := o.db.bun.NewSelect().Table("edge_schema_migrations").ColumnExpr("max(version)").Scan(context.Background(), &version); err != nil || version != Version() {
		t.Fatalf("schema version %d, %v; want %d", version, err, Version())
	}
}

// An edge gives up waiting for the migration lock when its context ends,
// saying what it waited for.
func TestPostgresMigrationLockWaitEnds(t *testing.T) {
	dsn := pgtest.DSN(t)
	holdMigrationLock(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	db, err := Open(ctx, dsn)
	if err == nil {
		_ = db.Close()
		t.Fatal("Open succeeded while another edge held the migration lock")
	}
	if !strings.Contains(err.Error(), "migration lock: another edge sharing the database held it") {
		t.Fatalf("Open = %v, want the wait for another edge's migration named", err)
	}
}

// A migration statement that takes longer than the connection's read
// timeout (an index built over a large history: its answer comes only at
// its end) completes: the migrations run on a connection without one,
// bounded by the migration's minute. Here the index build waits for a lock
// that another session holds for several read timeouts; it used to fail
// with "migration 3: read tcp …: i/o timeout", and the edge could not start.
func TestPostgresSlowMigrationOutlastsTheReadTimeout(t *testing.T) {
	slowMigration(t, "&read_timeout=250ms")
}

// Nor does the connection's statement_timeout cut it off (the reads' pool,
// whose connection the migrations take, has one a second past the read
// bound): the migration's transaction sets its own, its minute's.
func TestPostgresSlowMigrationOutlastsTheStatementTimeout(t *testing.T) {
	slowMigration(t, "&statement_timeout=250")
}

// slowMigration opens the store with dsn's suffix while migration 3's
// index build waits on a lock for a second, and checks that it migrated.
func slowMigration(t *testing.T, suffix string) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	db, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	// Back to version 2, and a session whose open transaction keeps
	// edge_runs from being indexed until it ends.
	other := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn), pgdriver.WithTimeout(30*time.Second)))
	t.Cleanup(func() { _ = other.Close() })
	for _, s := range []string{"DROP INDEX edge_runs_live_idx", "DELETE FROM edge_schema_migrations WHERE version = 3"} {
		if _, err := other.ExecContext(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "LOCK TABLE edge_runs IN ROW EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	type opened struct {
		db  *DB
		err error
	}
	done := make(chan opened, 1)
	go func() {
		db, err := Open(ctx, dsn+suffix)
		done <- opened{db, err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := other.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE 'CREATE INDEX edge_runs_live_idx%' AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		select {
		case o := <-done:
			t.Fatalf("Open returned before its index build waited: %v", o.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the index build never waited for the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Second) // four times the timeout the DSN sets
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("Open (DSN %s) with a migration slower than that timeout: %v", suffix, o.err)
	}
	defer o.db.Close()
	var version int
	if err := o.db.bun.NewSelect().Table("edge_schema_migrations").ColumnExpr("max(version)").Scan(ctx, &version); err != nil || version != Version() {
		t.Fatalf("schema version %d, %v; want %d", version, err, Version())
	}
}

// A migration waiting for a lock another session holds on a table (an
// edge of the older release reading the history while this one starts)
// gives way now and then, so the writes queued behind its wait (that
// edge's history batches) go through meanwhile, and it migrates once the
// lock is free. Its wait held them up as long as the other session's read
// (up to 30 s, past a batch's 5 s), and a read that itself waited for one
// of them held the migration up until its minute ran out.
func TestPostgresMigrationWaitingForALockLetsWritesThrough(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	atSchema3(t, dsn) // migration 4 alters edge_tunnels
	other, reader := readingTunnels(t, dsn)
	var n int

	type opened struct {
		db  *DB
		err error
	}
	done := make(chan opened, 1)
	go func() {
		db, err := Open(ctx, dsn)
		done <- opened{db, err}
	}()
	for {
		if err := other.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE 'ALTER TABLE edge_tunnels%' AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		select {
		case o := <-done:
			t.Fatalf("Open returned before its migration waited for the lock: %v", o.err)
		default:
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Another edge writes a tunnel while the migration waits; the reader
	// goes on until that write is done.
	if _, err := other.ExecContext(ctx, "INSERT INTO edge_tunnels (id, edge_id, node, provider, model, path, key_name, status, error_code, body_bytes, "+
		"prompt_tokens, completion_tokens, total_tokens, cost_usd, started_us, finished_us) "+
		"VALUES ('tun_other', 'e2', 'n1', 'p1', 'm', '/v1/chat/completions', 'k', 200, '', 10, 1, 2, 3, 0, 1, 2)"); err != nil {
		t.Fatalf("the other edge's write: %v", err)
	}
	if err := reader.Commit(); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("Open once the lock was free: %v", o.err)
	}
	defer o.db.Close()
	var version, tunnels int
	if err := o.db.bun.NewSelect().Table("edge_schema_migrations").ColumnExpr("max(version)").Scan(ctx, &version); err != nil || version != Version() {
		t.Fatalf("schema version %d, %v; want %d", version, err, Version())
	}
	if err := o.db.bun.NewSelect().Table("edge_tunnels").ColumnExpr("count(*)").Where("id = 'tun_other'").Scan(ctx, &tunnels); err != nil || tunnels != 1 {
		t.Fatalf("the other edge's tunnel: %d, %v; want it kept", tunnels, err)
	}
}

// A migration that never gets the lock another session holds says so when
// its time is up, whichever way its last try ended: that try's statements
// are bounded by what is left of the time, under lock_timeout, so it ends
// on the statement timeout rather than the lock's.
func TestPostgresMigrationOutwaitedByALockSaysSo(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	atSchema3(t, dsn)
	readingTunnels(t, dsn)
	short, cancel := context.WithTimeout(ctx, 5*time.Second) // two tries and the start of a third
	defer cancel()
	if db, err := Open(short, dsn); err == nil || !strings.Contains(err.Error(), "another session held a lock on the history's tables") {
		if db != nil {
			_ = db.Close()
		}
		t.Fatalf("Open while a reader holds edge_tunnels: %v, want the held lock named", err)
	}
}

// atSchema3 opens a new history at dsn and takes it back to schema 3, as an
// edge before migration 4 (edge_tunnels.response_id) left it.
func atSchema3(t *testing.T, dsn string) {
	t.Helper()
	ctx := context.Background()
	db, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range schema3 {
		if _, err := db.bun.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// schema3 takes a history back from the latest schema to 3.
var schema3 = []string{
	"DROP INDEX edge_tunnels_usage_of_idx",
	"ALTER TABLE edge_tunnels DROP COLUMN usage_of",
	"DELETE FROM edge_schema_migrations WHERE version = 5",
	"DROP INDEX edge_tunnels_response_idx",
	"ALTER TABLE edge_tunnels DROP COLUMN response_id",
	"DELETE FROM edge_schema_migrations WHERE version = 4",
}

// readingTunnels is a session of its own holding edge_tunnels read, its
// transaction open: an edge of the older release reading the history.
func readingTunnels(t *testing.T, dsn string) (*sql.DB, *sql.Tx) {
	t.Helper()
	ctx := context.Background()
	other := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn), pgdriver.WithTimeout(120*time.Second)))
	t.Cleanup(func() { _ = other.Close() })
	reader, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Rollback() })
	var n int
	if err := reader.QueryRowContext(ctx, "SELECT count(*) FROM edge_tunnels").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return other, reader
}

// The wait's end that falls while a try of the lock is on its way (the
// driver cuts the try off: "driver: bad connection") is the wait for the
// other edge ended, and says so; it read "migration lock: driver: bad
// connection", naming neither. A try that fails before any found the lock
// held says what the driver said.
func TestMigrationLockWaitEndingMidTryIsNamed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tries := 0
	err := waitMigrationLock(ctx, func(context.Context) (bool, error) {
		if tries++; tries < 3 {
			return false, nil // held by another edge
		}
		cancel() // the edge's minute ends with this try on its way
		return false, driver.ErrBadConn
	})
	if err == nil || !strings.Contains(err.Error(), "another edge sharing the database held it") || !errors.Is(err, context.Canceled) {
		t.Fatalf("wait = %v, want the wait for another edge's migration named, with the context's end", err)
	}

	err = waitMigrationLock(context.Background(), func(context.Context) (bool, error) { return false, driver.ErrBadConn })
	if err == nil || strings.Contains(err.Error(), "another edge") || !errors.Is(err, driver.ErrBadConn) {
		t.Fatalf("first try failing = %v, want the driver's error as it is", err)
	}
}
