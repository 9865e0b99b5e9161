package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

func TestNewNormalisesTheEdgeURL(t *testing.T) {
	for in, want := range map[string]string{
		"":                         DefaultEdge,
		"127.0.0.1:9000":           "http://127.0.0.1:9000",
		"http://edge:7701/":        "http://edge:7701",
		"http://edge:7701//":       "http://edge:7701",
		"https://edge.example/x//": "https://edge.example/x",
		"https://edge.example/x/":  "https://edge.example/x",
	} {
		c, err := New(in, nil)
		if err != nil || c.Edge() != want {
			t.Errorf("New(%q) = %v, %v; want %s", in, c.Edge(), err, want)
		}
	}
	for _, bad := range []string{"ftp://x", "http://", "::nope"} {
		if _, err := New(bad, nil); err == nil {
			t.Errorf("New(%q) accepted", bad)
		}
	}
}

func TestErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/api-error":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(404)
			_, _ = io.WriteString(w, `{"error":{"code":"run_not_found","message":"no such run"}}`)
		case "/v1/plain-error":
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(502)
			_, _ = io.WriteString(w, "bad gateway\n")
		case "/v1/html-page":
			// Another web server's page: a megabyte of HTML with a
			// terminal escape.
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.WriteHeader(404)
			_, _ = io.WriteString(w, "<html>\n<body>\x1b[2J"+strings.Repeat("é", 1<<19)+"</body></html>")
		case "/v1/proxy-auth":
			w.WriteHeader(401)
		case "/v1/empty-error":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(500)
			_, _ = io.WriteString(w, `{"error":{}}`)
		}
	}))
	defer srv.Close()
	c, _ := New(srv.URL, srv.Client())
	var ae *APIError
	err := c.Call(context.Background(), "GET", "/v1/api-error", nil, nil, nil)
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Code != "run_not_found" || err.Error() != "no such run (run_not_found)" {
		t.Fatalf("err %#v", err)
	}
	// An answer that is not the API's JSON says where it came from, and
	// shows at most 200 bytes of its body, quoted (escapes and all).
	err = c.Call(context.Background(), "GET", "/v1/plain-error", nil, nil, nil)
	if want := "HTTP 502 from " + srv.URL + `/v1/plain-error: not an iop edge answer (text/plain): "bad gateway"`; !errors.As(err, &ae) || ae.Status != 502 || err.Error() != want {
		t.Fatalf("err %v, want %s", err, want)
	}
	err = c.Call(context.Background(), "GET", "/v1/html-page", nil, nil, nil)
	if want := "HTTP 404 from " + srv.URL + `/v1/html-page: not an iop edge answer (text/html; charset=utf-8): "<html> <body>\x1b[2J` + strings.Repeat("é", 91) + `…"`; err == nil || err.Error() != want {
		t.Fatalf("err %v, want %s", err, want)
	}
	// A 401 from another server is not the edge refusing the key.
	err = c.Call(context.Background(), "GET", "/v1/proxy-auth", nil, nil, nil)
	if want := "HTTP 401 from " + srv.URL + "/v1/proxy-auth: not an iop edge answer (no Content-Type)"; err == nil || err.Error() != want {
		t.Fatalf("err %v, want %s", err, want)
	}

	// An error object with neither a code nor a message is not the API's.
	err = c.Call(context.Background(), "GET", "/v1/empty-error", nil, nil, nil)
	if want := "HTTP 500 from " + srv.URL + `/v1/empty-error: not an iop edge answer (application/json): "{\"error\":{}}"`; err == nil || err.Error() != want {
		t.Fatalf("err %v, want %s", err, want)
	}

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	c, _ = New(addr, nil)
	err = c.Call(context.Background(), "GET", "/v1/nodes", nil, nil, nil)
	var ce *ConnError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "http://"+addr) || !strings.Contains(err.Error(), "IOP_EDGE") {
		t.Fatalf("err %v", err)
	}
}

