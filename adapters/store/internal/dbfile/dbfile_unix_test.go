//go:build unix

package dbfile

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// umask022 sets the usual umask for the test, under which SQLite's 0644
// default is what others can read.
func umask022(t *testing.T) {
	old := syscall.Umask(0o022)
	t.Cleanup(func() { syscall.Umask(old) })
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestPrivateCreatesAMissingDatabase0600(t *testing.T) {
	umask022(t)
	p := filepath.Join(t.TempDir(), "iop.db")
	created, narrowed, err := Private("file:" + p + "?cache=shared&mode=rwc")
	if err != nil || !created || len(narrowed) != 0 {
		t.Fatalf("Private = %v, %v, %v; want created", created, narrowed, err)
	}
	if m := mode(t, p); m != 0o600 {
		t.Errorf("new database file mode %04o, want 0600", m)
	}
	Undo("file:" + p)
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("Undo left the empty file: %v", err)
	}
}

func TestPrivateNarrowsAnExistingDatabase(t *testing.T) {
	umask022(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "edge.db")
	for _, f := range []string{p, p + "-wal", p + "-shm"} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(p+"-journal", []byte("x"), 0o640); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	created, narrowed, err := Private(p)
	if err != nil || created {
		t.Fatalf("Private = %v, %v", created, err)
	}
	want := []string{p, p + "-wal", p + "-shm", p + "-journal"}
	if !slices.Equal(narrowed, want) {
		t.Errorf("narrowed %v, want %v", narrowed, want)
	}
	for _, f := range want {
		if m := mode(t, f); m != 0o600 {
			t.Errorf("%s mode %04o, want 0600", f, m)
		}
	}
	if m := mode(t, other); m != 0o644 {
		t.Errorf("a file that is not the database's was changed to %04o", m)
	}
	// Private already: nothing to say the second time.
	if _, narrowed, err := Private(p); err != nil || len(narrowed) != 0 {
		t.Errorf("second Private = %v, %v", narrowed, err)
	}
}

// A read-only or read-write (no create) URI does not get a file made for
// it: SQLite would refuse a missing database, and so it still does.
func TestPrivateCreatesNothingForModeRO(t *testing.T) {
	p := filepath.Join(t.TempDir(), "iop.db")
	if created, _, err := Private("file:" + p + "?mode=ro"); err != nil || created {
		t.Fatalf("Private = %v, %v", created, err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("a file was created for mode=ro: %v", err)
	}
}
