package edgestore

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/uptrace/bun/driver/sqliteshim"
)

// An edge migrating an SQLite history of an older schema while another
// connection to the file is writing (a previous edge still stopping,
// committing its last history batch) waits for that write, then migrates.
// The migration read the applied versions in a deferred transaction and
// only then asked for the write lock: SQLite refused the stale read's
// upgrade at once, busy_timeout or not, and the start failed with
// "migration 4: database is locked (5) (SQLITE_BUSY)".
func TestSQLiteMigrationWaitsForAnotherConnectionsWrite(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "edge.db")
	db, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Back to schema 3, as the release before migration 4 left it.
	for _, q := range schema3 {
		if _, err := db.bun.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	// The other connection is in the middle of a write, which it commits
	// a moment later (well within the 5 s busy_timeout).
	other, err := sql.Open(sqliteshim.ShimName, "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.SetMaxOpenConns(1)
	tx, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO edge_runs (id, edge_id, node, adapter, target, session_id, key_name, background, status, " +
		"created_us, finished_us, error_code, error_message, model, prompt_tokens, completion_tokens, total_tokens, cost_usd, has_usage) " +
		"VALUES ('run_last', 'e1', 'n1', 'exec', 't', '', 'k', false, 'succeeded', 1, 2, '', '', '', 0, 0, 0, 0, false)"); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	time.AfterFunc(300*time.Millisecond, func() { committed <- tx.Commit() })

	// The migration Open runs once it has opened the file.
	err = db.migrate(ctx, db.bun)
	if cerr := <-committed; cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatalf("migrating a schema 3 history while another connection wrote it: %v", err)
	}
	var version, runs int
	if err := db.bun.QueryRowContext(ctx, "SELECT max(version) FROM edge_schema_migrations").Scan(&version); err != nil || version != Version() {
		t.Fatalf("schema version %d, %v; want %d", version, err, Version())
	}
	if err := db.bun.QueryRowContext(ctx, "SELECT count(*) FROM edge_runs WHERE id = 'run_last'").Scan(&runs); err != nil || runs != 1 {
		t.Fatalf("the other connection's run: %d, %v; want it kept", runs, err)
	}
}
