package main

import (
	"context"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fullStdout is stdout on a full disk (> /dev/full): every write fails.
type fullStdout struct{ writes int }

func (f *fullStdout) Write([]byte) (int, error) {
	f.writes++
	return 0, &fs.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.ENOSPC}
}

func withStdout(w io.Writer) cliOpt { return func(a *app) { a.stdout = w } }

const fullErr = "iop: write /dev/stdout: no space left on device\n"

// A run whose output cannot be written stops reading, cancels the run (as
// on Ctrl-C: it only left the stream, and the run went on where the edge
// did not see it go), leaves the stream and fails: its output was lost and
// it exited 0.
func TestRunOutputThatCannotBeWrittenFails(t *testing.T) {
	e := newFakeEdge(t)
	var cancels atomic.Int32
	e.mux.HandleFunc("POST /v1/runs/run_1/cancel", func(w http.ResponseWriter, _ *http.Request) {
		cancels.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"run_id":"run_1","node":"n1"}`)
	})
	left := make(chan bool, 1)
	e.mux.HandleFunc("POST /v1/runs", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-IOP-Run-ID", "run_1")
		_, _ = io.WriteString(w, "event: delta\ndata: {\"type\":\"delta\",\"text\":\"lost\"}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			left <- true
		case <-time.After(10 * time.Second):
			left <- false
			_, _ = io.WriteString(w, "event: complete\ndata: {\"type\":\"complete\"}\n\n")
		}
	})
	for _, json := range []bool{false, true} {
		args := []string{"run", "--adapter", "exec", "x"}
		if json {
			args = append(args, "--json")
		}
		out := &fullStdout{}
		r := cli(t, context.Background(), e.URL, []cliOpt{withStdout(out)}, args...)
		want := strings.TrimSuffix(fullErr, "\n") + "; run run_1 is cancelled\n"
		if r.code != 1 || r.stderr != want {
			t.Fatalf("json=%v: exit %d, stderr %q; want 1, %q", json, r.code, r.stderr, want)
		}
		if n := cancels.Swap(0); n != 1 {
			t.Fatalf("json=%v: %d cancels of the run, want 1", json, n)
		}
		if !<-left {
			t.Fatalf("json=%v: the CLI read on after its output was lost", json)
		}
		if out.writes != 1 {
			t.Fatalf("json=%v: %d writes after the first failed", json, out.writes-1)
		}
	}
}

func TestOutputThatCannotBeWrittenFails(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"n1","connected":true,"adapters":[],"providers":[]}]}`)
	e.json("POST /v1/runs", 202, `{"run_id":"run_bg","node":"n2"}`)
	e.json("POST /v1/runs/run_1/cancel", 200, `{"run_id":"run_1","node":"n1"}`)
	e.json("GET /v1/runs/run_1", 200, `{"run_id":"run_1","node":"n1","status":"running"}`)
	for _, args := range [][]string{
		{"nodes"},
		{"nodes", "--json"},
		{"run", "--adapter", "exec", "--background", "x"},
		{"cancel", "run_1"},
		{"run-get", "run_1"},
		{"--help"},
		// cobra prints the version itself and returns the write's error,
		// which was taken for a usage error (exit 2, "Run 'iop --help'").
		{"--version"},
	} {
		r := cli(t, context.Background(), e.URL, []cliOpt{withStdout(&fullStdout{})}, args...)
		if r.code != 1 || !strings.HasSuffix(r.stderr, fullErr) {
			t.Errorf("%v: exit %d, stderr %q; want 1, %q", args, r.code, r.stderr, fullErr)
		}
	}
}
