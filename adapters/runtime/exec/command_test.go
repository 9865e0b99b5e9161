package exec

import (
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"testing"

	"iop/domain"
)

// A command found in PATH is reused while it is an executable, with argv[0]
// as configured, and searched for again once it is gone.
func TestCommandReusesWhatPATHFound(t *testing.T) {
	dir1, dir2 := t.TempDir(), t.TempDir()
	t.Setenv("PATH", dir1+string(os.PathListSeparator)+dir2)
	script := []byte("#!/bin/sh\necho hi\n")
	first := filepath.Join(dir1, "iop-test-cmd")
	if err := os.WriteFile(first, script, 0o755); err != nil {
		t.Fatal(err)
	}
	a, err := New(domain.AdapterConfig{Name: "exec", Targets: map[string]domain.ExecTarget{"t": {Command: []string{"iop-test-cmd", "x"}}}})
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{"iop-test-cmd", "x"}
	if cmd := a.command(argv); cmd.Err != nil || cmd.Path != first || !slices.Equal(cmd.Args, argv) {
		t.Fatalf("first run: path %q args %q err %v", cmd.Path, cmd.Args, cmd.Err)
	}
	if p, ok := a.found.Load("iop-test-cmd"); !ok || p != first {
		t.Fatalf("found = %v, %v; want %s", p, ok, first)
	}
	if cmd := a.command(argv); cmd.Path != first || !slices.Equal(cmd.Args, argv) {
		t.Fatalf("second run: path %q args %q", cmd.Path, cmd.Args)
	}
	// Gone from the first directory, present in the second: found there.
	second := filepath.Join(dir2, "iop-test-cmd")
	if err := os.WriteFile(second, script, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(first); err != nil {
		t.Fatal(err)
	}
	if cmd := a.command(argv); cmd.Err != nil || cmd.Path != second {
		t.Fatalf("after the move: path %q err %v; want %s", cmd.Path, cmd.Err, second)
	}
	// Not executable any more: not reused, and PATH finds nothing.
	if err := os.Chmod(second, 0o644); err != nil {
		t.Fatal(err)
	}
	if cmd := a.command(argv); cmd.Err == nil {
		t.Fatalf("a file without the execute bit ran from the cache: %q", cmd.Path)
	}
	if _, ok := a.found.Load("iop-test-cmd"); ok {
		t.Error("a command no longer in PATH is still remembered")
	}
}

// BenchmarkCommand builds a run's command for a target named without a
// slash ("cat"): a PATH search per run (before) against reusing what the
// first search found.
func BenchmarkCommand(b *testing.B) {
	argv := []string{"cat"}
	b.Run("path-search", func(b *testing.B) {
		reportCPU(b, func() {
			for b.Loop() {
				_ = osexec.Command(argv[0], argv[1:]...)
			}
		})
	})
	b.Run("reuse-found", func(b *testing.B) {
		a := &Adapter{}
		reportCPU(b, func() {
			for b.Loop() {
				_ = a.command(argv)
			}
		})
	})
}
