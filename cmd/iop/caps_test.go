package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// A stream event larger than any the edge sends (16 MiB; the edge's are at
// most a few hundred KiB) ends the stream with a clear error: read without
// a bound, a hostile line grew the CLI's memory without limit.
func TestOversizedStreamEventIsRefused(t *testing.T) {
	e := newFakeEdge(t)
	huge := strings.Repeat("x", 17<<20)
	e.mux.HandleFunc("POST /v1/runs", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-IOP-Run-ID", "run_1")
		fmt.Fprintf(w, "event: delta\ndata: {\"type\":\"delta\",\"text\":\"%s\"}\n\n", huge)
		_, _ = io.WriteString(w, "event: complete\ndata: {\"type\":\"complete\"}\n\n")
	})
	r := run(t, e.URL, "run", "--adapter", "exec", "x")
	r.want(t, 1, "")
	if !strings.Contains(r.stderr, "over 16 MiB") {
		t.Fatalf("stderr %q", r.stderr)
	}
}

// An answer larger than any the edge sends (64 MiB) is refused, not read
// whole into memory.
func TestOversizedAnswerIsRefused(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[],"pad":"`+strings.Repeat("x", 64<<20)+`"}`)
	r := run(t, e.URL, "nodes")
	r.want(t, 1, "")
	if !strings.Contains(r.stderr, "over 64 MiB") {
		t.Fatalf("stderr %q", r.stderr)
	}
}
