package bootstrap

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"

	"iop/adapters/config"
)

// warnNarrowed says which files of a store were open to other users until
// now: whoever could read them may have read them, which the operator may
// want to know.
func warnNarrowed(log *slog.Logger, store string, files []string) {
	if len(files) > 0 {
		log.Warn(store+" files were readable by other users; narrowed to the owner (0600)", "files", files)
	}
}

// stateDirReady is what a constructor that keeps files in the edge's
// state_dir takes (the history, the node link's auto-mode certificates), so
// the directory is made, and a problem with it reported as such, before
// either touches it, whichever fx builds first.
type stateDirReady struct{}

// newStateDir prepares the edge's state_dir once (see prepareStateDir); it
// is created when the history is an SQLite file there.
func newStateDir(s EdgeSettings, log *slog.Logger) (stateDirReady, error) {
	return stateDirReady{}, prepareStateDir(s.Config, s.ConfigPath, !config.IsPostgresDSN(historyDSN(s.Config)), log)
}

// historyDSN is the history's store.dsn, or its default.
func historyDSN(c *config.EdgeConfig) string {
	if c.Store.DSN == "" {
		return "edge.db"
	}
	return c.Store.DSN
}

// prepareStateDir creates the edge's state_dir 0700 when create (the SQLite
// history lives there by default) and keeps it closed to other users. The
// default state_dir ("<config>-state" beside the config) is the edge's own:
// if group or others may enter it, it is narrowed to 0700 with a warning. A
// state_dir the config names may be a directory the operator shares on
// purpose, so it is left as it is, with a warning; the files the edge keeps
// in it are 0600 (and tls/ 0700) either way.
func prepareStateDir(c *config.EdgeConfig, configPath string, create bool, log *slog.Logger) error {
	dir := c.StateDir
	if dir == "" || runtime.GOOS == "windows" {
		return nil
	}
	if create {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("cannot create state_dir %s: %w", dir, err)
		}
	}
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state_dir: %w", err)
	}
	perm := fi.Mode().Perm()
	if !fi.IsDir() || perm&0o077 == 0 {
		return nil
	}
	mode := fmt.Sprintf("%04o", perm)
	if configPath == "" || filepath.Clean(dir) != filepath.Clean(config.DefaultStateDir(configPath)) {
		log.Warn("state_dir is open to other users; it was named in the config, so the edge leaves its mode alone (chmod 700 it unless shared on purpose)", "dir", dir, "mode", mode)
		return nil
	}
	if err := os.Chmod(dir, perm&0o700); err != nil {
		log.Warn("state_dir is open to other users and could not be narrowed (chmod 700 it)", "dir", dir, "mode", mode, "err", err)
		return nil
	}
	log.Warn("state_dir was open to other users; narrowed to the owner (0700)", "dir", dir, "was", mode)
	return nil
}
