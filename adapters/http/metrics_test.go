package httpapi_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	httpapi "iop/adapters/http"
	"iop/adapters/metrics/prom"
	"iop/domain"
)

// /metrics covers the whole edge: series per node, and totals (tunnel
// bytes, run durations, registrations) that no node filter could split. A
// key limited to some nodes must not see the others there, so it is
// refused; a key without a limit reads every node's series.
func TestMetricsRefusedToNodeLimitedKey(t *testing.T) {
	keys := []httpapi.APIKey{
		apiKey("app-key-0123456789", "app", []string{"gpu-1"}, domain.ScopeRead),
		apiKey("ops-key-0123456789", "ops", nil, domain.ScopeRead),
	}
	e := newEnvWithDeps(t, keys, func(e *env, d *httpapi.Deps) {
		d.Metrics = prom.New(prom.Sources{Registry: e.reg}).Handler()
	}, testNode{"gpu-1", newFakeLink()}, testNode{"secret-box", newFakeLink()})

	resp := e.do("GET", "/metrics", "", "Authorization", "Bearer app-key-0123456789")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || strings.Contains(string(b), "secret-box") {
		t.Fatalf("node-limited key on /metrics: %d %s", resp.StatusCode, b)
	}
	wantError(t, e.do("GET", "/metrics", "", "Authorization", "Bearer app-key-0123456789"), http.StatusForbidden, domain.CodeForbidden)

	resp = e.do("GET", "/metrics", "", "Authorization", "Bearer ops-key-0123456789")
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `node="secret-box"`) {
		t.Fatalf("unlimited key on /metrics: %d %.300s", resp.StatusCode, b)
	}
}
