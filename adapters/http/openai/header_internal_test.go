package openaiapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
)

func headerString(h http.Header) string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%v;", k, h[k])
	}
	return b.String()
}

func TestForwardHeader(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader("{}"))
	r.ContentLength = 2
	for k, v := range map[string][]string{
		"Content-Type": {"application/json"}, "Authorization": {"Bearer edge-key"}, "X-Api-Key": {"k"},
		"Cookie": {"c"}, "X-Iop-Node": {"n1"}, "Connection": {"keep-alive, X-Drop"}, "X-Drop": {"1"},
		"Keep-Alive": {"timeout=5"}, "Accept-Encoding": {"gzip"}, "Openai-Beta": {"a", "b"}, "Content-Length": {"999"},
	} {
		r.Header[k] = v
	}
	got := forwardHeader(r)
	if want := "Content-Length=[2];Content-Type=[application/json];Openai-Beta=[a b];"; headerString(got) != want {
		t.Fatalf("forwarded %s\nwant      %s", headerString(got), want)
	}
	got["Openai-Beta"][0] = "changed"
	if r.Header["Openai-Beta"][0] != "a" {
		t.Fatal("the forwarded header shares its values with the request")
	}
}

func TestCopyResponseHeader(t *testing.T) {
	for _, c := range []struct {
		name string
		src  http.Header
		want string
	}{
		{"canonical", http.Header{"Content-Type": {"text/event-stream"}, "Connection": {"close, X-Hop"}, "X-Hop": {"1"},
			"Transfer-Encoding": {"chunked"}, "X-Request-Id": {"r1"}, "Content-Length": {"5"}},
			"Content-Length=[5];Content-Type=[text/event-stream];X-Request-Id=[r1];"},
		{"keys that meet merge in order", http.Header{"x-a": {"2"}, "X-A": {"1"}, "Keep-Alive": {"5"}, "x-b": {"3"}},
			"X-A=[1 2];X-B=[3];"},
		{"the edge's own headers are not the provider's", http.Header{"X-Iop-Node": {"spoofed"}, "X-Iop-Run-Id": {"run_x"}, "X-Request-Id": {"r1"}},
			"X-Request-Id=[r1];"},
		{"nor when spelled otherwise", http.Header{"x-iop-node": {"spoofed"}, "X-A": {"1"}}, "X-A=[1];"},
		{"a provider's CORS policy is not the edge's", http.Header{"Access-Control-Allow-Origin": {"*"},
			"Access-Control-Allow-Credentials": {"true"}, "Content-Type": {"application/json"}}, "Content-Type=[application/json];"},
		{"nor when spelled otherwise", http.Header{"access-control-allow-origin": {"https://evil.example"}, "X-A": {"1"}}, "X-A=[1];"},
		// Headers that set state for the whole origin describe the
		// provider's, not the edge's (the origin the browser sees).
		{"a provider's cookie is not the edge's", http.Header{"Set-Cookie": {"__cf_bm=abc; path=/; expires=Wed, 02-Dec-26 10:30:00 GMT; domain=.api.openai.com; HttpOnly; Secure; SameSite=None",
			"_cfuvid=x; path=/; domain=.api.openai.com; HttpOnly; Secure; SameSite=None"}, "X-A": {"1"}}, "X-A=[1];"},
		{"nor when spelled otherwise", http.Header{"set-cookie": {"a=b"}, "X-A": {"1"}}, "X-A=[1];"},
		{"nor an obsolete cookie", http.Header{"Set-Cookie2": {"a=b; Version=1"}, "X-A": {"1"}}, "X-A=[1];"},
		{"a provider's HSTS is not the edge's", http.Header{"Strict-Transport-Security": {"max-age=31536000; includeSubDomains; preload"}, "X-A": {"1"}}, "X-A=[1];"},
		{"a provider's alternative services are not the edge's", http.Header{"Alt-Svc": {`h3=":443"; ma=86400`}, "X-A": {"1"}}, "X-A=[1];"},
		{"a provider cannot clear the edge's site data", http.Header{"Clear-Site-Data": {`"cache", "cookies", "storage"`}, "X-A": {"1"}}, "X-A=[1];"},
		{"a provider's network error logging is not the edge's", http.Header{"Nel": {`{"success_fraction":0.01,"report_to":"cf-nel","max_age":604800}`}, "X-A": {"1"}}, "X-A=[1];"},
		{"nor when spelled otherwise", http.Header{"NEL": {`{"report_to":"cf-nel","max_age":604800}`}, "X-A": {"1"}}, "X-A=[1];"},
		{"a provider's report groups are not the edge's", http.Header{"Report-To": {`{"endpoints":[{"url":"https://a.nel.cloudflare.com/report/v4"}],"group":"cf-nel","max_age":604800}`}, "X-A": {"1"}}, "X-A=[1];"},
		{"a provider's reporting endpoints are not the edge's", http.Header{"Reporting-Endpoints": {`default="https://collector.example/r"`}, "X-A": {"1"}}, "X-A=[1];"},
		{"the rest of the provider's header passes", http.Header{"Content-Security-Policy": {"default-src 'none'"}, "Cache-Control": {"no-store"},
			"Openai-Processing-Ms": {"12"}, "X-Ratelimit-Remaining-Requests": {"99"}, "Cf-Ray": {"8e1"}, "Vary": {"Origin"}},
			"Cache-Control=[no-store];Cf-Ray=[8e1];Content-Security-Policy=[default-src 'none'];Openai-Processing-Ms=[12];Vary=[Origin];X-Ratelimit-Remaining-Requests=[99];"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := http.Header{}
			copyResponseHeader(dst, c.src)
			if headerString(dst) != c.want {
				t.Fatalf("copied %s\nwant   %s", headerString(dst), c.want)
			}
		})
	}
}

// BenchmarkRelayHeaders is the header work of one relayed request: the
// caller's header forwarded to the node and the provider's copied back.
func BenchmarkRelayHeaders(b *testing.B) {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader("{}"))
	r.ContentLength = 80
	r.Header = http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer k"}, "Accept": {"*/*"},
		"User-Agent": {"OpenAI/Python 1.0"}, "X-Stainless-Lang": {"python"}, "Accept-Encoding": {"gzip"}}
	resp := http.Header{"Content-Type": {"text/event-stream"}, "Cache-Control": {"no-cache"}, "X-Request-Id": {"r1"},
		"Date": {"Tue, 01 Dec 2026 05:00:00 GMT"}}
	b.ReportAllocs()
	for b.Loop() {
		_ = forwardHeader(r)
		copyResponseHeader(make(http.Header, 8), resp)
	}
}
