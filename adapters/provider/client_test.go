package provider_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/adapters/provider"
	"iop/domain"
	"iop/internal/silentpeer"
)

func TestUpstreamURL(t *testing.T) {
	cases := []struct {
		name        string
		base, pfx   string
		path, query string
		want        string
	}{
		{"passthrough", "http://127.0.0.1:11434", "", "/v1/chat/completions", "", "http://127.0.0.1:11434/v1/chat/completions"},
		{"trailing slash on base", "http://gpu:8000/", "", "/v1/models", "", "http://gpu:8000/v1/models"},
		{"ollama native path", "http://h:11434", "", "/api/tags", "", "http://h:11434/api/tags"},
		{"query kept", "http://h", "", "/v1/models", "a=1&b=2", "http://h/v1/models?a=1&b=2"},
		{"prefix replaces /v1", "http://h", "/openai/v1", "/v1/chat/completions", "", "http://h/openai/v1/chat/completions"},
		{"prefix with trailing slash", "http://h", "/api/v2/", "/v1/embeddings", "", "http://h/api/v2/embeddings"},
		{"prefix for bare /v1", "http://h", "/x", "/v1", "", "http://h/x"},
		{"prefix ignores other paths", "http://h", "/x", "/api/chat", "", "http://h/api/chat"},
		{"prefix needs a path boundary", "http://h", "/x", "/v10/models", "", "http://h/v10/models"},
		{"empty prefix replaces nothing", "http://h/base", "", "/v1/models", "", "http://h/base/v1/models"},
		// The path is the caller's escaped path: its escapes are kept, so
		// none becomes a query, a fragment or a separator.
		{"escaped ? stays in the path", "http://h", "", "/api/blobs/sha256%3Fx=1", "", "http://h/api/blobs/sha256%3Fx=1"},
		{"escaped # stays in the path", "http://h", "", "/api/blobs/a%23b", "", "http://h/api/blobs/a%23b"},
		{"escaped / stays in the segment", "http://h", "", "/api/blobs/a%2Fb", "", "http://h/api/blobs/a%2Fb"},
		{"escaped % stays escaped", "http://h", "", "/api/blobs/sha256%25zz", "", "http://h/api/blobs/sha256%25zz"},
		{"escapes kept with a query", "http://h", "", "/v1/a%3Fb", "c=%3F", "http://h/v1/a%3Fb?c=%3F"},
		{"escaped base path kept", "http://h/my%20base/", "", "/v1/a%2Fb", "", "http://h/my%20base/v1/a%2Fb"},
		{"prefix keeps the rest escaped", "http://h", "/openai/v1", "/v1/files/a%2Fb", "", "http://h/openai/v1/files/a%2Fb"},
		{"prefix for /v1/", "http://h", "/x", "/v1/", "", "http://h/x/"},
		{"prefix for an escaped v1", "http://h", "/x", "/%761/models", "", "http://h/x/models"},
		{"base credentials kept", "http://u:p@h:1", "", "/v1/models", "", "http://u:p@h:1/v1/models"},
		// A prefix is spelled as the openai adapter takes it: a missing
		// leading slash added, "/" for none, and what a path must escape
		// escaped, so the caller's escapes stay valid after it.
		{"prefix without a leading slash", "http://h", "api/v1", "/v1/chat/completions", "", "http://h/api/v1/chat/completions"},
		{"prefix without a slash after a base path", "http://h/openai", "api/v1", "/v1/chat/completions", "", "http://h/openai/api/v1/chat/completions"},
		{"prefix / for none", "http://h", "/", "/v1/models", "", "http://h/models"},
		{"prefix with a space", "http://h", "/my api/v1", "/v1/files/a%2Fb", "", "http://h/my%20api/v1/files/a%2Fb"},
		{"prefix beyond ASCII", "http://h", "/ü/v1", "/v1/files/a%2Fb", "", "http://h/%C3%BC/v1/files/a%2Fb"},
		{"prefix written escaped", "http://h", "/my%20api/v1", "/v1/models", "", "http://h/my%20api/v1/models"},
		// The base URL's own query (Azure's api-version) is kept, first.
		{"base query kept", "https://r.openai.azure.com/openai/deployments/d?api-version=2024-10-21", "", "/chat/completions", "", "https://r.openai.azure.com/openai/deployments/d/chat/completions?api-version=2024-10-21"},
		{"base query then the caller's", "http://h/?k=1", "", "/v1/models", "a=2", "http://h/v1/models?k=1&a=2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := provider.UpstreamURL(domain.ProviderConfig{BaseURL: c.base, PathPrefix: c.pfx}, c.path, c.query)
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != c.want {
				t.Fatalf("UpstreamURL = %q, want %q", got, c.want)
			}
		})
	}
}

