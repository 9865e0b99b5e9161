//go:build unix

package bootstrap_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/bootstrap"
	"iop/internal/lockedbuf"
)

// startEdgeIn starts an edge whose config file is dir/edge.yaml with the
// given extra lines, and returns its log.
func startEdgeIn(t *testing.T, dir, extra string) string {
	t.Helper()
	path := filepath.Join(dir, "edge.yaml")
	cfg, err := config.ParseEdge(path, []byte(extra+`
transport: {listen: "`+freeAddr(t)+`"}
http: {listen: "`+freeAddr(t)+`"}
`))
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedbuf.Buffer
	app := fxtest.New(t, bootstrap.Edge(bootstrap.EdgeSettings{Config: cfg, ConfigPath: path,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}), fx.NopLogger)
	app.RequireStart()
	app.RequireStop()
	return logs.String()
}

func perm(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// The default state_dir ("<config>-state") is the edge's own: if it exists
// open to other users (made by hand under umask 022), the edge narrows it to
// 0700 and says so; edge.db in it is 0600 either way.
func TestEdgeNarrowsItsDefaultStateDir(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	dir := t.TempDir()
	state := filepath.Join(dir, "edge-state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	logs := startEdgeIn(t, dir, "")
	if m := perm(t, state); m != 0o700 {
		t.Errorf("default state_dir left %04o, want 0700", m)
	}
	if m := perm(t, filepath.Join(state, "edge.db")); m != 0o600 {
		t.Errorf("edge.db %04o, want 0600", m)
	}
	if !strings.Contains(logs, "state_dir was open to other users; narrowed") {
		t.Errorf("no warning that the state_dir was narrowed:\n%s", logs)
	}
}

// A state_dir the config names may be shared on purpose: the edge leaves
// its mode alone and warns, and keeps edge.db in it 0600.
func TestEdgeWarnsAboutANamedOpenStateDir(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	dir := t.TempDir()
	state := filepath.Join(dir, "shared")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	logs := startEdgeIn(t, dir, "state_dir: shared\n")
	if m := perm(t, state); m != 0o755 {
		t.Errorf("a named state_dir was changed to %04o", m)
	}
	if m := perm(t, filepath.Join(state, "edge.db")); m != 0o600 {
		t.Errorf("edge.db %04o, want 0600", m)
	}
	if !strings.Contains(logs, "state_dir is open to other users") || !strings.Contains(logs, state) {
		t.Errorf("no warning naming the open state_dir:\n%s", logs)
	}
}
