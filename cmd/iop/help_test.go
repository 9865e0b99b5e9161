package main

import (
	"strings"
	"testing"
)

// "iop help bogus" printed the root help and exited 0, so a mistyped
// topic looked like success; it is an unknown command, as "iop bogus" is.
func TestHelpOfAnUnknownCommand(t *testing.T) {
	for _, c := range []struct{ args, stderr string }{
		{"help bogus", "iop: unknown command \"bogus\" for \"iop\"\nRun 'iop --help' for usage.\n"},
		{"help node bogus", "iop: unknown command \"bogus\" for \"iop node\"\nRun 'iop --help' for usage.\n"},
	} {
		r := run(t, "", strings.Fields(c.args)...)
		r.want(t, 2, "")
		if r.stderr != c.stderr {
			t.Errorf("%s: stderr %q, want %q", c.args, r.stderr, c.stderr)
		}
	}
	for _, args := range []string{"help", "help run", "help node caps"} {
		r := run(t, "", strings.Fields(args)...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("%s: exit %d, stdout %q", args, r.code, r.stdout)
		}
	}
}

// An empty id is a usage error: it made a request for "/v1/runs//cancel",
// which the edge answered not_found (exit 1).
func TestEmptyIDIsAUsageError(t *testing.T) {
	e := newFakeEdge(t)
	for _, c := range []struct {
		args []string
		name string
	}{
		{[]string{"cancel", ""}, "RUN_ID"},
		{[]string{"run-get", ""}, "RUN_ID"},
		{[]string{"runs", "get", ""}, "RUN_ID"},
		{[]string{"session", "end", "", "--adapter", "A"}, "SESSION_ID"},
		{[]string{"node", "exec", "", "caps"}, "NODE"},
		{[]string{"node", "exec", "n1", ""}, "COMMAND"},
		// An optional NODE given empty ("$NODE" unset) is not "every
		// node": it asked the edge for node "", whose answer was a
		// redirect iop reported as an edge to point --edge elsewhere.
		{[]string{"node", "caps", ""}, "NODE"},
		{[]string{"node", "transport", ""}, "NODE"},
		{[]string{"node", "usage", ""}, "NODE"},
		{[]string{"node", "sessions", ""}, "NODE"},
		{[]string{"node", "runs", ""}, "NODE"},
		{[]string{"node", "exec", "n1", "runs", ""}, "ARGS_JSON"},
		// A model named "" went to the node's Ollama.
		{[]string{"ollama", "pull", ""}, "MODEL"},
		{[]string{"ollama", "show", ""}, "MODEL"},
		{[]string{"ollama", "delete", ""}, "MODEL"},
	} {
		r := run(t, e.URL, c.args...)
		r.want(t, 2, "")
		if !strings.HasPrefix(r.stderr, "iop: "+c.name+" must not be empty\n") {
			t.Errorf("%q: stderr %q", c.args, r.stderr)
		}
	}
	if len(e.reqs) != 0 {
		t.Fatalf("requests reached the edge: %+v", e.reqs)
	}
}

// A command that takes exactly one id says so: cobra's RangeArgs answered
// "accepts between 1 and 1 arg(s)".
func TestExactIDCountReadsPlainly(t *testing.T) {
	e := newFakeEdge(t)
	for _, args := range [][]string{{"cancel"}, {"cancel", "a", "b"}, {"run-get"}, {"runs", "get"}} {
		r := run(t, e.URL, args...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "iop: accepts 1 arg(s), received ") {
			t.Errorf("%q: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
}
