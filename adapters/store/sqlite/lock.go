package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"iop/adapters/store/internal/dbfile"
)

// Lock is an exclusive hold on a database file, taken by LockFile.
type Lock struct {
	f *os.File
}

// LockedError is LockFile's answer when another process holds the lock.
type LockedError struct {
	Path string // the database file, as the DSN names it
	PID  int    // the holder, as it wrote itself into the lock file; 0 if unknown
}

func (e *LockedError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("%s is in use by another process (pid %d)", e.Path, e.PID)
	}
	return fmt.Sprintf("%s is in use by another process", e.Path)
}

// LockFileFor returns the lock file of a database file: next to it, so one
// lock covers every name of the file that shares its directory's path, and
// not the database itself, whose POSIX locks belong to SQLite (a second
// lock on the same file could interfere with them on network file systems).
func LockFileFor(dbPath string) string { return dbPath + ".lock" }

// ResolvedFilePath is the database file dsn names with every symlink on the
// way followed, whether or not the file exists yet ("" for an in-memory
// database): the file LockFile locks, and the name to keep anything else
// that belongs to the database next to (a node's child-process record), so
// that two names of one database never stand for two.
func ResolvedFilePath(dsn string) string {
	p := FilePath(dsn)
	if p == "" {
		return ""
	}
	return dbfile.Resolve(p)
}

// LockFile takes an exclusive lock on the database file dsn names, for the
// life of the returned Lock (or of the process: the kernel drops it when the
// process dies, so a crash leaves nothing to clean up). A process that
// finds the lock held gets a *LockedError naming the holder's pid: SQLite
// lets two processes share a database, but a node's store is also a record
// of which runs and child processes are its own, which a second node on it
// would take for a crashed predecessor's and end.
//
// An in-memory database is private to its process: it gets a nil Lock.
func LockFile(dsn string) (*Lock, error) {
	path := FilePath(dsn)
	if path == "" {
		return nil, nil
	}
	// The file a symlink names is the one that must not be shared, and it
	// is the same file before SQLite creates it as after: resolved only
	// once it existed, the first node locked <link>.lock and a second one,
	// started later, <target>.lock.
	target := ResolvedFilePath(dsn)
	f, err := os.OpenFile(LockFileFor(target), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, cannotOpen(target, err)
	}
	if err := flock(f); err != nil {
		_ = f.Close()
		if errors.Is(err, errLockHeld) {
			return nil, &LockedError{Path: path, PID: lockHolder(LockFileFor(target))}
		}
		return nil, fmt.Errorf("lock %s: %w", LockFileFor(target), err)
	}
	// The pid is only for the message another process prints; the lock
	// itself is the kernel's.
	if f.Truncate(0) == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Release gives the lock up. The lock file stays: removing it would let a
// process that opened it just before lock a file no one else will ever
// open again. Nil-safe and idempotent.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	// Cleared while still held, so no later reader takes this pid for the
	// holder of a lock it is not.
	_ = l.f.Truncate(0)
	err := l.f.Close()
	l.f = nil
	return err
}

// lockHolder reads the pid the holder wrote into the lock file (0 if none
// yet: it may have locked but not written).
func lockHolder(lockPath string) int {
	b, err := os.ReadFile(lockPath)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// cannotOpen words why the database file path cannot be opened, given the
// error of opening a file in its directory (nil when SQLite failed with
// SQLITE_CANTOPEN, which says no more than that; modernc's driver even
// adds "out of memory", which it is not).
func cannotOpen(path string, err error) error {
	var why string
	var errno syscall.Errno
	switch {
	case err == nil:
		why = whyCannotOpen(path)
	case errors.Is(err, fs.ErrNotExist):
		why = "directory " + filepath.Dir(path) + " does not exist"
	case errors.As(err, &errno) && errno == syscall.ENOTDIR:
		why = filepath.Dir(path) + " is not a directory"
	case errors.As(err, &errno):
		why = errno.Error() // "permission denied", "read-only file system"
	default:
		why = err.Error()
	}
	return fmt.Errorf("cannot open database file %s: %s", path, why)
}

// whyCannotOpen looks at path and its directory for the reason SQLite could
// not open it.
func whyCannotOpen(path string) string {
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return "directory " + dir + " does not exist"
	} else if err != nil {
		return err.Error()
	} else if !fi.IsDir() {
		return dir + " is not a directory"
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "it does not exist and was not created in " + dir
	case err != nil:
		return err.Error()
	case fi.IsDir():
		return "it is a directory"
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return errno.Error()
		}
		return err.Error()
	}
	_ = f.Close()
	return "SQLite cannot open it (SQLITE_CANTOPEN)"
}

// openError is Open's error for a database it could not open or set up:
// SQLITE_CANTOPEN is worded by cannotOpen, since the driver's text alone
// ("unable to open database file: out of memory (14)") names neither the
// file nor the reason.
func openError(dsn string, err error) error {
	if p := FilePath(dsn); p != "" && isCantOpen(err) {
		return cannotOpen(p, nil)
	}
	return fmt.Errorf("open sqlite %s: %w", dsn, err)
}

// privateError is Open's error for a database whose files could not be
// made private (dbfile.Private): failing to create the file is worded by
// cannotOpen like SQLite's own failure; a file that cannot be narrowed keeps
// its message, which names the chmod that fixes it.
func privateError(dsn string, err error) error {
	var pe *fs.PathError
	// Private creates the file a symlink names (dbfile.Resolve).
	if p := FilePath(dsn); p != "" && errors.As(err, &pe) && pe.Op == "open" && (pe.Path == p || pe.Path == dbfile.Resolve(p)) {
		return cannotOpen(pe.Path, err)
	}
	return fmt.Errorf("open sqlite: %w", err)
}

// sqliteCantOpen is SQLITE_CANTOPEN, the primary code in the low byte of
// any of its extended codes.
const sqliteCantOpen = 14

// isCantOpen reports whether err is the driver's SQLITE_CANTOPEN.
func isCantOpen(err error) bool {
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == sqliteCantOpen
}
