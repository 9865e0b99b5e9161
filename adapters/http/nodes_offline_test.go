package httpapi_test

import (
	"io"
	"strings"
	"testing"
	"time"

	httpapi "iop/adapters/http"
	"iop/domain"
)

// TestListNodesIncludesConfiguredOffline: GET /v1/nodes lists the config's
// nodes that are not connected, marked connected:false, beside the live ones
// (connected:true, fields as before); a node that left carries its
// disconnected_at; a key limited to some nodes sees only those.
func TestListNodesIncludesConfiguredOffline(t *testing.T) {
	aLink := newFakeLink()
	e := newEnvWithKeys(t, []httpapi.APIKey{
		apiKey("admin-key-0123456789", "ops", nil, domain.ScopeAdmin),
		apiKey("only-c-key-0123456789", "c-only", []string{"c"}, domain.ScopeRead),
	}, testNode{"a", aLink})
	e.dir.set(
		domain.NodeRecord{ID: "a", Token: "tok-a-secret"},
		domain.NodeRecord{ID: "c", Token: "tok-c-secret", Adapters: []domain.AdapterConfig{{Name: "sh", Type: domain.AdapterExec}},
			Providers: []domain.ProviderConfig{{Name: "ol", Type: domain.ProviderOllama, APIKeyEnv: "SECRET_ENV", Models: []string{"m1"}}}},
		domain.NodeRecord{ID: "b", TokenSHA256: strings.Repeat("ab", 32)},
	)
	admin := []string{"Authorization", "Bearer admin-key-0123456789"}

	body, err := io.ReadAll(e.do("GET", "/v1/nodes", "", admin...).Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"tok-", "SECRET_ENV", "abab"} {
		if strings.Contains(string(body), secret) {
			t.Fatalf("node list leaks %q: %s", secret, body)
		}
	}
	m := readJSON(t, e.do("GET", "/v1/nodes", "", admin...), 200)
	nodes := m["nodes"].([]any)
	if len(nodes) != 3 {
		t.Fatalf("want a, b, c: %v", m)
	}
	a, b, c := nodes[0].(map[string]any), nodes[1].(map[string]any), nodes[2].(map[string]any)
	if a["id"] != "a" || a["connected"] != true || a["connected_at"] != "2026-01-02T03:04:05Z" || a["hostname"] != "box-a" || a["config_version"] != 3.0 {
		t.Fatalf("connected node a: %v", a)
	}
	if _, ok := a["disconnected_at"]; ok {
		t.Fatalf("connected node a has disconnected_at: %v", a)
	}
	if b["id"] != "b" || b["connected"] != false || len(b["adapters"].([]any)) != 0 {
		t.Fatalf("offline node b: %v", b)
	}
	for _, k := range []string{"connected_at", "disconnected_at", "remote", "version", "hostname"} {
		if _, ok := b[k]; ok {
			t.Fatalf("never-connected node b has %s: %v", k, b)
		}
	}
	ad := c["adapters"].([]any)
	if c["id"] != "c" || c["connected"] != false || len(ad) != 1 {
		t.Fatalf("offline node c: %v", c)
	}
	if x := ad[0].(map[string]any); x["name"] != "sh" || x["type"] != "exec" || x["max_concurrency"] != float64(domain.DefaultMaxConcurrency) || x["in_flight"] != 0.0 {
		t.Fatalf("offline node c's configured adapter: %v", x)
	}
	if p := c["providers"].([]any); len(p) != 1 || p[0].(map[string]any)["name"] != "ol" {
		t.Fatalf("offline node c's configured providers: %v", c)
	}
	// Only the connected node counts for health and GET /v1/nodes/{id}.
	if h := readJSON(t, e.do("GET", "/healthz", ""), 200); h["nodes"] != 1.0 {
		t.Fatalf("health %v", h)
	}
	wantError(t, e.do("GET", "/v1/nodes/b", "", admin...), 404, "node_not_found")

	// a leaves: it stays listed, offline, with when it left.
	before := time.Now().UTC().Add(-time.Second)
	if !e.reg.Remove("a", aLink) {
		t.Fatal("remove a")
	}
	m = readJSON(t, e.do("GET", "/v1/nodes", "", admin...), 200)
	a = m["nodes"].([]any)[0].(map[string]any)
	left, err := time.Parse(time.RFC3339Nano, a["disconnected_at"].(string))
	if a["id"] != "a" || a["connected"] != false || err != nil || left.Before(before) {
		t.Fatalf("node a after it left: %v (%v)", a, err)
	}
	if _, ok := a["connected_at"]; ok {
		t.Fatalf("offline node a has connected_at: %v", a)
	}
	// Back again: connected, without the stale disconnected_at.
	e.admit("a", newFakeLink())
	m = readJSON(t, e.do("GET", "/v1/nodes", "", admin...), 200)
	if a = m["nodes"].([]any)[0].(map[string]any); a["connected"] != true || a["disconnected_at"] != nil {
		t.Fatalf("node a back: %v", a)
	}

	// A key limited to c never sees a or b, offline or not.
	m = readJSON(t, e.do("GET", "/v1/nodes", "", "Authorization", "Bearer only-c-key-0123456789"), 200)
	if nodes := m["nodes"].([]any); len(nodes) != 1 || nodes[0].(map[string]any)["id"] != "c" {
		t.Fatalf("nodes for a c-only key: %v", m)
	}
}
