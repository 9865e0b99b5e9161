package main

import (
	"strings"
	"testing"
)

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, ünïcödé 名前 …": "plain text, ünïcödé 名前 …",
		"":                         "",
		"\x1b[2Jclear":             `\x1b[2Jclear`,
		"title\x1b]0;pwned\a":      `title\x1b]0;pwned\a`,
		"two\nlines\r\n":           `two\nlines\r\n`,
		"tab\there":                `tab\there`,
		"del\x7f nul\x00":          `del\x7f nul\x00`,
		"c1 \u009b31m csi":         `c1 \u009b31m csi`,
		"bidi \u202eevil\u202c":    `bidi \u202eevil\u202c`,
		"isolate \u2066x\u2069":    `isolate \u2066x\u2069`,
		"line sep \u2028 \u2029":   `line sep \u2028 \u2029`,
		"zero width \u200b\ufeff":  `zero width \u200b\ufeff`,
		"bad utf-8 a\xffb\xc3":     `bad utf-8 a\xffb\xc3`,
		"replacement char \ufffd ": "replacement char \ufffd ",
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// noRawControls fails if s holds a byte or rune a terminal acts on, other
// than the newlines that end lines.
func noRawControls(t *testing.T, what, s string) {
	t.Helper()
	for _, r := range strings.ReplaceAll(s, "\n", "") {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0x202e || r == 0x2028 {
			t.Fatalf("%s holds a raw %U: %q", what, r, s)
		}
	}
}

// What a node or a provider says (a run's error, an offline node's reason,
// a model name, an API error message) is shown escaped: it cannot clear the
// screen, set the title, reverse the line or forge lines of output.
func TestHostileTextIsEscaped(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/runs", 200, `{"runs":[{"run_id":"run_1","node":"n\u202e1","adapter":"exec","status":"failed",
		"created_at":"2026-03-01T11:00:00Z","finished_at":"2026-03-01T11:00:01Z","error":{"code":"exec_failed","message":"boom\u001b[2J"}}]}`)
	e.json("GET /v1/runs/run_1", 200, `{"run_id":"run_1","node":"n1","adapter":"exec","target":"t\u001b]0;pwned\u0007","status":"failed",
		"created_at":"2026-03-01T11:00:00Z","error":{"code":"exec_failed","message":"line one\nline two\u001b[31m"}}`)
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"n3","connected":false,"disconnect_reason":"gone\n\u001b[1Afake left: heartbeat\u0085","adapters":[]}]}`)
	e.json("POST /v1/runs", 404, `{"error":{"code":"node_not_found","message":"no such node\niop: all is well\u001b[0m"}}`)
	e.sse("GET /v1/events", nil,
		"run.event", `{"type":"run.event","time":"2026-03-01T12:00:01Z","node":"n1","run":{"run_id":"r","seq":2,"type":"complete","usage":{"total_tokens":3,"model":"m\u001b[5m","stop_reason":"end\u202e"}}}`)

	r := run(t, e.URL, "runs")
	r.want(t, 0, ""+
		"RUN    NODE      ADAPTER  TARGET  STATUS  CREATED              DURATION  ERROR\n"+
		`run_1  n\u202e1  exec     -       failed  2026-03-01 11:00:00  1s        exec_failed: boom\x1b[2J`+"\n")

	r = run(t, e.URL, "run-get", "run_1")
	if r.code != 0 || !strings.Contains(r.stdout, `target:      t\x1b]0;pwned\a`+"\n") ||
		!strings.Contains(r.stdout, `error:       exec_failed: line one line two\x1b[31m`+"\n") {
		t.Fatalf("run-get: %+v", r)
	}
	noRawControls(t, "run-get", r.stdout)

	r = run(t, e.URL, "nodes")
	if r.code != 0 || !strings.HasSuffix(r.stdout, "\n"+`n3 left: gone\n\x1b[1Afake left: heartbeat\u0085`+"\n") {
		t.Fatalf("nodes: %+v", r)
	}
	noRawControls(t, "nodes", r.stdout)

	r = run(t, e.URL, "run", "--adapter", "exec", "x")
	if r.code != 1 || r.stderr != `iop: no such node\niop: all is well\x1b[0m (node_not_found)`+"\n" {
		t.Fatalf("run error: %+v", r)
	}

	r = run(t, e.URL, "events")
	if !strings.HasSuffix(r.stdout, `(0 prompt + 0 completion = 3 tokens, model m\x1b[5m, stop end\u202e)`+"\n") {
		t.Fatalf("events: %+v", r)
	}
	noRawControls(t, "events", r.stdout)
}

// run -v reports the run's usage with the provider's model and stop reason
// escaped.
func TestVerboseUsageIsEscaped(t *testing.T) {
	e := newFakeEdge(t)
	e.sse("POST /v1/runs", map[string]string{"X-IOP-Run-ID": "run_1", "X-IOP-Node": "n1"},
		"complete", `{"type":"complete","usage":{"prompt_tokens":1,"completion_tokens":2,"model":"m\u001b]0;x\u0007","stop_reason":"stop\u202e"}}`)
	r := run(t, e.URL, "run", "-v", "--adapter", "exec", "x")
	if r.code != 0 || !strings.Contains(r.stderr, `model m\x1b]0;x\a, stop stop\u202e`+"\n") {
		t.Fatalf("%+v", r)
	}
	noRawControls(t, "stderr", r.stderr)
}

// Columns line up on a terminal whatever the ids hold: a wide (CJK)
// character takes two columns, a combining mark none. tabwriter counted
// runes, so every column after such an id was shifted.
func TestTableColumnsWithWideCharacters(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[
		{"id":"東京-1","connected":true,"remote":"10.0.0.1:1","connected_at":"2026-03-01T11:55:00Z","version":"v1","adapters":[]},
		{"id":"cafe\u0301","connected":true,"remote":"10.0.0.2:1","connected_at":"2026-03-01T11:55:00Z","version":"v1","adapters":[]},
		{"id":"n1","connected":true,"remote":"10.0.0.3:1","connected_at":"2026-03-01T11:55:00Z","version":"v1","adapters":[]}]}`)
	run(t, e.URL, "nodes").want(t, 0, ""+
		"ID      STATUS  REMOTE      CONNECTED  ADAPTERS  VERSION\n"+
		"東京-1  online  10.0.0.1:1  5m ago     -         v1\n"+
		"cafe\u0301    online  10.0.0.2:1  5m ago     -         v1\n"+
		"n1      online  10.0.0.3:1  5m ago     -         v1\n")
}