// A path no URL can carry (a "%" that starts no escape) is invalid_request
// with a fixed message: the parser's error would quote the whole URL, base
// URL credentials, host and port included, to the caller and the edge log.
func TestUpstreamURLErrorHidesTheBaseURL(t *testing.T) {
	_, err := provider.UpstreamURL(domain.ProviderConfig{Name: "p", BaseURL: "http://admin:s3cret@127.0.0.1:41165/base"}, "/api/blobs/sha256%zz", "")
	if domain.CodeOf(err) != domain.CodeInvalidRequest {
		t.Fatalf("err = %v, want invalid_request", err)
	}
	for _, leak := range []string{"s3cret", "admin", "127.0.0.1", "41165", "base"} {
		if strings.Contains(err.Error(), leak) {
			t.Fatalf("error %q shows %q", err, leak)
		}
	}
}

func TestCleanRequestHeader(t *testing.T) {
	in := http.Header{
		"Content-Type":        {"application/json"},
		"Accept":              {"text/event-stream"},
		"Connection":          {"keep-alive, X-Secret-Hop", "Other-Hop"},
		"X-Secret-Hop":        {"1"},
		"Other-Hop":           {"1"},
		"Keep-Alive":          {"timeout=5"},
		"Proxy-Authorization": {"Basic abc"},
		"Te":                  {"trailers"},
		"Trailer":             {"X"},
		"Transfer-Encoding":   {"chunked"},
		"Upgrade":             {"h2c"},
		"Proxy-Connection":    {"keep-alive"},
		"Authorization":       {"Bearer caller-key"},
		"Accept-Encoding":     {"gzip"},
		"Content-Length":      {"12"},
		"X-Iop-Node":          {"n1"},
		"X-IOP-Whatever":      {"v"}, // non-canonical on purpose
		"authorization":       {"Bearer sneaky"},
		"OpenAI-Organization": {"org"},
		"X-Api-Key":           {"caller-anthropic-key"},
		"api-key":             {"caller-azure-key"},
		"Cookie":              {"session=1"},
	}
	out := provider.CleanRequestHeader(in)
	want := http.Header{"Content-Type": {"application/json"}, "Accept": {"text/event-stream"}, "Openai-Organization": {"org"}}
	if !equalHeader(out, want) {
		t.Fatalf("CleanRequestHeader = %v, want %v", out, want)
	}
	if in.Get("Authorization") == "" {
		t.Fatal("input header was modified")
	}
	if got := provider.CleanRequestHeader(nil); got == nil || len(got) != 0 {
		t.Fatalf("CleanRequestHeader(nil) = %v, want empty non-nil", got)
	}
}

func TestCleanResponseHeader(t *testing.T) {
	in := http.Header{
		"Content-Type":      {"text/event-stream"},
		"Content-Length":    {"99"},
		"Connection":        {"close, X-Hop"},
		"X-Hop":             {"1"},
		"Transfer-Encoding": {"chunked"},
		"X-Request-Id":      {"abc"},
		"Retry-After":       {"3"},
	}
	in["x-lower"] = []string{"v"} // non-canonical on purpose
	out := provider.CleanResponseHeader(in)
	want := http.Header{"Content-Type": {"text/event-stream"}, "Content-Length": {"99"}, "X-Request-Id": {"abc"}, "Retry-After": {"3"}, "X-Lower": {"v"}}
	if !equalHeader(out, want) {
		t.Fatalf("CleanResponseHeader = %v, want %v", out, want)
	}
	// Adding to the copy never changes the input.
	out.Add("Retry-After", "4")
	if v := in.Values("Retry-After"); len(v) != 1 || v[0] != "3" {
		t.Fatalf("input changed to %q", v)
	}
	// Do's in-place variant gives the same header.
	if got := provider.StripResponseHeader(in); !equalHeader(got, want) {
		t.Fatalf("StripResponseHeader = %v, want %v", got, want)
	}
}

