package httpapi_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	httpapi "iop/adapters/http"
	"iop/application/edge"
	"iop/domain"
)

// doHost sends a request with the given Host header and extra headers.
func (e *env) doHost(method, path, host, body string, header ...string) *http.Response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// A web page open in the operator's browser can send a "simple" POST (no
// preflight: text/plain body) to the keyless edge on 127.0.0.1. Every
// state-changing route refuses it, whether the browser says where it comes
// from with Sec-Fetch-Site or, older, only with Origin; nothing starts.
func TestCrossSiteBrowserPostIsRefused(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})
	e := newEnv(t, testNode{"n1", link})
	var reloads atomic.Int32
	e.reload = func(context.Context) (edge.ReloadResult, error) {
		reloads.Add(1)
		return edge.ReloadResult{}, nil
	}
	run := `{"adapter":"exec","target":"echo","input":"from evil.example","background":true}`
	cases := []struct {
		name, method, path, body string
		header                   []string
	}{
		{"cross-site run", "POST", "/v1/runs", run,
			[]string{"Content-Type", "text/plain;charset=UTF-8", "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
		// Another port of localhost is the same site, not the same origin:
		// any local dev server's page could otherwise drive the edge.
		{"same-site other port", "POST", "/v1/runs", run,
			[]string{"Content-Type", "text/plain", "Origin", "http://localhost:3000", "Sec-Fetch-Site", "same-site"}},
		{"old browser, Origin only", "POST", "/v1/runs", run,
			[]string{"Content-Type", "text/plain", "Origin", "https://evil.example"}},
		{"reload", "POST", "/v1/admin/reload", "", []string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
		{"node command", "POST", "/v1/nodes/n1/commands", `{"command":"usage_status"}`,
			[]string{"Content-Type", "text/plain", "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
		{"end session", "DELETE", "/v1/sessions/s1?adapter=exec&node=n1&target=echo", "",
			[]string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
		{"unknown route", "POST", "/v1/nope", "x", []string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, e.do(c.method, c.path, c.body, c.header...), http.StatusForbidden, "cross_origin")
		})
	}
	if n := len(link.requests()); n > 0 {
		t.Fatalf("cross-site requests started %d run(s)", n)
	}
	if got := link.terminateCalls(); len(got) > 0 {
		t.Fatalf("cross-site requests ended sessions: %v", got)
	}
	if n := reloads.Load(); n > 0 {
		t.Fatalf("cross-site requests reloaded the config %d time(s)", n)
	}
}

// What must keep working: the console (same origin, as the browser says),
// the CLI, SDKs and `curl -d` (no Origin, no Sec-Fetch-Site, any Content-Type),
// and reads, which a cross-site page may send but cannot read the answer of.
func TestSameOriginAndNonBrowserCallersServed(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})
	e := newEnv(t, testNode{"n1", link})
	run := `{"adapter":"exec","target":"echo","input":"hi","background":true}`
	for _, c := range []struct {
		name   string
		header []string
	}{
		{"console", []string{"Content-Type", "application/json", "Origin", e.srv.URL, "Sec-Fetch-Site", "same-origin"}},
		{"console, old browser", []string{"Content-Type", "application/json", "Origin", e.srv.URL}},
		{"typed into the address bar", []string{"Sec-Fetch-Site", "none"}},
		{"curl -d", []string{"Content-Type", "application/x-www-form-urlencoded"}},
		{"SDK", []string{"Content-Type", "application/json"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			readJSON(t, e.do("POST", "/v1/runs", run, c.header...), http.StatusAccepted)
		})
	}
	readJSON(t, e.do("GET", "/v1/nodes", "", "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"), http.StatusOK)
	if n := len(link.requests()); n != 5 {
		t.Fatalf("%d runs started, want 5", n)
	}
}

// DNS rebinding: a page on evil.example re-points its name at 127.0.0.1, so
// its requests are same-origin to the browser but carry Host: evil.example.
// A keyless edge (which serves only on loopback) answers no such request,
// reads included, and starts nothing.
func TestForeignHostRefusedWithoutKeys(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})
	e := newEnv(t, testNode{"n1", link})
	for _, path := range []string{"/v1/nodes", "/v1/runs", "/v1/events", "/healthz", "/v1/nope"} {
		wantError(t, e.doHost("GET", path, "evil.example:7701", ""), http.StatusMisdirectedRequest, "host_not_allowed")
	}
	wantError(t, e.doHost("POST", "/v1/runs", "evil.example:7701",
		`{"adapter":"exec","target":"echo","background":true}`,
		"Content-Type", "application/json", "Origin", "http://evil.example:7701", "Sec-Fetch-Site", "same-origin"),
		http.StatusMisdirectedRequest, "host_not_allowed")
	if n := len(link.requests()); n > 0 {
		t.Fatalf("a rebound request started %d run(s)", n)
	}
	// Loopback literals and localhost, on any port (an SSH tunnel's, a
	// local proxy's that passes its upstream's address), are served.
	for _, host := range []string{"127.0.0.1:7701", "127.0.0.2", "[::1]:7701", "[::1]", "localhost:8080", "LocalHost"} {
		readJSON(t, e.doHost("GET", "/v1/nodes", host, ""), http.StatusOK)
	}
}

