package edgestore

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"iop/adapters/store/pgtest"
)

// An edge whose role may only read and write the history's tables (its
// owner migrated the database; PostgreSQL 15 gives no role but the owner
// CREATE on the public schema) starts on a database at its schema and
// records runs. It could not start: CREATE TABLE IF NOT EXISTS needs that
// privilege even when the table exists.
func TestPostgresRoleWithoutCreateStartsOnAMigratedDatabase(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	owner, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	role := "dml_" + strings.TrimPrefix(u.Path, "/")
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON edge_runs, edge_tunnels TO " + role,
		"GRANT SELECT ON edge_schema_migrations TO " + role,
	} {
		if _, err := owner.bun.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	u.User = url.User(role)
	db, err := Open(ctx, u.String())
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