func TestCommand(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Command string          `json:"command"`
			Args    json.RawMessage `json:"args"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		sse := r.Header.Get("Accept") == "text/event-stream"
		switch {
		case body.Command == "caps" && !sse:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"ok":true}`)
		case body.Command == "pull" && sse:
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "event: progress\ndata: {\"n\":1}\n\n: keep-alive\n\nevent: progress\ndata: {\"n\":2}\n\nevent: result\ndata: "+string(body.Args)+"\n\n")
		case body.Command == "fail" && sse:
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "event: progress\ndata: {}\n\nevent: error\ndata: {\"error\":{\"code\":\"provider_error\",\"message\":\"registry down\"}}\n\n")
		case body.Command == "cut" && sse:
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "event: progress\ndata: {}\n\n")
		default:
			w.WriteHeader(400)
		}
	}))
	defer srv.Close()
	c, _ := New(srv.URL, srv.Client())
	ctx := context.Background()

	res, err := c.Command(ctx, "n1", "caps", nil, nil)
	if err != nil || string(res) != `{"ok":true}` {
		t.Fatalf("caps: %s, %v", res, err)
	}
	var seen []string
	res, err = c.Command(ctx, "n1", "pull", map[string]string{"model": "m"}, func(p json.RawMessage) error {
		seen = append(seen, string(p))
		return nil
	})
	if err != nil || string(res) != `{"model":"m"}` || strings.Join(seen, " ") != `{"n":1} {"n":2}` {
		t.Fatalf("pull: %s, %v, progress %v", res, err, seen)
	}
	progress := func(json.RawMessage) error { return nil }
	_, err = c.Command(ctx, "n1", "fail", nil, progress)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "provider_error" || ae.Message != "registry down" {
		t.Fatalf("fail: %v", err)
	}
	if _, err = c.Command(ctx, "n1", "cut", nil, progress); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut: %v", err)
	}
}

func TestEdgeURLPasswordIsNeverShown(t *testing.T) {
	c, err := New("http://ops:hunter2@edge:7701", nil)
	if err != nil || c.Edge() != "http://ops:xxxxx@edge:7701" {
		t.Fatalf("Edge() = %v, %v", c.Edge(), err)
	}
	// An edge URL that is refused is quoted without its password too,
	// whether it parsed (wrong scheme) or not (a space in the host).
	for _, bad := range []string{"ftp://ops:hunter2@edge:7701", "http://ops:hunter2@ed ge:7701/x"} {
		_, err := New(bad, nil)
		if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "ops:xxxxx@") {
			t.Errorf("New(%q): %v", bad, err)
		}
	}
}

// An edge URL with a path (an edge behind a reverse proxy under a prefix)
// keeps it in front of every request's escaped path, escaped once.
func TestRequestPathKeepsTheEdgePrefix(t *testing.T) {
	seen := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.URL.EscapedPath()
		_, _ = io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	c, err := New(srv.URL+"/edge/", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Call(context.Background(), http.MethodGet, "/v1/runs/"+url.PathEscape("a b/c"), nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if p := <-seen; p != "/edge/v1/runs/a%20b%2Fc" {
		t.Fatalf("path %s", p)
	}
}

// A redirect becomes an error naming its target, without a password in it,
// and the caller's http.Client is left as it was.
func TestRedirectIsAnError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/nowhere" {
			w.WriteHeader(http.StatusMultipleChoices)
			return
		}
		http.Redirect(w, r, "http://ops:hunter2@elsewhere:7701/v1/nodes", http.StatusFound)
	}))
	defer srv.Close()
	hc := srv.Client()
	c, err := New(srv.URL, hc)
	if err != nil {
		t.Fatal(err)
	}
	if hc.CheckRedirect != nil {
		t.Fatal("New changed the caller's client")
	}
	err = c.Call(context.Background(), http.MethodGet, "/v1/nodes", nil, nil, nil)
	if err == nil || err.Error() != "the edge answered with a redirect to http://ops:xxxxx@elsewhere:7701/v1/nodes (HTTP 302); point --edge (or IOP_EDGE) at the final address" {
		t.Fatalf("err %v", err)
	}
	err = c.Call(context.Background(), http.MethodGet, "/v1/nowhere", nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "redirect (HTTP 300) and no usable Location") {
		t.Fatalf("err %v", err)
	}
}

