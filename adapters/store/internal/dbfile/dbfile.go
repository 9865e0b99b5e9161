// Package dbfile keeps an SQLite database's files private to the user the
// process runs as. SQLite creates a database with mode 0644 (less the umask)
// and gives its -wal, -shm and -journal files the database's mode, so under
// the usual umask 022 every user of the machine could read the node's chat
// conversations, runs and agent session ids, and the edge's run history.
package dbfile

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Path returns the database file a DSN names, "" for an in-memory database.
// A plain path is taken as it is, less a "?…" the driver strips; a "file:"
// URI as SQLite reads one: the path ends at '?' or '#', may follow an empty
// or "localhost" authority, and is percent-decoded.
func Path(dsn string) string {
	if dsn == "" || strings.Contains(dsn, ":memory:") {
		return ""
	}
	rest, uri := strings.CutPrefix(dsn, "file:")
	if !uri {
		p, _, _ := strings.Cut(dsn, "?")
		return p
	}
	p, query, _ := strings.Cut(rest, "?")
	p, _, _ = strings.Cut(p, "#")
	if v, err := url.ParseQuery(query); err == nil && v.Get("mode") == "memory" {
		return ""
	}
	if a, ok := strings.CutPrefix(p, "//"); ok {
		host, path, _ := strings.Cut(a, "/")
		if host != "" && host != "localhost" {
			return "" // SQLite refuses a URI with another host
		}
		p = "/" + path
	}
	if d, err := url.PathUnescape(p); err == nil {
		p = d
	}
	return p
}

// maxLinks bounds the symlinks Resolve follows: Linux's own bound for one
// path lookup (MAXSYMLINKS), so a chain the kernel would open is followed
// to its end and a loop still ends.
const maxLinks = 40

// Resolve returns the file path names once every symlink on the way is
// followed: those of its directories and, as long as it is one, the link
// it ends in — whether or not the file that link names exists yet. That
// is the file SQLite opens (it follows a link to a missing file and creates
// the file there) and puts its -wal and -shm files next to, so what belongs
// to the database (its lock, its mode, the node's child-process record) is
// decided by this name, not by the name the DSN happens to use.
// filepath.EvalSymlinks alone fails on a link to a file not created yet.
//
// A path whose directory does not exist is returned with what was resolved
// so far: nothing can be created there, and opening it fails with a reason.
func Resolve(path string) string {
	p := filepath.Clean(path)
	for range maxLinks {
		dir, err := filepath.EvalSymlinks(filepath.Dir(p))
		if err != nil {
			return p
		}
		p = filepath.Join(dir, filepath.Base(p))
		target, err := os.Readlink(p)
		if err != nil {
			return p // not a link (or not there yet): the file itself
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(dir, target)
		}
		p = target
	}
	return p // a loop: SQLite cannot open it either
}

// mayCreate reports whether opening dsn creates a missing database: always,
// unless a "file:" URI says mode=ro or mode=rw.
func mayCreate(dsn string) bool {
	m := uriMode(dsn)
	return m != "ro" && m != "rw"
}

// ReadOnly reports whether dsn opens its database read-only (a "file:" URI
// with mode=ro): settings that write, even to an empty database, fail there.
func ReadOnly(dsn string) bool { return uriMode(dsn) == "ro" }

// uriMode is the mode parameter of a "file:" URI dsn ("" if none).
func uriMode(dsn string) string {
	rest, uri := strings.CutPrefix(dsn, "file:")
	if !uri {
		return ""
	}
	_, query, _ := strings.Cut(rest, "?")
	query, _, _ = strings.Cut(query, "#")
	v, err := url.ParseQuery(query)
	if err != nil {
		return ""
	}
	return v.Get("mode")
}

// Private prepares the files of the database dsn names before SQLite opens
// it. A missing database is created empty with mode 0600, so that SQLite,
// which then gives its -wal and -shm files that mode, never writes a byte
// of it where others could read it. An existing database and its -wal, -shm
// and -journal files that group or others may access are narrowed to the
// owner's bits; narrowed lists them for the caller to log. A file that
// cannot be narrowed is an error, naming the chmod that fixes it: secrets
// must not stay readable just because the store started.
//
// created tells whether Private made the file; if opening the database then
// fails, Undo removes it again so a later start does not take it for a
// truncated one.
func Private(dsn string) (created bool, narrowed []string, err error) {
	p := Path(dsn)
	if p == "" || runtime.GOOS == "windows" {
		return false, nil, nil
	}
	// The file a symlink names, so that one to a database not created yet
	// is created 0600 too (O_EXCL refuses to follow the link, and SQLite
	// would create it with its default mode) and the -wal and -shm files
	// SQLite keeps next to the target are the ones narrowed.
	p = Resolve(p)
	if mayCreate(dsn) {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		switch {
		case err == nil:
			if err := f.Close(); err != nil {
				return false, nil, err
			}
			return true, nil, nil
		case !errors.Is(err, fs.ErrExist):
			return false, nil, err
		}
	}
	for _, f := range []string{p, p + "-wal", p + "-shm", p + "-journal"} {
		fi, err := os.Stat(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return false, narrowed, err
		}
		perm := fi.Mode().Perm()
		if !fi.Mode().IsRegular() || perm&0o077 == 0 {
			continue
		}
		if err := os.Chmod(f, perm&0o700); err != nil {
			return false, narrowed, fmt.Errorf("%s is readable by other users (%04o) and could not be narrowed (chmod 600 %s): %w", f, perm, f, err)
		}
		narrowed = append(narrowed, f)
	}
	return false, narrowed, nil
}

// Undo removes the database file Private created for dsn if it is still
// empty: SQLite wrote nothing to it.
func Undo(dsn string) {
	p := Path(dsn)
	if p == "" {
		return
	}
	p = Resolve(p) // the file Private created, not a link to it
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
		_ = os.Remove(p)
	}
}
