package proc

import (
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
)

// LookPathIn is osexec.LookPath over the given PATH value instead of the
// node's, with its errors: not found, or found only through a relative
// entry (osexec.ErrDot, which is never run). A child whose environment
// declares its own PATH (a target's or agent's env: its toolchain) is
// found there, as the child itself would find it, not in the node's.
func LookPathIn(name, path string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "." // POSIX: an empty entry is the working directory
		}
		p := filepath.Join(dir, name)
		if !Executable(p) {
			continue
		}
		if !filepath.IsAbs(p) {
			return p, &osexec.Error{Name: name, Err: osexec.ErrDot}
		}
		return p, nil
	}
	return name, &osexec.Error{Name: name, Err: osexec.ErrNotFound}
}

// Executable reports whether p is a regular file with an execute bit.
func Executable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// envPATH returns the PATH entry of env (the last, as a process reads it).
func envPATH(env []string) (string, bool) {
	path, found := "", false
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path, found = v, true
		}
	}
	return path, found
}
