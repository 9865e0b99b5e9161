// Package upstream is the HTTP plumbing the ollama and openai runtime
// adapters share: a streaming-friendly client, and the mapping of transport
// failures and provider error bodies to stable error codes.
package upstream

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"strings"
	"time"

	"iop/adapters/internal/netmsg"
	"iop/adapters/runtime/internal/agent"
	"iop/domain"
)

// maxErrorBody is how much of a failed response's body is read for its message.
const maxErrorBody = 64 << 10

// NewClient returns a client for streaming requests to a provider: no
// overall timeout (a generation may stream for an hour), a bounded dial,
// and no transparent decompression so bytes arrive as they are sent.
func NewClient() *http.Client {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ResponseHeaderTimeout: 10 * time.Minute, // a model may load for minutes before the first byte
		DisableCompression:    true,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
	}
	return &http.Client{
		Transport: tr,
		// Following a redirect would re-send the request, and the API key
		// Go keeps for the same host on another port or from https to
		// http, to wherever the provider points: Do reports it instead.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Do sends a request with a JSON body (nil for none) and returns the open
// response when its status is 2xx. Otherwise it returns an error from
// StatusError, or, when the request could not be made, provider_unreachable
// (timeout for a header timeout). A cancelled ctx yields ctx.Err().
func Do(ctx context.Context, hc *http.Client, method, url string, body []byte, header http.Header) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		// url.Error quotes the URL whole: its base_url may hold a password.
		var ue *neturl.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, domain.Errorf(domain.CodeConfigError, "build request for %s: %v", domain.RedactURL(url), err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, TransportError(ctx, err)
	}
	if resp.StatusCode/100 == 3 {
		resp.Body.Close()
		return nil, RedirectError(resp)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, withoutCredentials(StatusError(resp.StatusCode, b), req)
	}
	return resp, nil
}

// Bearer is the Authorization value for the key in the node's environment
// variable env ("Bearer " and the key), "" when env is "" or the variable
// unset or empty: the request then goes without a key.
func Bearer(env string) string {
	if env == "" {
		return ""
	}
	if key := os.Getenv(env); key != "" {
		return "Bearer " + key
	}
	return ""
}

// minRedacted is the length under which a credential is not looked for in
// a provider's message: a short one would blank ordinary words.
const minRedacted = 6

// WithoutCredentials is withoutCredentials for an error made of a 2xx
// answer's body (an event stream's error event, an answer that is no
// event stream or no completion, quoted): such a body may echo the request
// as well. req is the request sent (resp.Request).
func WithoutCredentials(err error, req *http.Request) error {
	if req == nil {
		return err
	}
	return withoutCredentials(err, req)
}

// withoutCredentials blanks in err's message the credentials req carried:
// the API key (Authorization: Bearer, X-Api-Key) and base_url's password,
// as sent (in Basic form too). Some servers quote what they were sent in
// their 401 ("invalid API key sk-…", a proxy dumping the request's
// headers), and the message reaches the run's caller, the event feed and
// the history: the key is the node's, and stays there.
func withoutCredentials(err error, req *http.Request) error {
	var de *domain.Error
	if !errors.As(err, &de) {
		return err
	}
	var secrets []string
	add := func(s string) {
		if len(s) >= minRedacted {
			secrets = append(secrets, s)
		}
	}
	for _, v := range req.Header.Values("Authorization") {
		scheme, cred, _ := strings.Cut(strings.TrimSpace(v), " ")
		cred = strings.TrimSpace(cred)
		add(cred)
		if strings.EqualFold(scheme, "Basic") {
			if raw, err := base64.StdEncoding.DecodeString(cred); err == nil {
				_, pw, _ := strings.Cut(string(raw), ":")
				add(pw)
			}
		}
	}
	for _, v := range req.Header.Values("X-Api-Key") {
		add(strings.TrimSpace(v))
	}
	if u := req.URL.User; u != nil {
		if pw, ok := u.Password(); ok {
			add(pw)
			add(base64.StdEncoding.EncodeToString([]byte(u.Username() + ":" + pw)))
		}
	}
	msg := de.Message
	for _, s := range secrets {
		msg = redactCut(strings.ReplaceAll(msg, s, "[redacted]"), s)
	}
	if msg == de.Message {
		return err
	}
	out := *de
	out.Message = msg
	return &out
}

// redactCut blanks in msg what is left of secret s where quoting cut it
// short (Snippet, Truncate): its first minRedacted or more bytes running to
// the end of msg or to the cut's "…". The whole of s is replaced already.
func redactCut(msg, s string) string {
	head := s[:minRedacted]
	for i := 0; i < len(msg); {
		j := strings.Index(msg[i:], head)
		if j < 0 {
			break
		}
		j += i
		k := j + minRedacted
		for k < len(msg) && k-j < len(s) && msg[k] == s[k-j] {
			k++
		}
		if rest := msg[k:]; rest == "" || strings.HasPrefix(rest, "…") {
			msg = msg[:j] + "[redacted]" + rest
			i = j + len("[redacted]")
			continue
		}
		i = j + 1
	}
	return msg
}

