package reclaim_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/uptrace/bun/driver/sqliteshim"

	"iop/adapters/store/internal/reclaim"
)

// fill opens a new WAL file at path (with the pragma when incremental),
// writes ≈ 20 MB to it and deletes it all again.
func fill(t *testing.T, path string, incremental bool) *sql.DB {
	t.Helper()
	db, err := sql.Open(sqliteshim.ShimName, "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	qs := []string{"PRAGMA journal_mode = WAL", "CREATE TABLE t (x TEXT)"}
	if incremental {
		qs = append([]string{reclaim.Pragma}, qs...)
	}
	for _, q := range qs {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(q, err)
		}
	}
	big := strings.Repeat("x", 10_000)
	for range 2000 {
		if _, err := db.Exec("INSERT INTO t VALUES (?)", big); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec("DELETE FROM t WHERE rowid > 100"); err != nil {
		t.Fatal(err)
	}
	return db
}

func size(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// The pages a delete freed go back to the file system, many statements'
// worth (more than one step), and what is left still reads.
func TestFreeShrinksTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	db := fill(t, path, true)
	got, err := reclaim.Free(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if got < 15<<20 {
		t.Fatalf("Free gave back %d bytes, want the ≈ 19 MB deleted", got)
	}
	if s := size(t, path); s > 3<<20 {
		t.Fatalf("file is %d bytes after Free, want about the 100 rows kept (1 MB)", s)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM t WHERE length(x) = 10000").Scan(&n); err != nil || n != 100 {
		t.Fatalf("rows kept: %d, %v", n, err)
	}
	if got, err := reclaim.Free(context.Background(), db); err != nil || got != 0 {
		t.Fatalf("second Free = %d, %v; want nothing left to give", got, err)
	}
}

// A file made without incremental auto-vacuum (before the stores set the
// pragma) is left as it is: switching it takes a VACUUM of the whole file.
func TestFreeLeavesAFileWithoutIncrementalVacuum(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	db := fill(t, path, false)
	if _, err := db.Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		t.Fatal(err)
	}
	before := size(t, path)
	// The pragma on an existing file changes nothing by itself.
	if _, err := db.Exec(reclaim.Pragma); err != nil {
		t.Fatal(err)
	}
	got, err := reclaim.Free(context.Background(), db)
	if err != nil || got != 0 {
		t.Fatalf("Free = %d, %v; want 0, nil", got, err)
	}
	if s := size(t, path); s != before {
		t.Fatalf("file went from %d to %d bytes", before, s)
	}
}
