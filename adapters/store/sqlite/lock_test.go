package sqlite_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"iop/adapters/store/sqlite"
)

// One process at a time holds a database file's lock; the next one is told
// who holds it, and takes it once it is released.
func TestLockFileIsExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	dsn := "file:" + path + "?cache=shared&mode=rwc"
	if err := os.WriteFile(path, []byte("SQLite format 3\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	first, err := sqlite.LockFile(dsn)
	if err != nil || first == nil {
		t.Fatalf("first lock: %v %v", first, err)
	}
	// Another name for the same file is the same lock.
	for _, other := range []string{path, "file:" + path} {
		_, err = sqlite.LockFile(other)
		var held *sqlite.LockedError
		if !errors.As(err, &held) || held.PID != os.Getpid() || held.Path != path {
			t.Fatalf("LockFile(%q) while held: %v, want a LockedError naming %s and pid %d", other, err, path, os.Getpid())
		}
	}
	link := filepath.Join(t.TempDir(), "link.db")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, err := sqlite.LockFile(link); !errors.As(err, new(*sqlite.LockedError)) {
		t.Fatalf("LockFile through a symlink while held: %v, want a LockedError", err)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	again, err := sqlite.LockFile(dsn)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	_ = again.Release()
}

func TestLockFileOfMemoryDatabaseIsNil(t *testing.T) {
	for _, dsn := range []string{":memory:", "file::memory:?cache=shared", "file:x?mode=memory"} {
		l, err := sqlite.LockFile(dsn)
		if l != nil || err != nil {
			t.Errorf("LockFile(%q) = %v, %v; want nil, nil", dsn, l, err)
		}
		if err := l.Release(); err != nil {
			t.Errorf("Release of a nil lock: %v", err)
		}
	}
}

// A database that cannot be opened is named with the reason, by the lock
// and by Open alike, not with the driver's "out of memory (14)".
func TestCannotOpenSaysWhy(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	isDir := filepath.Join(dir, "isdir.db")
	if err := os.Mkdir(isDir, 0o700); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "no", "such", "x.db")
	cases := []struct {
		name, path, want string
		lockToo          bool
	}{
		{"missing directory", missing, "cannot open database file " + missing + ": directory " + filepath.Dir(missing) + " does not exist", true},
		{"parent is a file", filepath.Join(notDir, "x.db"), "cannot open database file " + filepath.Join(notDir, "x.db") + ": " + notDir + " is not a directory", true},
		{"a directory", isDir, "cannot open database file " + isDir + ": it is a directory", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dsn := "file:" + tc.path + "?cache=shared&mode=rwc"
			if db, err := sqlite.Open(context.Background(), dsn); err == nil || err.Error() != tc.want {
				if db != nil {
					_ = db.Close()
				}
				t.Errorf("Open: %v\nwant %s", err, tc.want)
			}
			if !tc.lockToo {
				return
			}
			if _, err := sqlite.LockFile(dsn); err == nil || err.Error() != tc.want {
				t.Errorf("LockFile: %v\nwant %s", err, tc.want)
			}
		})
	}
}

// A DSN that is a symlink to a database not created yet is locked as the
// file it names, before and after that file exists: resolving only an
// existing target, the first node locked <link>.lock and, once its store
// had created the target, a second node resolved the link, locked
// <target>.lock — another file — and took the store (and killed the
// first node's children).
func TestLockFileFollowsDanglingSymlink(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "iop.db")
	if err := os.Symlink(filepath.Join(dir, "data", "real.db"), link); err != nil {
		t.Fatal(err)
	}
	dsn := "file:" + link + "?cache=shared&mode=rwc"
	first, err := sqlite.LockFile(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release()
	db, err := sqlite.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := os.Stat(filepath.Join(dir, "data", "real.db")); err != nil {
		t.Fatalf("the store did not create the link's target: %v", err)
	}
	second, err := sqlite.LockFile(dsn)
	if !errors.As(err, new(*sqlite.LockedError)) {
		_ = second.Release()
		t.Fatalf("second LockFile once the target exists: %v, want a LockedError", err)
	}
}