// A password holding "#", "?" or "/" ends the authority for a URL parser:
// the URL is refused, and quoted without anything between the scheme and
// its last "@". "http://admin:9999#tail@host" parsed as host "admin" (the
// key went there) and was echoed whole, as was "http://admin:s3cr3t?x@host".
func TestEdgeURLWithAPasswordThatLooksLikeTheRest(t *testing.T) {
	for _, bad := range []string{
		"http://admin:s3cr3t?x@127.0.0.1:1",
		"http://admin:9999#tail@127.0.0.1:1",
		"http://admin:12/s3cr3t@127.0.0.1:1",
		"http://admin:12?s3cr3t@127.0.0.1:1",
		"http://admin:s3cr3t/x@127.0.0.1:1",
		"admin:9999#tail@127.0.0.1:1",
		"http://127.0.0.1:1/#frag",
		"http://127.0.0.1:1/v1#",
	} {
		_, err := New(bad, nil)
		if err == nil {
			t.Errorf("New(%q) accepted", bad)
			continue
		}
		for _, secret := range []string{"s3cr3t", "tail", "9999"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("New(%q): %v", bad, err)
			}
		}
	}
	// Whether or not the parser took it, such a URL is refused naming the
	// cause: "want http://host:port" beside "http://admin:xxxxx@127.0.0.1:1",
	// which looks right, gave the user nothing to fix.
	for _, bad := range []string{
		"http://admin:s3cr3t?x@127.0.0.1:1",
		"http://admin:9999#tail@127.0.0.1:1",
		"http://admin:12/s3cr3t@127.0.0.1:1",
		"http://admin:s3cr3t/x@127.0.0.1:1",
		"https://admin:pa/ss@edge.example.com",
	} {
		_, err := New(bad, nil)
		if err == nil || !strings.Contains(err.Error(), "percent-encode") {
			t.Errorf("New(%q): %v, want the advice to percent-encode the password", bad, err)
		}
	}
	for _, bad := range []string{"ftp://127.0.0.1:1", "http://host:port", "http://"} {
		_, err := New(bad, nil)
		if err == nil || !strings.Contains(err.Error(), "want http://host:port") {
			t.Errorf("New(%q): %v, want http://host:port", bad, err)
		}
	}
	if got := redactRaw("http://a/b?c#d:e@host:1/p"); got != "http://xxxxx@host:1/p" {
		t.Errorf("redactRaw = %q", got)
	}
	if got := redactRaw("http://ops@host:1"); got != "http://ops@host:1" {
		t.Errorf("redactRaw = %q", got)
	}
}

// A 403 is explained by the edge's own message: another key's session is
// no missing scope, and the CLI must not tell the user to get one.
func TestForbiddenSaysTheEdgesReasonOnly(t *testing.T) {
	session := (&APIError{Status: http.StatusForbidden, Code: "forbidden",
		Message: `session "s1" of adapter "llm" belongs to another API key`}).Error()
	if !strings.Contains(session, "belongs to another API key") || strings.Contains(session, "scope") {
		t.Fatalf("another key's session: %q", session)
	}
	scope := (&APIError{Status: http.StatusForbidden, Code: "forbidden", Message: `key "ci" lacks the "runs" scope`}).Error()
	if !strings.Contains(scope, `lacks the "runs" scope`) {
		t.Fatalf("a missing scope: %q", scope)
	}
}

// The wrong scheme for the edge, either way, and an HTTPS edge whose CA
// the machine lacks say what to change: Go's own words name neither the
// URL's scheme nor --ca-file.
func TestSchemeAndCAMistakesSayWhatToChange(t *testing.T) {
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"nodes":[]}`)
	}))
	secure.Config.ErrorLog = log.New(io.Discard, "", 0)
	defer secure.Close()
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer plain.Close()
	for _, c := range []struct {
		edge string
		hc   *http.Client
		want string
	}{
		{"http://" + secure.Listener.Addr().String(), nil, "use an https:// edge URL"},
		{"https://" + plain.Listener.Addr().String(), nil, "use an http:// edge URL"},
		{secure.URL, &http.Client{}, "pass --ca-file"},
	} {
		cl, err := New(c.edge, c.hc)
		if err != nil {
			t.Fatal(err)
		}
		err = cl.Call(context.Background(), "GET", "/v1/nodes", nil, nil, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want it to say %q", c.edge, err, c.want)
		}
	}
	// A trusted edge gets no such hint.
	cl, _ := New(secure.URL, secure.Client())
	if err := cl.Call(context.Background(), "GET", "/v1/nodes", nil, nil, nil); err != nil {
		t.Fatalf("trusted edge: %v", err)
	}
}