// With API keys a foreign Host is served: a rebound page holds no key, and
// an edge behind a proxy or on a public name must answer its own name.
func TestForeignHostServedWithKeys(t *testing.T) {
	e := newEnvWithKeys(t, []httpapi.APIKey{apiKey("reader-key-0123456789", "reader", nil, domain.ScopeRead)},
		testNode{"n1", newFakeLink()})
	readJSON(t, e.doHost("GET", "/v1/nodes", "edge.example.com", "", "Authorization", "Bearer reader-key-0123456789"), http.StatusOK)
	wantError(t, e.doHost("GET", "/v1/nodes", "edge.example.com", ""), http.StatusUnauthorized, "unauthorized")
}

// A keyless edge on a non-loopback address (http.allow_unauthenticated)
// serves whatever name its network calls it by; only the cross-origin
// check stands there.
func TestForeignHostServedOnUnauthenticatedNetworkEdge(t *testing.T) {
	e := newEnvWithDeps(t, nil, func(e *env, _ *httpapi.Deps) { e.listen = "0.0.0.0:7701" })
	srv := e.srv
	req, _ := http.NewRequest("GET", srv.URL+"/v1/nodes", nil)
	req.Host = "gpu-edge.lan:7701"
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readJSON(t, resp, http.StatusOK)
}

// The passthrough surfaces refuse a cross-site POST before it reaches a
// provider (spending its key), in their clients' dialect.
func TestCrossSitePostRefusedOnPassthroughSurfaces(t *testing.T) {
	var reached atomic.Int32
	e := newEnvWithDeps(t, nil, func(_ *env, d *httpapi.Deps) {
		d.OpenAI = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			reached.Add(1)
			w.WriteHeader(299)
		})
	})
	srv := e.srv
	for path, want := range map[string]string{
		"/v1/chat/completions": `"code":"cross_origin"`,
		"/v1/messages":         `"type":"permission_error"`,
		"/api/chat":            `{"error":"`,
		"/api/pull":            `{"error":"`,
	} {
		req, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(`{"model":"m","messages":[]}`))
		req.Header.Set("Content-Type", "text/plain")
		req.Header.Set("Origin", "https://evil.example")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), want) {
			t.Errorf("cross-site POST %s: %d %s, want 403 with %s", path, resp.StatusCode, b, want)
		}
	}
	if n := reached.Load(); n > 0 {
		t.Fatalf("cross-site POSTs reached the provider surface %d times", n)
	}
	// The same request from an SDK (no browser headers) goes through.
	resp, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 299 {
		t.Fatalf("SDK POST: %d", resp.StatusCode)
	}
}

// metrics.listen checks no key; on a loopback address a rebound page's
// request (its own name as Host) is refused, so it cannot read the metrics.
// On a network address Prometheus calls it by any name.
func TestMetricsOnlyListenerChecksHostOnLoopback(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "iop_nodes_connected 1\n") })
	get := func(addr, host string) *http.Response {
		srv := httptest.NewServer(httpapi.MetricsOnlyHandler(addr, metrics))
		defer srv.Close()
		req, _ := http.NewRequest("GET", srv.URL+"/metrics", nil)
		req.Host = host
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	wantError(t, get("127.0.0.1:9464", "evil.example:9464"), http.StatusMisdirectedRequest, "host_not_allowed")
	for _, c := range []struct{ addr, host string }{
		{"127.0.0.1:9464", "127.0.0.1:9464"}, {"localhost:9464", "localhost:9464"}, {"[::1]:9464", "[::1]:9464"},
		{"0.0.0.0:9464", "prometheus-target.lan:9464"}, {":9464", "edge.example.com"},
	} {
		resp := get(c.addr, c.host)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "iop_nodes_connected") {
			t.Fatalf("metrics.listen %s, Host %s: %d %s", c.addr, c.host, resp.StatusCode, b)
		}
	}
}

// No answer of the API runs as a page on the edge's origin: a provider's
// HTML relayed on a passthrough GET a browser can be sent to (a keyless
// loopback edge needs no key) is sandboxed and not sniffed, so its script
// cannot use the edge's write routes as same-origin. The iop routes' own
// answers carry the same policy; the console keeps its own.
func TestAnswersAreNotPagesOfTheEdgesOrigin(t *testing.T) {
	e := newEnvWithDeps(t, nil, func(e *env, d *httpapi.Deps) {
		e.listen = "127.0.0.1:7701"
		d.OpenAI = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			// As a passthrough copies a provider's headers: appended.
			w.Header().Add("Content-Type", "text/html; charset=utf-8")
			w.Header().Add("Content-Security-Policy", "script-src 'unsafe-inline'")
			io.WriteString(w, "<html><script>fetch('/v1/admin/reload',{method:'POST'})</script></html>")
		})
	})
	srv := e.srv
	for _, path := range []string{"/api/version", "/v1/responses/resp_x", "/v1/nodes", "/no/such/route"} {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Host = "127.0.0.1:7701"
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		req.Header.Set("Sec-Fetch-Mode", "navigate")
		req.Header.Set("Sec-Fetch-Dest", "document")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if csp := resp.Header.Values("Content-Security-Policy"); len(csp) == 0 || !strings.HasPrefix(csp[0], "sandbox;") || !strings.Contains(csp[0], "default-src 'none'") {
			t.Errorf("GET %s (%d): Content-Security-Policy %q, want a sandbox first", path, resp.StatusCode, csp)
		}
		if v := resp.Header.Values("X-Content-Type-Options"); len(v) == 0 || v[0] != "nosniff" {
			t.Errorf("GET %s: X-Content-Type-Options %q", path, v)
		}
	}
}
