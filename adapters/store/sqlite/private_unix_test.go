//go:build unix

package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"iop/adapters/store/sqlite"
)

// filesOf lists the database's files that exist, with their modes.
func filesOf(t *testing.T, path string) map[string]os.FileMode {
	t.Helper()
	out := map[string]os.FileMode{}
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		if fi, err := os.Stat(f); err == nil {
			out[f] = fi.Mode().Perm()
		}
	}
	return out
}

// Under the usual umask 022 SQLite would create the database, and so its
// -wal and -shm, 0644: every user of the machine could read the node's
// chats, runs and agent session ids. A new database is the owner's alone,
// and an existing one open to others is narrowed and reported.
func TestOpenKeepsDatabaseFilesPrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "iop.db")
	dsn := "file:" + path + "?cache=shared&mode=rwc"

	db := open(t, dsn)
	if len(db.Narrowed()) != 0 {
		t.Errorf("a new database reported narrowed files: %v", db.Narrowed())
	}
	files := filesOf(t, path)
	if len(files) != 3 {
		t.Fatalf("want the database, -wal and -shm open; have %v", files)
	}
	for f, m := range files {
		if m != 0o600 {
			t.Errorf("%s created %04o, want 0600", f, m)
		}
	}

	// A database an earlier version left open to others, with its -wal and
	// -shm (db stays open so they exist).
	for f := range files {
		if err := os.Chmod(f, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	db2, err := sqlite.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	got := slices.Sorted(slices.Values(db2.Narrowed()))
	want := []string{path, path + "-shm", path + "-wal"}
	if !slices.Equal(got, want) {
		t.Errorf("Narrowed() = %v, want %v", got, want)
	}
	for f, m := range filesOf(t, path) {
		if m != 0o600 {
			t.Errorf("%s left %04o, want 0600", f, m)
		}
	}
}

// A database whose schema cannot be written leaves no empty file behind,
// which the next start would refuse as truncated.
func TestFailedOpenLeavesNoEmptyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "iop.db")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if db, err := sqlite.Open(ctx, "file:"+path+"?mode=rwc"); err == nil {
		db.Close()
		t.Skip("a cancelled context did not stop Open")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("a failed Open left %s: %v", path, err)
	}
}