func TestDoSendsAnthropicKeyAndVersion(t *testing.T) { bothPaths(t, testDoSendsAnthropicKeyAndVersion) }

func testDoSendsAnthropicKeyAndVersion(t *testing.T, path clientPath) {
	t.Setenv("IOP_TEST_ANTHROPIC_KEY", "sk-ant-node")
	got := make(chan http.Header, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		_, _ = io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	c := path.new(t, provider.Options{})
	p := domain.ProviderConfig{Name: "a", Type: domain.ProviderAnthropic, BaseURL: srv.URL, APIKeyEnv: "IOP_TEST_ANTHROPIC_KEY"}
	for _, tc := range []struct{ callerVersion, want string }{{"", provider.AnthropicVersion}, {"2099-01-01", "2099-01-01"}} {
		h := http.Header{"X-Api-Key": {"sk-caller-for-the-edge"}, "Authorization": {"Bearer caller"}, "Content-Type": {"application/json"}}
		if tc.callerVersion != "" {
			h.Set("Anthropic-Version", tc.callerVersion)
		}
		resp, err := c.Do(context.Background(), p, domain.TunnelRequest{Provider: "a", Method: http.MethodPost, Path: "/v1/messages", Header: domain.Header(h), Body: []byte(`{}`)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		up := <-got
		if k := up.Values("X-Api-Key"); len(k) != 1 || k[0] != "sk-ant-node" {
			t.Fatalf("upstream x-api-key = %q, want only the node's key", k)
		}
		if up.Get("Authorization") != "" {
			t.Fatalf("caller's Authorization reached an anthropic provider: %q", up.Get("Authorization"))
		}
		if v := up.Values("Anthropic-Version"); len(v) != 1 || v[0] != tc.want {
			t.Fatalf("anthropic-version = %q, want %q", v, tc.want)
		}
	}
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range b {
		if strings.Join(a[k], "\x00") != strings.Join(v, "\x00") {
			return false
		}
	}
	return true
}

func TestDoSendsCleanHeadersAndNodeKey(t *testing.T) { bothPaths(t, testDoSendsCleanHeadersAndNodeKey) }

func testDoSendsCleanHeadersAndNodeKey(t *testing.T, path clientPath) {
	t.Setenv("IOP_TEST_PROVIDER_KEY", "sk-node-secret")
	got := make(chan *http.Request, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		got <- r
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Upstream", "yes")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer srv.Close()

	c := path.new(t, provider.Options{})
	p := domain.ProviderConfig{Name: "p", Type: domain.ProviderOpenAI, BaseURL: srv.URL, APIKeyEnv: "IOP_TEST_PROVIDER_KEY"}
	req := domain.TunnelRequest{
		Provider: "p", Method: http.MethodPost, Path: "/v1/chat/completions", Query: "x=1",
		Header: domain.Header{
			"Authorization": {"Bearer caller"}, "Connection": {"X-Drop"}, "X-Drop": {"1"},
			"X-Iop-Node": {"n1"}, "Content-Type": {"application/json"}, "Keep-Alive": {"1"},
		},
		Body: []byte(`{"model":"m"}`),
	}
	resp, err := c.Do(context.Background(), p, req, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(body) != `{"ok":true}` || resp.Status != 200 || resp.Header.Get("X-Upstream") != "yes" || resp.Header.Get("Content-Length") != "11" {
		t.Fatalf("response = %d %v %q", resp.Status, resp.Header, body)
	}
	r := <-got
	if a := r.Header.Values("Authorization"); len(a) != 1 || a[0] != "Bearer sk-node-secret" {
		t.Fatalf("upstream Authorization = %q, want only the node's key", a)
	}
	for _, k := range []string{"X-Drop", "X-Iop-Node", "Keep-Alive"} {
		if r.Header.Get(k) != "" {
			t.Errorf("upstream saw %s", k)
		}
	}
	if r.URL.Path != "/v1/chat/completions" || r.URL.RawQuery != "x=1" || r.Method != http.MethodPost {
		t.Errorf("upstream request = %s %s?%s", r.Method, r.URL.Path, r.URL.RawQuery)
	}
	if b, _ := io.ReadAll(r.Body); string(b) != `{"model":"m"}` || r.ContentLength != int64(len(b)) {
		t.Errorf("upstream body = %q (length %d)", b, r.ContentLength)
	}
}

func TestDoWithoutKeyEnvDropsCallerAuthorization(t *testing.T) {
	bothPaths(t, testDoWithoutKeyEnvDropsCallerAuthorization)
}

func testDoWithoutKeyEnvDropsCallerAuthorization(t *testing.T, path clientPath) {
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	defer srv.Close()
	c := path.new(t, provider.Options{})
	resp, err := c.Do(context.Background(), domain.ProviderConfig{Name: "p", BaseURL: srv.URL, APIKeyEnv: "IOP_TEST_UNSET_KEY_VAR"},
		domain.TunnelRequest{Method: http.MethodGet, Path: "/v1/models", Header: domain.Header{"Authorization": {"Bearer caller"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if h := <-got; h.Get("Authorization") != "" {
		t.Fatalf("upstream saw Authorization %q", h.Get("Authorization"))
	}
}

func TestDoStreamsBodyWithDeclaredLength(t *testing.T) {
	bothPaths(t, testDoStreamsBodyWithDeclaredLength)
}

func testDoStreamsBodyWithDeclaredLength(t *testing.T, path clientPath) {
	type seen struct {
		body []byte
		cl   int64
		te   []string
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{b, r.ContentLength, r.TransferEncoding}
	}))
	defer srv.Close()
	c := path.new(t, provider.Options{})
	p := domain.ProviderConfig{Name: "p", BaseURL: srv.URL}

	rest := strings.Repeat("x", 100_000)
	req := domain.TunnelRequest{Method: http.MethodPost, Path: "/v1/embeddings", Body: []byte("head-"),
		Header: domain.Header{"Content-Length": {"100005"}}}
	resp, err := c.Do(context.Background(), p, req, strings.NewReader(rest))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	s := <-got
	if string(s.body) != "head-"+rest || s.cl != 100_005 {
		t.Fatalf("upstream got %d bytes, Content-Length %d", len(s.body), s.cl)
	}

	// Without a declared length the body is chunked.
	req.Header = nil
	resp, err = c.Do(context.Background(), p, req, strings.NewReader(rest))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	s = <-got
	if string(s.body) != "head-"+rest || s.cl != -1 || len(s.te) != 1 || s.te[0] != "chunked" {
		t.Fatalf("upstream got %d bytes, Content-Length %d, TE %v", len(s.body), s.cl, s.te)
	}
}

func TestDoDoesNotFollowRedirects(t *testing.T) { bothPaths(t, testDoDoesNotFollowRedirects) }

func testDoDoesNotFollowRedirects(t *testing.T, path clientPath) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere" {
			t.Error("redirect was followed")
		}
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	}))
	defer srv.Close()
	c := path.new(t, provider.Options{})
	resp, err := c.Do(context.Background(), domain.ProviderConfig{Name: "p", BaseURL: srv.URL}, domain.TunnelRequest{Path: "/v1/models"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.Status != http.StatusFound || resp.Header.Get("Location") != "/elsewhere" {
		t.Fatalf("got %d Location=%q, want the 302 itself", resp.Status, resp.Header.Get("Location"))
	}
}

func TestDoConnectRefused(t *testing.T) { bothPaths(t, testDoConnectRefused) }

func testDoConnectRefused(t *testing.T, path clientPath) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	c := path.new(t, provider.Options{})
	_, err = c.Do(context.Background(), domain.ProviderConfig{Name: "p", BaseURL: "http://" + addr}, domain.TunnelRequest{Path: "/v1/models"}, nil)
	if !errors.Is(err, &domain.Error{Code: domain.CodeProviderUnreachable}) {
		t.Fatalf("err = %v, want provider_unreachable", err)
	}
}

func TestDoHeaderTimeout(t *testing.T) { bothPaths(t, testDoHeaderTimeout) }

func testDoHeaderTimeout(t *testing.T, path clientPath) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := path.new(t, provider.Options{HeaderTimeout: 100 * time.Millisecond})
	start := time.Now()
	_, err := c.Do(context.Background(), domain.ProviderConfig{Name: "p", BaseURL: srv.URL}, domain.TunnelRequest{Path: "/v1/models"}, nil)
	if !errors.Is(err, domain.ErrTimeout) {
		t.Fatalf("err = %v, want timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timeout took %v", d)
	}
}

func TestDoCancelledBeforeHeaders(t *testing.T) { bothPaths(t, testDoCancelledBeforeHeaders) }

func testDoCancelledBeforeHeaders(t *testing.T, path clientPath) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	c := path.new(t, provider.Options{})
	_, err := c.Do(ctx, domain.ProviderConfig{Name: "p", BaseURL: srv.URL}, domain.TunnelRequest{Path: "/v1/models"}, nil)
	if domain.CodeOf(err) != domain.CodeCancelled {
		t.Fatalf("err = %v, want cancelled", err)
	}
}

func TestCancelClosesUpstreamConnection(t *testing.T) {
	bothPaths(t, testCancelClosesUpstreamConnection)
}

func testCancelClosesUpstreamConnection(t *testing.T, path clientPath) {
	closed := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"x\":1}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the provider sees the caller leave
		close(closed)
	}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	c := path.new(t, provider.Options{})
	resp, err := c.Do(ctx, domain.ProviderConfig{Name: "p", BaseURL: srv.URL}, domain.TunnelRequest{Method: http.MethodPost, Path: "/v1/chat/completions", Body: []byte("{}")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); n == 0 || err != nil {
		t.Fatalf("first read = %d, %v", n, err)
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		readErr <- err
	}()
	start := time.Now()
	cancel()
	select {
	case <-closed:
	case <-time.After(time.Second):
		t.Fatal("provider did not see the request end within 1s of cancel")
	}
	t.Logf("provider saw the close after %v", time.Since(start))
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("body read ended cleanly after cancel")
		}
	case <-time.After(time.Second):
		t.Fatal("body read did not end after cancel")
	}
}