// RedirectError is the provider_error for a 3xx answer, which the client
// does not follow: its status and where it points (without credentials or
// query), so the operator can set base_url to that address.
func RedirectError(resp *http.Response) error {
	where := "no Location"
	if loc, err := resp.Location(); err == nil {
		q := ""
		if loc.RawQuery != "" || loc.ForceQuery {
			q = "?…"
		}
		loc.RawQuery, loc.ForceQuery, loc.Fragment, loc.RawFragment = "", false, "", ""
		where = fmt.Sprintf("Location %s%s", loc.Redacted(), q)
	} else if resp.Header.Get("Location") != "" {
		where = "a Location that is not a URL"
	}
	return &domain.Error{Code: domain.CodeProviderError, Message: fmt.Sprintf(
		"the provider answered HTTP %d %s with %s; redirects are not followed (they would send the request and its API key elsewhere): set base_url to the address the provider wants",
		resp.StatusCode, http.StatusText(resp.StatusCode), where)}
}

// TransportError maps a failure to reach the provider or to read its
// response. It returns ctx.Err() when ctx is done, so a cancelled run is
// recognised as such.
func TransportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return domain.Errorf(domain.CodeTimeout, "%s", netmsg.Describe(err))
	}
	// Never the upstream's host and port: the message reaches callers.
	return domain.Errorf(domain.CodeProviderUnreachable, "%s", netmsg.Describe(err))
}

// StatusError builds the error for a non-2xx response: the provider's own
// message (from {"error":"…"}, {"error":{"message":"…"}} or
// {"object":"error","message":"…"}, else the body
// text, else the status line), with code model_not_found for a 404 that
// names a model or a message saying a model was not found, and
// provider_error otherwise.
//
// A 404 whose message does not mention a model and whose error code is not
// model_not_found is provider_error with a hint at base_url: nothing at
// that URL serves the API (a base_url that already ends in /v1, a wrong
// path_prefix). That holds for bodies that are no error of the API (an
// HTML page, Go's "404 page not found", FastAPI's {"detail":"Not Found"},
// nothing) and for API errors alike (OpenAI's "Invalid URL (POST
// /v1/v1/chat/completions)", llama.cpp's "File Not Found"), whereas an
// unknown model is named in the message (Ollama's `model "x" not found`,
// OpenAI's and vLLM's "The model 'x' does not exist").
func StatusError(status int, body []byte) error {
	msg, code := ErrorMessage(body)
	if msg == "" {
		// Not an error object (a proxy's HTML page, plain text): the status
		// says what happened, the start of the body adds what it can.
		msg = fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))
		text := Snippet(body, maxErrorText)
		if text != "" && text != http.StatusText(status) {
			msg += ": " + text
		}
	}
	if status == http.StatusNotFound {
		if code != domain.CodeModelNotFound && !strings.Contains(strings.ToLower(msg), "model") {
			return &domain.Error{Code: domain.CodeProviderError, Message: msg +
				" (no such endpoint on the server: base_url must be its root, without /v1; for an openai adapter, check path_prefix)"}
		}
		return &domain.Error{Code: domain.CodeModelNotFound, Message: msg}
	}
	return ProviderError(msg, code)
}

// maxErrorText bounds the part of a provider's non-JSON error body quoted
// in an error message.
const maxErrorText = 1024

// Snippet is the start of b as text for an error message: valid UTF-8,
// trimmed, at most max bytes and never cut inside a character ("…" marks
// a cut).
func Snippet(b []byte, max int) string {
	text, _ := agent.Truncate(strings.TrimSpace(strings.ToValidUTF8(string(b), "")), max)
	return text
}

// ProviderError classifies an error message reported by a provider
// (possibly mid-stream): model_not_found when the provider's code says so
// or the message says a model was not found, provider_error otherwise.
func ProviderError(msg, providerCode string) error {
	if providerCode == domain.CodeModelNotFound || ModelNotFound(msg) {
		return &domain.Error{Code: domain.CodeModelNotFound, Message: msg}
	}
	return &domain.Error{Code: domain.CodeProviderError, Message: msg}
}

// ModelNotFound reports whether an error message says a model is missing
// (Ollama: `model "x" not found, try pulling it first`).
func ModelNotFound(msg string) bool {
	return strings.Contains(strings.ToLower(msg), "not found")
}

// ErrorMessage extracts the message and code of a provider error body:
// {"error":"msg"} (Ollama), {"error":{"message":"msg","code":"c"}}
// (OpenAI-compatible) or the error object itself,
// {"object":"error","message":"msg","code":400} (SGLang, vLLM before
// 0.10). Both are empty when body is not such an object.
func ErrorMessage(body []byte) (msg, code string) {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Object  string          `json:"object"`
		Message json.RawMessage `json:"message"`
	}
	if json.Unmarshal(bytes.TrimSpace(body), &v) != nil {
		return "", ""
	}
	if len(v.Error) == 0 || string(v.Error) == "null" {
		if v.Object == "error" && json.Unmarshal(v.Message, new(string)) == nil {
			return ErrorField(bytes.TrimSpace(body))
		}
		return "", ""
	}
	return ErrorField(v.Error)
}

// ErrorField reads the value of an "error" key: a string, or an object with
// "message" and "code" (the code may be a string or a number).
func ErrorField(raw json.RawMessage) (msg, code string) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, ""
	}
	var o struct {
		Message string          `json:"message"`
		Code    json.RawMessage `json:"code"`
	}
	if json.Unmarshal(raw, &o) == nil {
		var c string
		if json.Unmarshal(o.Code, &c) != nil && len(o.Code) > 0 && string(o.Code) != "null" {
			c = string(o.Code)
		}
		if o.Message == "" {
			o.Message = string(raw)
		}
		return o.Message, c
	}
	return string(raw), ""
}
