package edgestore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/uptrace/bun/driver/sqliteshim"

	"iop/adapters/store/edgestore"
)

// An edge started while the previous one is still stopping finds its
// history file locked for a moment (the stopping edge's last connection
// checkpoints the WAL and removes it under an exclusive lock). Open waits
// for the lock, as every statement afterwards does (busy_timeout), rather
// than failing the start with "database is locked".
func TestSQLiteOpenWaitsForAFileLockedByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.db")
	db, err := edgestore.Open(context.Background(), path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// Another process's connection holds the file's exclusive lock.
	holder, err := sql.Open(sqliteshim.ShimName, "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	holder.SetMaxOpenConns(1)
	for _, q := range []string{"PRAGMA locking_mode = EXCLUSIVE", "BEGIN EXCLUSIVE", "CREATE TABLE held (x)", "COMMIT"} {
		if _, err := holder.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// It lets go a moment later (well within the 5 s busy_timeout).
	released := make(chan error, 1)
	time.AfterFunc(300*time.Millisecond, func() { released <- holder.Close() })

	db, err = edgestore.Open(context.Background(), path)
	if rerr := <-released; rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatalf("Open of a file another process held for a moment: %v", err)
	}
	_ = db.Close()
}