func TestDoReportsUsageAfterBody(t *testing.T) { bothPaths(t, testDoReportsUsageAfterBody) }

func testDoReportsUsageAfterBody(t *testing.T, path clientPath) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, `{"model":"llama3.2","message":{"content":"hi"},"done":false}`+"\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, `{"model":"llama3.2","done":true,"done_reason":"stop","prompt_eval_count":7,"eval_count":3,"total_duration":5000000}`+"\n")
	}))
	defer srv.Close()
	c := path.new(t, provider.Options{})
	resp, err := c.Do(context.Background(), domain.ProviderConfig{Name: "p", BaseURL: srv.URL}, domain.TunnelRequest{Method: http.MethodPost, Path: "/api/chat"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	u := resp.Usage()
	if u == nil || u.PromptTokens != 7 || u.CompletionTokens != 3 || u.TotalTokens != 10 || u.Model != "llama3.2" || u.StopReason != "stop" || u.DurationMS != 5 {
		t.Fatalf("usage = %+v", u)
	}
}

// clientPath is one of the client's two ways to a provider: the lean
// HTTP/1.1 path (plain http, no proxy) or net/http.Transport.
type clientPath struct{ transportOnly bool }

func (p clientPath) new(t *testing.T, o provider.Options) *provider.Client {
	o.TransportOnly = p.transportOnly
	c := provider.New(o)
	t.Cleanup(c.Close)
	return c
}

// bothPaths runs f on each path: every behaviour of Do holds on both.
func bothPaths(t *testing.T, f func(*testing.T, clientPath)) {
	t.Run("lean", func(t *testing.T) { f(t, clientPath{}) })
	t.Run("transport", func(t *testing.T) { f(t, clientPath{transportOnly: true}) })
}

func TestDoSendsTheEscapedPathAsIs(t *testing.T) { bothPaths(t, testDoSendsTheEscapedPathAsIs) }

// The path is relayed as the caller escaped it: an escaped "?", "#", "/"
// or "%" is part of a segment at the provider too, not a query, fragment,
// separator or escape, and a path prefix leaves the rest of it escaped.
func testDoSendsTheEscapedPathAsIs(t *testing.T, path clientPath) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.RequestURI
	}))
	defer srv.Close()
	c := path.new(t, provider.Options{})
	for _, tc := range []struct{ pfx, path, query, want string }{
		{"", "/api/blobs/sha256%3Fx=1", "", "/api/blobs/sha256%3Fx=1"},
		{"", "/api/blobs/sha256%23frag", "", "/api/blobs/sha256%23frag"},
		{"", "/api/blobs/a%2Fb", "", "/api/blobs/a%2Fb"},
		{"", "/api/blobs/sha256%25zz", "q=%3F", "/api/blobs/sha256%25zz?q=%3F"},
		{"/openai/v1", "/v1/files/a%2Fb%3F", "", "/openai/v1/files/a%2Fb%3F"},
	} {
		p := domain.ProviderConfig{Name: "p", BaseURL: srv.URL, PathPrefix: tc.pfx}
		resp, err := c.Do(context.Background(), p, domain.TunnelRequest{Method: http.MethodPost, Path: tc.path, Query: tc.query}, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if uri := <-got; uri != tc.want {
			t.Errorf("%s: provider got %q, want %q", tc.path, uri, tc.want)
		}
	}
}

