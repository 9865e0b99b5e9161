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

// Resolve names the file a path ends up at, through links in its
// directories and a chain of links at its end, relative or absolute, to a
// file that need not exist yet.
func TestResolve(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	symlink := func(target, name string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	real := filepath.Join(data, "real.db")
	abs := symlink(real, "abs.db")
	rel := symlink("data/real.db", "rel.db")
	chain := symlink("rel.db", "chain.db")
	linkedDir := symlink("data", "linkdir")
	loop := symlink("loop.db", "loop.db")
	cases := []struct{ in, want string }{
		{abs, real},
		{rel, real},
		{chain, real},
		{filepath.Join(linkedDir, "real.db"), real},
		{real, real},
		{filepath.Join(dir, "no", "such", "x.db"), filepath.Join(dir, "no", "such", "x.db")},
		{loop, loop},
	}
	for _, tc := range cases {
		if got := Resolve(tc.in); got != tc.want {
			t.Errorf("Resolve(%s) = %s, want %s (target not created yet)", tc.in, got, tc.want)
		}
	}
	// The same once the file exists, as filepath.EvalSymlinks has it.
	if err := os.WriteFile(real, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{abs, rel, chain, filepath.Join(linkedDir, "real.db")} {
		want, err := filepath.EvalSymlinks(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := Resolve(in); got != want || got != real {
			t.Errorf("Resolve(%s) = %s, want %s", in, got, want)
		}
	}
}

// A database named by a link to a file not created yet is created 0600 as
// the link's target (O_EXCL does not follow the link: SQLite used to create
// the target with its own default mode, readable by every user), and Undo
// removes that file, not the link.
func TestPrivateCreatesTheLinkTarget0600(t *testing.T) {
	umask022(t)
	dir := t.TempDir()
	real := filepath.Join(dir, "real.db")
	link := filepath.Join(dir, "iop.db")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	dsn := "file:" + link + "?cache=shared&mode=rwc"
	created, _, err := Private(dsn)
	if err != nil || !created {
		t.Fatalf("Private = %v, %v; want created", created, err)
	}
	if m := mode(t, real); m != 0o600 {
		t.Errorf("link target mode %04o, want 0600", m)
	}
	Undo(dsn)
	if _, err := os.Stat(real); !os.IsNotExist(err) {
		t.Errorf("Undo left the empty target: %v", err)
	}
	if _, err := os.Lstat(link); err != nil {
		t.Errorf("Undo removed the link: %v", err)
	}
}
