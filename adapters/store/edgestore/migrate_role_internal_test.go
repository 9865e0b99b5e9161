package edgestore

import (
	"context"
	"database/sql"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"iop/adapters/store/pgtest"

	"github.com/uptrace/bun/driver/pgdriver"
)

// An edge whose role may only read and write the history's tables (its
// owner migrated the database; PostgreSQL 15 gives no role but the owner
// CREATE on the public schema) starts on a database at its schema and
// records runs. It could not start: CREATE TABLE IF NOT EXISTS needs that
// privilege even when the table exists.
func TestPostgresRoleWithoutCreateStartsOnAMigratedDatabase(t *testing.T) {
	ctx := context.Background()
	_, owner, role, roleDSN := ownerAndRole(t, "dml_")
	execAll(t, owner,
		"CREATE ROLE "+role+" LOGIN",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON edge_runs, edge_tunnels TO "+role,
		"GRANT SELECT ON edge_schema_migrations TO "+role,
	)
	db, err := Open(ctx, roleDSN)
	if err != nil {
		t.Fatalf("Open as a role that may only read and write the tables: %v", err)
	}
	defer db.Close()
	s := &Store{db: db}
	if lost, err := s.writeBatch(ctx, []any{tunnelRow{ID: "tun_1", Path: "/x"}}); lost != 0 {
		t.Fatalf("write as that role: lost %d (%v)", lost, err)
	}
}

// A database another edge release migrated further is refused, saying so.
func TestNewerSchemaIsRefused(t *testing.T) {
	onBothDatabases(t, func(t *testing.T, db *DB) {
		if _, err := db.bun.ExecContext(context.Background(), "INSERT INTO edge_schema_migrations (version, applied_us) VALUES (?, 0)", Version()+1); err != nil {
			t.Fatal(err)
		}
		err := db.migrate(context.Background(), db.bun)
		if err == nil || !strings.Contains(err.Error(), "is newer than this edge knows") {
			t.Fatalf("migrate on a newer schema: %v", err)
		}
	})
}