func TestDoInvalidPathHidesTheBaseURL(t *testing.T) { bothPaths(t, testDoInvalidPathHidesTheBaseURL) }

// A path no URL can carry fails with invalid_request before any request
// is made, and the error (relayed to the caller, logged by the edge) shows
// nothing of the base URL: neither its credentials nor host nor port.
func testDoInvalidPathHidesTheBaseURL(t *testing.T, path clientPath) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("provider got %s", r.RequestURI)
	}))
	defer srv.Close()
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	c := path.new(t, provider.Options{})
	p := domain.ProviderConfig{Name: "p", BaseURL: "http://admin:s3cret@" + host + ":" + port}
	_, err := c.Do(context.Background(), p, domain.TunnelRequest{Method: http.MethodPost, Path: "/api/blobs/sha256%zz"}, nil)
	if domain.CodeOf(err) != domain.CodeInvalidRequest {
		t.Fatalf("err = %v, want invalid_request", err)
	}
	for _, leak := range []string{"s3cret", "admin", host, port} {
		if strings.Contains(err.Error(), leak) {
			t.Fatalf("error %q shows %q", err, leak)
		}
	}
}

// An https provider that takes the connection but never answers the TLS
// handshake (a frozen process whose listen queue still accepts) fails the
// request within the dial time, instead of holding it until the caller
// gives up.
func TestTLSHandshakeHasADeadline(t *testing.T) {
	addr := silentpeer.Listen(t)
	c := provider.New(provider.Options{DialTimeout: 300 * time.Millisecond, HeaderTimeout: 300 * time.Millisecond})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	began := time.Now()
	_, err := c.Do(ctx, domain.ProviderConfig{Name: "p", Type: domain.ProviderOpenAI, BaseURL: "https://" + addr},
		domain.TunnelRequest{Method: "POST", Path: "/v1/chat/completions", Body: []byte(`{}`)}, nil)
	if took := time.Since(began); err == nil || took > 5*time.Second || ctx.Err() != nil {
		t.Fatalf("after %v: %v, want a failure within the dial time", took, err)
	}
}
