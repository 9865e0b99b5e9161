package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"

	"iop/adapters/store/internal/sqlprep"
)

// OpenPostgres opens the node's stores on a PostgreSQL database (dsn is a
// postgres:// URL) with the same tables and queries as on SQLite: only the
// opener differs. The node uses SQLite; this keeps its SQL portable, and
// the store contract suite runs on both.
func OpenPostgres(ctx context.Context, dsn string) (*DB, error) {
	sqldb := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn), pgdriver.WithTimeout(10*time.Second)))
	db := &DB{bun: bun.NewDB(sqldb, pgdialect.New()), postgres: true, stmts: sqlprep.Cache{DB: sqldb}}
	if err := db.createSchema(ctx); err != nil {
		_ = db.bun.Close()
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	return db, nil
}
