package exec

import (
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"testing"

	"iop/adapters/runtime/runtimetest"
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
	if cmd := a.command(argv, nil); cmd.Err != nil || cmd.Path != first || !slices.Equal(cmd.Args, argv) {
		t.Fatalf("first run: path %q args %q err %v", cmd.Path, cmd.Args, cmd.Err)
	}
	if p, ok := a.found.Load("iop-test-cmd"); !ok || p != first {
		t.Fatalf("found = %v, %v; want %s", p, ok, first)
	}
	if cmd := a.command(argv, nil); cmd.Path != first || !slices.Equal(cmd.Args, argv) {
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
	if cmd := a.command(argv, nil); cmd.Err != nil || cmd.Path != second {
		t.Fatalf("after the move: path %q err %v; want %s", cmd.Path, cmd.Err, second)
	}
	// Not executable any more: not reused, and PATH finds nothing.
	if err := os.Chmod(second, 0o644); err != nil {
		t.Fatal(err)
	}
	if cmd := a.command(argv, nil); cmd.Err == nil {
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
		runtimetest.ReportCPU(b, func() {
			for b.Loop() {
				_ = osexec.Command(argv[0], argv[1:]...)
			}
		})
	})
	b.Run("reuse-found", func(b *testing.B) {
		a := &Adapter{}
		runtimetest.ReportCPU(b, func() {
			for b.Loop() {
				_ = a.command(argv, nil)
			}
		})
	})
}

// A command named without a slash is looked up in the PATH its env
// declares, which is the PATH it runs with: a target's own toolchain
// directory is where its command comes from, not a program of the same
// name in the node's PATH (nor "not found in $PATH" when only the declared
// PATH has it). Each PATH keeps its own cached result.
func TestCommandSearchesTheDeclaredPATH(t *testing.T) {
	nodeDir, toolDir := t.TempDir(), t.TempDir()
	t.Setenv("PATH", nodeDir+string(os.PathListSeparator)+"/usr/bin"+string(os.PathListSeparator)+"/bin")
	write := func(dir, name, out string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\necho "+out+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(nodeDir, "iop-test-tool", "node")
	write(toolDir, "iop-test-tool", "toolchain")
	write(toolDir, "iop-test-only-here", "only")
	declared := toolDir + string(os.PathListSeparator) + "/usr/bin" + string(os.PathListSeparator) + "/bin"
	a, err := New(domain.AdapterConfig{Name: "exec", Env: map[string]string{"PATH": declared}, Targets: map[string]domain.ExecTarget{
		"tool":     {Command: []string{"iop-test-tool"}},
		"only":     {Command: []string{"iop-test-only-here"}},
		"nodepath": {Command: []string{"iop-test-tool"}, Env: map[string]string{"PATH": nodeDir}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for target, want := range map[string]string{"tool": "toolchain\n", "only": "only\n", "nodepath": "node\n"} {
		for run := range 2 { // the second from the cache
			sink := &runtimetest.Sink{}
			if err := a.Execute(t.Context(), domain.RunRequest{RunID: "r", Target: target}, sink); err != nil {
				t.Fatalf("%s run %d: %v", target, run, err)
			}
			if got := sink.Text(); got != want {
				t.Errorf("%s run %d: output %q, want %q", target, run, got, want)
			}
		}
	}
	// Found only through a relative entry: refused, as for the node's PATH.
	t.Chdir(toolDir)
	if cmd := a.command([]string{"iop-test-tool"}, map[string]string{"PATH": "."}); !errors.Is(cmd.Err, osexec.ErrDot) {
		t.Errorf("relative PATH entry: err %v", cmd.Err)
	}
	if cmd := a.command([]string{"iop-test-nowhere"}, map[string]string{"PATH": toolDir}); !errors.Is(cmd.Err, osexec.ErrNotFound) {
		t.Errorf("missing command: err %v, want ErrNotFound", cmd.Err)
	}
}
