package sqlprep

import (
	"context"
	"database/sql"
	"testing"

	"github.com/uptrace/bun/driver/sqliteshim"
)

func TestCachePreparesOnceAndRetriesAFailure(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open(sqliteshim.ShimName, "file::memory:")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	defer db.Close()
	c := Cache{DB: db}
	defer c.Close()

	const q = "INSERT INTO t (v) VALUES ($1)"
	if _, err := c.Get(ctx, q); err == nil {
		t.Fatal("prepared a statement on a table that does not exist")
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (v INTEGER)"); err != nil {
		t.Fatal(err)
	}
	st, err := c.Get(ctx, q)
	if err != nil {
		t.Fatalf("the failed prepare was not tried again: %v", err)
	}
	if again, _ := c.Get(ctx, q); again != st {
		t.Fatal("the same query was prepared twice")
	}
	if _, err := st.ExecContext(ctx, 7); err != nil {
		t.Fatal(err)
	}
}
