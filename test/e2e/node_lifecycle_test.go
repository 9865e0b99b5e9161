package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A start failure in a constructor (a store that cannot be opened) is one
// plain line on stderr naming the cause, and exit 1: not fx's wiring chain
// ("could not build arguments for function …") after two ERROR log lines
// with stack traces, nor SQLite's "out of memory (14)".
func TestStartFailureIsOneLine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	isDir := filepath.Join(dir, "isdir.db")
	if err := os.Mkdir(isDir, 0o700); err != nil {
		t.Fatal(err)
	}
	edgeCfg := filepath.Join(dir, "edge.yaml")
	stateDir := filepath.Join(file, "state")
	cfg := fmt.Sprintf("state_dir: %s\ntransport:\n  listen: %q\nhttp:\n  listen: %q\nnodes:%s", stateDir, freeAddr(t), freeAddr(t), defaultNodes(1))
	if err := os.WriteFile(edgeCfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	node := func(db string) []string {
		return []string{"--edge", freeAddr(t), "--token", testToken, "--insecure", "--db", db}
	}
	cases := []struct {
		name, bin string
		args      []string
		want      string
	}{
		{"node store is a directory", "iop-node", node("file:" + isDir + "?cache=shared&mode=rwc"),
			fmt.Sprintf("iop-node: cannot start: open node store %q: cannot open database file %s: it is a directory\n", "file:"+isDir+"?cache=shared&mode=rwc", isDir)},
		{"edge state_dir cannot be created", "iop-edge", []string{"--config", edgeCfg},
			fmt.Sprintf("iop-edge: cannot start: cannot create state_dir %s: mkdir %s: not a directory\n", stateDir, file)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(binDir, tc.bin), tc.args...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if code := cmd.ProcessState.ExitCode(); code != 1 {
				t.Fatalf("exit %d (%v), want 1; stderr:\n%s", code, err, stderr.String())
			}
			if got := stderr.String(); got != tc.want || strings.Count(got, "\n") != 1 {
				t.Fatalf("stderr:\n%s\nwant exactly:\n%s", got, tc.want)
			}
			if stdout.Len() != 0 {
				t.Fatalf("stdout: %q", stdout.String())
			}
		})
	}
}
