//go:build unix

package edgestore_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"iop/adapters/store/edgestore"
)

// The edge's SQLite history (nodes, targets, key names, errors) is created
// 0600 under the usual umask 022, with its -wal and -shm, and an existing
// one open to others is narrowed and reported.
func TestSQLiteFilesArePrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "edge.db")
	db, err := edgestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	files := []string{path, path + "-shm", path + "-wal"}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatalf("want %s while the store is open: %v", f, err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("%s created %04o, want 0600", f, m)
		}
		if err := os.Chmod(f, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	db2, err := edgestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if got := slices.Sorted(slices.Values(db2.Narrowed())); !slices.Equal(got, files) {
		t.Errorf("Narrowed() = %v, want %v", got, files)
	}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("%s left %04o, want 0600", f, m)
		}
	}
}
