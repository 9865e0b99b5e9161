package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// cutStream answers pattern with one event of an event stream, then drops
// the connection in the middle of the chunked body, as an edge that was
// killed (or whose host went away) does.
func (e *fakeEdge) cutStream(t *testing.T, pattern string, header map[string]string, typ, data string) {
	e.mux.HandleFunc(pattern, func(w http.ResponseWriter, _ *http.Request) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "event: "+typ+"\ndata: "+data+"\n\n")
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		_ = conn.Close()
	})
}

// A stream the edge's crash cuts says the connection broke, in words, not
// Go's "unexpected EOF".
func TestStreamsCutByACrashedEdge(t *testing.T) {
	e := newFakeEdge(t)
	e.cutStream(t, "POST /v1/runs", map[string]string{"X-IOP-Run-ID": "run_1", "X-IOP-Node": "n1"},
		"delta", `{"type":"delta","text":"x"}`)
	e.cutStream(t, "GET /v1/events", nil,
		"node.registered", `{"type":"node.registered","time":"2026-03-01T12:00:01.5Z","node":"n1","remote":"1.2.3.4:5"}`)

	r := run(t, e.URL, "run", "--adapter", "exec", "in")
	r.want(t, 1, "x")
	if r.stderr != "iop: run run_1: the connection to the edge broke before the run ended\n" {
		t.Fatalf("iop run: stderr %q", r.stderr)
	}
	r = run(t, e.URL, "events")
	if r.code != 1 || !strings.Contains(r.stdout, "node.registered") {
		t.Fatalf("iop events: %+v", r)
	}
	if r.stderr != "iop: the connection to the edge broke: the event stream ended\n" {
		t.Fatalf("iop events: stderr %q", r.stderr)
	}
}
