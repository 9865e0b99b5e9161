package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"iop/adapters/http/console"
)

func get(t *testing.T, srv *httptest.Server, path string) (*http.Response, string) {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestServesEmbeddedFilesWithAStrictPolicy(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("GET /ui", console.Handler())
	mux.Handle("GET /ui/", console.Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for path, want := range map[string]struct{ ctype, body string }{
		"/ui/":          {"text/html", `<script src="app.js" defer></script>`},
		"/ui/app.js":    {"javascript", "function readSSE("},
		"/ui/style.css": {"text/css", "pre.out"},
	} {
		resp, body := get(t, srv, path)
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), want.ctype) || !strings.Contains(body, want.body) {
			t.Errorf("GET %s: %d %q, body has %q: %v", path, resp.StatusCode, resp.Header.Get("Content-Type"), want.body, strings.Contains(body, want.body))
		}
		csp := resp.Header.Get("Content-Security-Policy")
		for _, d := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, d) {
				t.Errorf("GET %s: CSP %q lacks %q", path, csp, d)
			}
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", path)
		}
	}

	if resp, _ := get(t, srv, "/ui"); resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d to %q, want a redirect to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, _ := get(t, srv, "/ui/nope.js"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /ui/nope.js: %d", resp.StatusCode)
	}
}

// The page loads nothing from elsewhere: every src/href in index.html is
// relative or a data: URL, and the script opens no absolute URL.
func TestNoExternalRequests(t *testing.T) {
	srv := httptest.NewServer(http.StripPrefix("", console.Handler()))
	defer srv.Close()
	for _, path := range []string{"/ui/", "/ui/app.js", "/ui/style.css"} {
		_, body := get(t, srv, path)
		for _, bad := range []string{"http://", "https://", "//cdn", "@import", "url("} {
			if strings.Contains(strings.ReplaceAll(body, "http://www.w3.org/2000/svg", ""), bad) {
				t.Errorf("%s contains %q", path, bad)
			}
		}
	}
}
