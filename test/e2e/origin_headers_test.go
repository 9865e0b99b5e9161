package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A provider's headers that set state for its whole origin describe the
// provider's origin, not the edge's, which is the origin the browser sees:
// relayed, api.openai.com's Cloudflare cookie would be stored for the
// edge's host, its HSTS (includeSubDomains) pinned on the edge's name,
// its Alt-Svc advertised for the edge, its Clear-Site-Data would wipe the
// web console's storage, and its NEL/Report-To would send reports about
// the edge's origin to the provider's collector. Through a real edge and
// node, none of them reaches the caller; the rest of the header does.
func TestProviderOriginWideHeadersDoNotReachTheCaller(t *testing.T) {
	t.Parallel()
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h := w.Header()
		// What api.openai.com answers (behind Cloudflare), plus the rest.
		h["Set-Cookie"] = []string{
			"__cf_bm=abc; path=/; expires=Wed, 02-Dec-26 10:30:00 GMT; domain=.api.openai.com; HttpOnly; Secure; SameSite=None",
			"_cfuvid=def; path=/; domain=.api.openai.com; HttpOnly; Secure; SameSite=None",
			"edge_host_only=ghi; path=/",
		}
		h.Set("Strict-Transport-Security", "max-age=31536000; includeSubDomains; preload")
		h.Set("Alt-Svc", `h3=":443"; ma=86400`)
		h.Set("Clear-Site-Data", `"cache", "cookies", "storage"`)
		h.Set("NEL", `{"success_fraction":0.01,"report_to":"cf-nel","max_age":604800}`)
		h.Set("Report-To", `{"endpoints":[{"url":"https://a.nel.cloudflare.com/report/v4?s=x"}],"group":"cf-nel","max_age":604800}`)
		h.Set("Reporting-Endpoints", `default="https://collector.example/r"`)
		h.Set("Openai-Processing-Ms", "12")
		h.Set("X-Request-Id", "req_123")
		h.Set("Cf-Ray", "8e1-SJC")
		h.Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","model":"m-hdr","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(provider.Close)
	e := startEdge(t, fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: oai, type: openai, base_url: %q, models: [m-hdr]}
`, testToken, provider.URL))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")

	resp, err := http.Post(e.url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m-hdr","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"content":"hi"`) {
		t.Fatalf("chat completion: %d %s", resp.StatusCode, b)
	}
	for _, k := range []string{"Set-Cookie", "Strict-Transport-Security", "Alt-Svc", "Clear-Site-Data", "Nel", "Report-To", "Reporting-Endpoints"} {
		if v, ok := resp.Header[k]; ok {
			t.Errorf("the provider's %s: %q reached the caller", k, v)
		}
	}
	for k, want := range map[string]string{"Openai-Processing-Ms": "12", "X-Request-Id": "req_123", "Cf-Ray": "8e1-SJC", "Content-Type": "application/json"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s: %q, want the provider's %q", k, got, want)
		}
	}
}