// An edge whose role may only read and write the history, started on a
// database an older release migrated (schema 3), cannot add what this
// release's schema has (ALTER TABLE needs the table's owner). It refuses to
// start saying which role can migrate, and leaves the database as it was.
// It said only "migration 4: ERROR: must be owner of table edge_tunnels".
func TestPostgresRoleWithoutOwnershipOnAnOlderSchemaSaysWhoMigrates(t *testing.T) {
	ctx := context.Background()
	dsn, owner, role, roleDSN := ownerAndRole(t, "dml_")
	// Back to schema 3, as the release before migration 4 left it.
	execAll(t, owner, append(schema3,
		"INSERT INTO edge_tunnels (id, edge_id, node, provider, model, path, key_name, status, error_code, body_bytes, "+
			"prompt_tokens, completion_tokens, total_tokens, cost_usd, started_us, finished_us) "+
			"VALUES ('tun_old', 'e1', 'n1', 'p1', 'm', '/v1/responses', 'alice', 200, '', 10, 1, 2, 3, 0, 1, 2)",
		"CREATE ROLE "+role+" LOGIN",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON edge_runs, edge_tunnels TO "+role,
		"GRANT SELECT ON edge_schema_migrations TO "+role,
	)...)
	db, err := Open(ctx, roleDSN)
	if err == nil {
		_ = db.Close()
		t.Fatal("Open as a role that may not alter the tables migrated a schema 3 database")
	}
	for _, want := range []string{"from version 3 to " + strconv.Itoa(Version()), "as the role that owns the tables"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	var version, tunnels int
	if err := owner.bun.NewSelect().Table("edge_schema_migrations").ColumnExpr("max(version)").Scan(ctx, &version); err != nil || version != 3 {
		t.Fatalf("schema version after the refused start: %d, %v; want 3", version, err)
	}
	if err := owner.bun.NewSelect().Table("edge_tunnels").ColumnExpr("count(*)").Scan(ctx, &tunnels); err != nil || tunnels != 1 {
		t.Fatalf("tunnels after the refused start: %d, %v; want 1", tunnels, err)
	}
	// The owner's start migrates it; the role's starts then.
	if db, err = Open(ctx, dsn); err != nil {
		t.Fatalf("Open as the owner: %v", err)
	}
	_ = db.Close()
	if db, err = Open(ctx, roleDSN); err != nil {
		t.Fatalf("Open as the role once the owner migrated: %v", err)
	}
	_ = db.Close()
}

// execAll runs stmts on db in order, failing the test at the first that
// fails.
func execAll(t *testing.T, db *DB, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := db.bun.ExecContext(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// ownerAndRole opens the history on a database of its own as its owner
// (closed at the test's end) and names a role for it, prefix and the
// database's name, which the test creates and grants: roleDSN logs in as
// that role.
func ownerAndRole(t *testing.T, prefix string) (dsn string, owner *DB, role, roleDSN string) {
	t.Helper()
	dsn = pgtest.DSN(t)
	owner, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = owner.Close() })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	role = prefix + strings.TrimPrefix(u.Path, "/")
	u.User = url.User(role)
	return dsn, owner, role, u.String()
}

// An edge whose role may not create tables in the schema (PostgreSQL 15
// gives no role but the database's owner CREATE on public), started on an
// empty database, refuses to start naming the privilege it lacks and the
// GRANT that gives it. It said only "create migrations table: ERROR:
// permission denied for schema public".
func TestPostgresRoleWithoutCreateOnAnEmptyDatabaseSaysWhichPrivilege(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	owner := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn)))
	defer owner.Close()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	role := "nocreate_" + strings.TrimPrefix(u.Path, "/")
	u.User = url.User(role)
	for _, q := range []string{"CREATE ROLE " + role + " LOGIN", "REVOKE CREATE ON SCHEMA public FROM PUBLIC"} {
		if _, err := owner.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db, err := Open(ctx, u.String())
	if err == nil {
		_ = db.Close()
		t.Fatal("Open as a role without CREATE on the schema created the history")
	}
	for _, want := range []string{`role "` + role + `"`, `CREATE privilege on schema "public"`, `GRANT CREATE ON SCHEMA "public" TO "` + role + `"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Granted it, the role's edge creates the history.
	if _, err := owner.ExecContext(ctx, "GRANT CREATE ON SCHEMA public TO "+role); err != nil {
		t.Fatal(err)
	}
	if db, err = Open(ctx, u.String()); err != nil {
		t.Fatalf("Open once granted CREATE: %v", err)
	}
	_ = db.Close()
}

// An edge whose role may read the history but not write it refuses to
// start, naming what it lacks and the GRANT that gives it. It started, and
// every history row it wrote was refused and dropped (a warning in the log
// at most): its runs went unrecorded.
func TestPostgresRoleThatMayNotWriteTheHistoryIsRefused(t *testing.T) {
	ctx := context.Background()
	_, owner, role, roleDSN := ownerAndRole(t, "sel_")
	execAll(t, owner,
		"CREATE ROLE "+role+" LOGIN",
		"GRANT SELECT ON edge_runs, edge_tunnels, edge_schema_migrations TO "+role,
		"GRANT INSERT, UPDATE, DELETE ON edge_tunnels TO "+role,
	)
	db, err := Open(ctx, roleDSN)
	if err == nil {
		_ = db.Close()
		t.Fatal("Open as a role that may only read edge_runs started")
	}
	want := `GRANT INSERT, UPDATE, DELETE ON "edge_runs" TO "` + role + `"`
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `role "`+role+`"`) || strings.Contains(err.Error(), "edge_tunnels") {
		t.Fatalf("error %q does not say %q (and only that)", err, want)
	}
	if _, err := owner.bun.ExecContext(ctx, want); err != nil {
		t.Fatal(err)
	}
	if db, err = Open(ctx, roleDSN); err != nil {
		t.Fatalf("Open once granted: %v", err)
	}
	_ = db.Close()
}
