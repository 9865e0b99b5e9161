package httpapi_test

import (
	"crypto/sha256"
	"net/http"
	"testing"

	httpapi "iop/adapters/http"
	"iop/domain"
)

func apiKey(key, name string, nodes []string, scopes ...string) httpapi.APIKey {
	return httpapi.APIKey{SHA256: sha256.Sum256([]byte(key)), Principal: domain.Principal{Name: name, Scopes: scopes, Nodes: nodes}}
}

func TestKeyHeadersAndPublicRoutes(t *testing.T) {
	e := newEnvWithKeys(t, []httpapi.APIKey{apiKey("reader-key-0123456789", "reader", nil, domain.ScopeRead)},
		testNode{"n1", newFakeLink()})
	// A surface added later brings its own route, scope and dialect.
	e.api.Handle("GET /custom/", httpapi.Access{Scope: domain.ScopeInference, Dialect: func(w http.ResponseWriter, status int, code, msg string) {
		w.WriteHeader(status)
		_, _ = w.Write([]byte("custom:" + code))
	}}, http.NotFoundHandler())
	e.api.Handle("GET /ui/", httpapi.Access{Public: true}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("static"))
	}))

	for _, h := range [][]string{
		{"Authorization", "Bearer reader-key-0123456789"},
		{"Authorization", "bearer reader-key-0123456789"},
		{"X-Api-Key", "reader-key-0123456789"},
	} {
		readJSON(t, e.do("GET", "/v1/nodes", "", h...), http.StatusOK)
	}
	wantError(t, e.do("GET", "/v1/nodes", "", "Authorization", "Basic cmVhZGVyOnB3"), http.StatusUnauthorized, domain.CodeUnauthorized)
	wantError(t, e.do("GET", "/v1/nodes", "", "Authorization", "Bearer reader-key-012345678"), http.StatusUnauthorized, domain.CodeUnauthorized)
	wantError(t, e.do("POST", "/v1/nodes/n1/commands", `{"command":"x"}`, "X-Api-Key", "reader-key-0123456789"), http.StatusForbidden, domain.CodeForbidden)
	wantError(t, e.do("GET", "/nope", ""), http.StatusUnauthorized, domain.CodeUnauthorized)
	wantError(t, e.do("PUT", "/v1/nodes", ""), http.StatusUnauthorized, domain.CodeUnauthorized)

	for path, want := range map[string]string{"/custom/x": "custom:unauthorized", "/ui/index.html": "static"} {
		resp := e.do("GET", path, "")
		b := make([]byte, 64)
		n, _ := resp.Body.Read(b)
		resp.Body.Close()
		if string(b[:n]) != want {
			t.Errorf("GET %s = %d %q, want %q", path, resp.StatusCode, b[:n], want)
		}
	}
	resp := e.do("GET", "/custom/x", "", "X-Api-Key", "reader-key-0123456789")
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("custom route with a read key: %d", resp.StatusCode)
	}
}

func TestNodeLimitedKey(t *testing.T) {
	// Both nodes admit runs (their first event is start) and keep them going.
	l1, l2 := newFakeLink(domain.RunEvent{Type: domain.EventStart}), newFakeLink(domain.RunEvent{Type: domain.EventStart})
	e := newEnvWithKeys(t, []httpapi.APIKey{
		apiKey("n2-only-key-0123456789", "n2-only", []string{"n2"}, domain.ScopeRead, domain.ScopeRuns),
		apiKey("admin-key-0123456789ab", "ops", nil, domain.ScopeAdmin),
	}, testNode{"n1", l1}, testNode{"n2", l2})
	limited := []string{"X-Api-Key", "n2-only-key-0123456789"}

	body := readJSON(t, e.do("GET", "/v1/nodes", "", limited...), http.StatusOK)
	if nodes := body["nodes"].([]any); len(nodes) != 1 || nodes[0].(map[string]any)["id"] != "n2" {
		t.Fatalf("nodes for an n2-only key: %v", body)
	}
	wantError(t, e.do("GET", "/v1/nodes/n1", "", limited...), http.StatusNotFound, domain.CodeNodeNotFound)
	wantError(t, e.do("POST", "/v1/runs", `{"node":"n1","adapter":"exec","input":"x"}`, limited...), http.StatusNotFound, domain.CodeNodeNotFound)
	wantError(t, e.do("DELETE", "/v1/sessions/s1?adapter=exec&node=n1", "", limited...), http.StatusNotFound, domain.CodeNodeNotFound)

	// A run the admin started on n1 does not exist for the limited key.
	resp := e.do("POST", "/v1/runs", `{"node":"n1","adapter":"exec","input":"x","background":true}`, "X-Api-Key", "admin-key-0123456789ab")
	run := readJSON(t, resp, http.StatusAccepted)
	id := run["run_id"].(string)
	wantError(t, e.do("POST", "/v1/runs/"+id+"/cancel", "", limited...), http.StatusNotFound, domain.CodeRunNotFound)
	if calls := l1.cancelCalls(); len(calls) != 0 {
		t.Fatalf("a limited key reached n1: cancels %v", calls)
	}
	// Without a node the limited key's run goes to n2 even if n1 is idle.
	resp = e.do("POST", "/v1/runs", `{"adapter":"exec","input":"x","background":true}`, limited...)
	if got := readJSON(t, resp, http.StatusAccepted)["node"]; got != "n2" {
		t.Fatalf("run of an n2-only key went to %v", got)
	}
	if len(l2.requests()) != 1 {
		t.Fatalf("n2 got %d runs", len(l2.requests()))
	}
}
