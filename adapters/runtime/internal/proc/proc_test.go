package proc_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/adapters/runtime/internal/proc"
)

func start(t *testing.T, ctx context.Context, script string) *proc.Process {
	t.Helper()
	p, err := proc.Start(ctx, proc.Spec{Path: "/bin/sh", Args: []string{"-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// What the program wrote before it exited is read in full, however long
// the reader takes to come for it.
func TestOutputWaitsForTheReader(t *testing.T) {
	p := start(t, context.Background(), "head -c 50000 /dev/zero | tr '\\0' x; echo; echo END")
	time.Sleep(1500 * time.Millisecond) // longer than the grace after exit
	b, err := io.ReadAll(p.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), "\nEND\n") || len(b) != 50000+5 {
		t.Fatalf("read %d bytes, ending %q", len(b), b[max(0, len(b)-8):])
	}
	if st := p.Wait(); st == nil || !st.Success() {
		t.Fatalf("state %v", st)
	}
	if p.Stopped() {
		t.Error("Stopped for a program that exited on its own")
	}
}

// A descendant that left the program's process group and keeps stdout
// open does not keep the output open once the program has exited.
func TestOutputEndsDespiteADetachedDescendant(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	p := start(t, context.Background(), "setsid sleep 5 & echo done")
	b, err := io.ReadAll(p.Stdout)
	if err != nil || string(b) != "done\n" {
		t.Fatalf("read %q, %v", b, err)
	}
	p.Wait()
}

// Stopped tells a program ended by its context from one that exited on its
// own before the context ended.
func TestStopped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := start(t, ctx, "exec sleep 30")
	cancel()
	_, _ = io.ReadAll(p.Stdout)
	p.Wait()
	if !p.Stopped() {
		t.Error("not Stopped after its context ended it")
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	p = start(t, ctx, "echo hi")
	_, _ = io.ReadAll(p.Stdout)
	p.Wait()
	cancel()
	if p.Stopped() {
		t.Error("Stopped though it exited before its context ended")
	}
}

// killFromFile kills the process (and its group) whose pid a test's
// detached descendant wrote to pidfile.
func killFromFile(pidfile string) {
	b, _ := os.ReadFile(pidfile)
	if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// A detached descendant that keeps writing does not keep the output open:
// after the exit, waiting for new bytes is bounded in all, not per read.
func TestOutputEndsDespiteATricklingDetachedDescendant(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	pidfile := filepath.Join(t.TempDir(), "pid")
	t.Cleanup(func() { killFromFile(pidfile) })
	p := start(t, context.Background(), `setsid sh -c 'echo $$ > `+pidfile+`; while :; do echo tick; sleep 0.2; done' & echo done`)
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, p.Stdout); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.Kill()
		<-done
		t.Fatal("stdout still open 10 s after the program exited: a trickling detached descendant holds it")
	}
	p.Wait()
}

// StderrLine gets stderr's lines as they are written, each cut to
// MaxStderrLine, the last one without a line ending too; the tail is kept
// as before.
func TestStderrLines(t *testing.T) {
	var mu sync.Mutex
	var got []string
	p, err := proc.Start(context.Background(), proc.Spec{
		Path: "/bin/sh",
		Args: []string{"-c", `printf 'one\r\ntw' >&2; printf 'o\n\n' >&2; head -c 10000 /dev/zero | tr '\0' y >&2; printf 'z\nlast' >&2`},
		StderrLine: func(line []byte) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, string(line))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(p.Stdout); err != nil {
		t.Fatal(err)
	}
	p.Wait()
	mu.Lock()
	defer mu.Unlock()
	want := []string{"one", "two", "", strings.Repeat("y", proc.MaxStderrLine), "last"}
	if !slices.Equal(got, want) {
		t.Errorf("lines = %d %.40q, want %d %.40q", len(got), got, len(want), want)
	}
	if tail := p.Stderr(); !strings.HasSuffix(tail, "yyyz\nlast") || len(tail) != proc.StderrTail {
		t.Errorf("tail = %d bytes ending %q", len(tail), tail[max(0, len(tail)-10):])
	}
}

// A program named without a slash is found in the PATH its environment
// declares (an agent's env: its own toolchain), not in the node's: the
// node's PATH ran the node's copy of the command, or found none.
func TestStartSearchesTheChildsPATH(t *testing.T) {
	dir := t.TempDir()
	tool := filepath.Join(dir, "iop-proc-test-tool")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\necho from-the-declared-path\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := proc.Start(context.Background(), proc.Spec{Path: "iop-proc-test-tool", Env: []string{"PATH=" + dir + ":/usr/bin:/bin"}})
	if err != nil {
		t.Fatalf("a command in the child's PATH: %v", err)
	}
	out, _ := io.ReadAll(p.Stdout)
	if st := p.Wait(); st == nil || !st.Success() {
		t.Fatalf("exit %v", st)
	}
	if string(out) != "from-the-declared-path\n" {
		t.Fatalf("output %q", out)
	}
	// Not in the child's PATH: not run, whatever the node's has.
	if _, err := proc.Start(context.Background(), proc.Spec{Path: "sh", Env: []string{"PATH=" + dir}}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("sh outside the child's PATH: %v, want not found", err)
	}
}
