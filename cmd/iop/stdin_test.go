package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"iop/cmd/iop/internal/client"
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

// endlessInput is a stdin without end (iop run < /dev/zero, a huge file),
// counting what was read of it.
type endlessInput struct{ n int64 }

func (r *endlessInput) Read(p []byte) (int, error) {
	if r.n > 64<<20 {
		// Far past the edge's bound: a CLI still reading would read
		// forever (the test stops it here).
		return 0, io.EOF
	}
	for i := range p {
		p[i] = 'a'
	}
	r.n += int64(len(p))
	return len(p), nil
}

// Input on stdin over the edge's bound on a request (8 MiB) is refused
// after reading just past the bound, and never sent: the whole of stdin
// was read into memory, without end for an endless one, then sent for the
// edge to refuse ("request body exceeds 8388608 bytes").
func TestStdinOverTheEdgesBound(t *testing.T) {
	e := newFakeEdge(t)
	e.sse("POST /v1/runs", map[string]string{"X-IOP-Run-ID": "run_1"}, "complete", `{"type":"complete"}`)
	in := &endlessInput{}
	r := cli(t, context.Background(), e.URL, []cliOpt{func(a *app) { a.stdin = in }}, "run", "--adapter", "exec", "--target", "x")
	if r.code != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, "iop: the input on stdin is over 8 MiB, the most the edge takes in a request\n") {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if in.n > client.MaxRequest+1<<20 {
		t.Fatalf("read %d bytes of stdin, want just past %d", in.n, client.MaxRequest)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.reqs) != 0 {
		t.Fatalf("the input reached the edge")
	}
	// Exactly the bound is read whole and sent (the edge judges the
	// request, whose JSON is larger).
	exact := strings.Repeat("b", client.MaxRequest)
	e.mu.Unlock()
	r = cli(t, context.Background(), e.URL, []cliOpt{withStdin(exact)}, "run", "--adapter", "exec", "--target", "x")
	e.mu.Lock()
	if r.code != 0 || len(e.reqs) != 1 || !strings.Contains(e.reqs[0].body, exact) {
		t.Fatalf("input of exactly %d bytes: exit %d, stderr %q, %d requests", client.MaxRequest, r.code, r.stderr, len(e.reqs))
	}
}
