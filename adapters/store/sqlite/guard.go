package sqlite

import (
	"fmt"
	"os"

	"iop/adapters/store/internal/dbfile"
)

// FilePath returns the database file a DSN names ("" for an in-memory one).
// It understands plain paths and "file:" URIs with or without parameters.
func FilePath(dsn string) string { return dbfile.Path(dsn) }

// ReadOnly reports whether dsn opens its database read-only (mode=ro).
func ReadOnly(dsn string) bool { return dbfile.ReadOnly(dsn) }

// checkNotTruncated refuses a database file that exists but is empty. SQLite
// writes its header as soon as it creates a database, so an empty file is
// one that something truncated: opening it would silently start a new,
// empty store and lose every run record.
func checkNotTruncated(dsn string) error {
	p := FilePath(dsn)
	if p == "" {
		return nil
	}
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > 0 {
		return nil
	}
	return fmt.Errorf("database file %s is empty (0 bytes): it was truncated, so its run records are gone; "+
		"restore it from a backup, or delete it (and its -wal and -shm files) to start with an empty store", p)
}
