package httpapi

import "testing"

// cleanPath runs on every request: a clean path, with or without its
// trailing slash, costs no allocation; unclean ones get net/http's answer.
func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{
		"/v1/chat/completions": "/v1/chat/completions",
		"/ui/":                 "/ui/",
		"/":                    "/",
		"":                     "/",
		"v1/nodes":             "/v1/nodes",
		"//v1/nodes":           "/v1/nodes",
		"/v1/./runs/":          "/v1/runs/",
		"/v1/../api//tags":     "/api/tags",
		"/v1/runs/%2E":         "/v1/runs/%2E",
	} {
		if got := cleanPath(in); got != want {
			t.Errorf("cleanPath(%q) = %q, want %q", in, got, want)
		}
	}
	for _, p := range []string{"/v1/chat/completions", "/api/"} {
		if n := testing.AllocsPerRun(100, func() { _ = cleanPath(p) }); n != 0 {
			t.Errorf("cleanPath(%q): %v allocations, want 0", p, n)
		}
	}
}
