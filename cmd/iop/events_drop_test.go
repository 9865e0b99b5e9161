package main

import (
	"io"
	"net/http"
	"testing"
)

// The edge reports events it dropped for a slow subscriber only in a
// comment, ": dropped N events": iop events passed over it without a word.
func TestEventsReportsDroppedEvents(t *testing.T) {
	e := newFakeEdge(t)
	e.mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, ": keep-alive\n\n"+
			"event: config.reloaded\ndata: {\"type\":\"config.reloaded\",\"time\":\"2026-03-01T12:00:00Z\"}\n\n"+
			": dropped 17 events\n\n"+
			"event: config.reloaded\ndata: {\"type\":\"config.reloaded\",\"time\":\"2026-03-01T12:00:01Z\"}\n\n")
	})
	const warn = "iop: warning: the edge dropped 17 events\n"
	r := run(t, e.URL, "events")
	r.want(t, 1, "12:00:00.000 config.reloaded\n12:00:01.000 config.reloaded\n")
	if r.stderr != warn+"iop: the edge closed the event stream\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
	r = run(t, e.URL, "events", "--json")
	r.want(t, 1, `{"type":"config.reloaded","time":"2026-03-01T12:00:00Z"}`+"\n"+`{"type":"config.reloaded","time":"2026-03-01T12:00:01Z"}`+"\n")
	if r.stderr != warn+"iop: the edge closed the event stream\n" {
		t.Fatalf("json stderr %q", r.stderr)
	}
}
