package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// A provider that allows every origin (vLLM, LiteLLM and OpenAI answer
// "Access-Control-Allow-Origin: *"; llama.cpp's server and Ollama, for a
// page on another port of localhost, echo the page's Origin) must not lend
// that permission to the edge: a page of another origin open in the
// operator's browser could otherwise read what a keyless edge relays on a
// passthrough GET (a stored response on /v1/responses/{id}, /api/version).
// The edge takes no cross-origin writes, so it allows no cross-origin reads
// either: no Access-Control-* header of the provider's reaches the browser.
func TestProviderCORSHeadersDoNotReachTheBrowser(t *testing.T) {
	t.Parallel()
	e := startEdgeWithCORSProvider(t)

	for _, origin := range []string{"https://evil.example", "http://localhost:3000"} {
		// What a page's fetch() sends: a GET needs no preflight.
		req, _ := http.NewRequest(http.MethodGet, e.url+"/api/version", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		req.Header.Set("Sec-Fetch-Mode", "cors")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"version"`) {
			t.Fatalf("GET /api/version from %s: %d %s", origin, resp.StatusCode, b)
		}
		for k, v := range resp.Header {
			if strings.HasPrefix(k, "Access-Control-") {
				t.Errorf("GET /api/version from %s: the provider's %s: %q reached the browser", origin, k, v)
			}
		}
	}
}

// startEdgeWithCORSProvider starts a keyless edge whose node n1 has an
// Ollama-type provider answering every request with CORS headers that allow
// the caller's origin, as llama.cpp's server does.
func startEdgeWithCORSProvider(t *testing.T) *edge {
	t.Helper()
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" {
			origin = "*"
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", origin)
		h.Set("Access-Control-Allow-Credentials", "true")
		h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "*")
		h.Set("Access-Control-Expose-Headers", "*")
		h.Set("Content-Type", "application/json")
		io.WriteString(w, `{"version":"0.12.6"}`)
	}))
	t.Cleanup(provider.Close)
	e := startEdge(t, fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: ollama, type: ollama, base_url: %q}
`, testToken, provider.URL))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	return e
}

// The same in a real browser: a page served from another origin (another
// port of 127.0.0.1) fetches a relayed GET from the keyless edge; Chromium
// must refuse it the answer.
func TestCrossOriginPageCannotReadRelayedAnswer(t *testing.T) {
	b := newBrowser(t)
	e := startEdgeWithCORSProvider(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, "<!doctype html><title>another origin</title><p>elsewhere</p>")
	}))
	t.Cleanup(page.Close)
	b.do(15*time.Second, "open the other origin's page", chromedp.Navigate(page.URL), chromedp.WaitVisible(chromedp.CSS(`p`)))
	evalJS[bool](b, fmt.Sprintf(`(window.__got = '', fetch(%q).then((r) => r.text()).then((t) => { window.__got = 'read: ' + t }, (err) => { window.__got = 'refused: ' + err }), true)`,
		e.url+"/api/version"))
	b.waitJS(10*time.Second, "the fetch to settle", `window.__got !== ''`)
	if got := evalJS[string](b, `window.__got`); !strings.HasPrefix(got, "refused: ") {
		t.Fatalf("a page of another origin fetched the edge's /api/version: %s", got)
	}
}
