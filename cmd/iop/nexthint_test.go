package main

import (
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// shellArgs is what a POSIX shell reads from line: the words a pasted
// command passes to iop.
func shellArgs(t *testing.T, line string) []string {
	t.Helper()
	out, err := exec.Command("sh", "-c", "for w in "+line+"; do printf '%s\\n' \"$w\"; done").Output()
	if err != nil {
		t.Fatalf("sh reading %q: %v", line, err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
}

// The next-page command iop prints is pasted into a shell: a filter value
// with a space or a quote ("--session chat 1", a session id may hold any
// printable character) reads back as the same words. Unquoted, the shell
// split it, and the pasted command was a usage error or another filter.
func TestNextPageHintIsOneShellWordPerValue(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/runs", 200, `{"runs":[{"run_id":"run_1","node":"n1","adapter":"exec","status":"succeeded",
		"created_at":"2026-03-01T11:00:00Z","finished_at":"2026-03-01T11:00:01Z"}],"next_cursor":"c2"}`)
	e.mux.HandleFunc("POST /v1/nodes/{id}/commands", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"sessions":[{"adapter":"llm app","session_id":"chat 1","turns":1,"last_used":"2026-03-01T11:00:00Z"}],"next_cursor":"c 3"}`))
	})
	r := run(t, e.URL, "runs", "--session", "chat 1", "--key", "it's", "--limit", "1")
	line, ok := strings.CutPrefix(strings.TrimSuffix(r.stderr, "\n"), "more runs: ")
	if r.code != 0 || !ok {
		t.Fatalf("runs: %+v", r)
	}
	if got, want := shellArgs(t, line), []string{"iop", "runs", "--key", "it's", "--session", "chat 1", "--limit", "1", "--cursor", "c2"}; !slices.Equal(got, want) {
		t.Fatalf("the hint %q reads as %q, want %q", line, got, want)
	}

	r = run(t, e.URL, "node", "sessions", "n1", "--adapter", "llm app", "--limit", "1")
	line, ok = strings.CutPrefix(strings.TrimSuffix(r.stderr, "\n"), "more sessions on node n1: ")
	if r.code != 0 || !ok {
		t.Fatalf("node sessions: %+v", r)
	}
	if got, want := shellArgs(t, line), []string{"iop", "node", "sessions", "n1", "--adapter", "llm app", "--limit", "1", "--cursor", "c 3"}; !slices.Equal(got, want) {
		t.Fatalf("the hint %q reads as %q, want %q", line, got, want)
	}
}
