package bootstrap

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/fx/fxtest"
)

// The store's size is read from the file the store uses, whatever form its
// DSN takes (a file: URI with escapes too); it read 0 for those.
func TestStoreSizerReadsTheStoresFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "sp ace.db"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dsn := range []string{filepath.Join(dir, "sp ace.db"), "file:" + filepath.Join(dir, "sp%20ace.db") + "?mode=rwc"} {
		if size := storeSizer(dsn); size == nil || size() != 4096 {
			t.Errorf("storeSizer(%q) did not read the 4096-byte file", dsn)
		}
	}
	if storeSizer("file::memory:?cache=shared") != nil {
		t.Error("an in-memory store has a size")
	}
}

// A store the node cannot write (read-only), or one that is not SQLite (a
// PostgreSQL URL, whose password must not be echoed), is refused at start
// with a plain reason.
func TestNodeStoreMustBeAWritableSQLiteFile(t *testing.T) {
	dir := t.TempDir()
	for dsn, want := range map[string]string{
		"file:" + filepath.Join(dir, "n.db") + "?mode=ro": "cannot be read-only",
		"postgres://iop:s3cret@db/iop":                    "an SQLite file",
		"POSTGRESQL://iop:s3cret@db/iop":                  "an SQLite file",
	} {
		_, err := openNodeDB(fxtest.NewLifecycle(t), NodeSettings{DB: dsn}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("openNodeDB(%q) = %v, want an error saying %q", dsn, err, want)
		}
	}
}
