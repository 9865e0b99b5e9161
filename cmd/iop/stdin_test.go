package main

import (
	"context"
	"io"
	"testing"
	"time"
)

// Ctrl-C while iop run reads its input from stdin ends it as any
// interrupted command ends: exit 130, "iop: interrupted". The first Ctrl-C
// was ignored until stdin closed.
func TestInterruptWhileReadingStdin(t *testing.T) {
	e := newFakeEdge(t)
	pr, pw := io.Pipe()
	defer pw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() {
		done <- cli(t, ctx, e.URL, []cliOpt{func(a *app) { a.stdin = pr }}, "run", "--adapter", "exec", "--target", "cat", "-")
	}()
	cancel() // Ctrl-C, stdin still open
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		pw.Close()
		<-done
		t.Fatal("Ctrl-C was ignored while stdin was open")
	}
	if r.code != 130 || r.stderr != "iop: interrupted\n" || r.stdout != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 130, iop: interrupted", r.code, r.stdout, r.stderr)
	}
	if len(e.reqs) != 0 {
		t.Fatalf("a run was sent: %+v", e.reqs)
	}
	pw.Close() // the reading goroutine ends with stdin
}
