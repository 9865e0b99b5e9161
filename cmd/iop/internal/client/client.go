// Package client is the iop CLI's client of the edge HTTP API: JSON calls,
// run streams, node commands and the event feed, with the API's errors
// decoded into *APIError.
package client

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"iop/domain"
)

// DefaultEdge is the edge the CLI talks to when neither --edge nor IOP_EDGE
// names one.
const DefaultEdge = "http://127.0.0.1:7701"

// CallTimeout bounds calls that do not stream, from the request to the
// last byte of the answer. The edge bounds its own waits on nodes well
// below it (30 s for a node command or a session's end), so an edge still
// silent by then is stuck or not an iop edge.
var CallTimeout = 2 * time.Minute

// HeaderTimeout bounds the wait for a stream's response headers: a run's,
// a streamed node command's, the event feed's. The edge sends those of the
// event feed and of a streamed command at once, and those of a run once
// its node has admitted it, which the edge waits for 30 s at most
// (AdmitTimeout in application/edge/submit_run.go) before it answers with
// an error. An edge silent for longer is stuck, or not an iop edge.
var HeaderTimeout = 45 * time.Second

// MaxAnswer bounds an answer that is not a stream (a list, a run, a node
// command's result), in bytes: 64 MiB. The edge's answers are far smaller:
// a node command's result travels in one node-link frame, at most 64 MiB
// (transport.max_frame_size, 4 MiB by default), and the edge's lists are
// pages. Read whole without a bound, an answer from a hostile or broken
// server grew the CLI's memory without limit.
var MaxAnswer = 64 << 20

// MaxRequest is the most the edge takes in a request body, in bytes: 8 MiB
// (maxBody in adapters/http). A run's input is at least as long in the
// request, so input over it can never be sent.
const MaxRequest = 8 << 20

// readAnswer reads a success body, at most MaxAnswer bytes of it.
func readAnswer(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(MaxAnswer)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxAnswer {
		return nil, fmt.Errorf("the answer is over %s (not an iop edge's)", sizeText(MaxAnswer))
	}
	return b, nil
}

// APIError is an error answered by the edge: {"error":{"code","message"}}.
type APIError struct {
	Status  int // HTTP status; 0 for an error event inside a stream
	Code    string
	Message string
	// Foreign marks an error status whose body was not the API's JSON (a
	// proxy's or another server's page: --edge points elsewhere). Message
	// then says so, and is the whole error: a 401 from such a server is
	// not the edge refusing the key.
	Foreign bool
}

func (e *APIError) Error() string {
	if e.Foreign {
		return e.Message
	}
	switch e.Status {
	case http.StatusUnauthorized:
		return fmt.Sprintf("the edge refused the API key: %s (%s); pass a valid key with --api-key or IOP_API_KEY", e.Message, e.Code)
	case http.StatusForbidden:
		// The edge's message says why (a scope the key lacks, another
		// key's session, a nodes limit): no hint of ours, which would be
		// wrong for all but one of them.
		return fmt.Sprintf("the API key is not allowed to do this: %s (%s)", e.Message, e.Code)
	}
	return fmt.Sprintf("%s (%s)", e.Message, e.Code)
}

// ConnError means the edge could not be reached at all.
type ConnError struct {
	Edge string
	Err  error
}

func (e *ConnError) Error() string {
	return fmt.Sprintf("cannot reach the edge at %s (set --edge or IOP_EDGE): %v%s", e.Edge, e.Err, tlsHint(e.Err))
}

// tlsHint says what to change when something answered but was not the
// edge's HTTP API as the URL says (TLS in the way, or another protocol):
// Go's own words name neither the URL's scheme, --ca-file nor the port.
func tlsHint(err error) string {
	var ua x509.UnknownAuthorityError
	switch {
	case err == nil:
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return " (the edge serves plain HTTP at this address: use an http:// edge URL)"
	case errors.As(err, &ua):
		return " (the edge's certificate, http.tls, is from a CA this machine does not trust: pass --ca-file with that CA's certificate)"
	case errors.Is(err, io.EOF):
		// What took the connection closed it without an HTTP answer:
		// most often the edge's node link (transport.listen, the address
		// nodes dial, one port below the HTTP API by default), which
		// wants TLS and framed protobuf; "EOF" alone said nothing.
		return " (what answered closed the connection without an HTTP answer: is the address the edge's http.listen, not its transport.listen, which nodes dial?)"
	}
	return ""
}

func (e *ConnError) Unwrap() error { return e.Err }

// TimeoutError means the edge took the request but did not answer within
// one of the client's waits: CallTimeout for a call, HeaderTimeout for the
// start of a stream.
type TimeoutError struct {
	Edge string
	Wait time.Duration
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("the edge at %s did not answer within %v", e.Edge, e.Wait)
}

// ctxErr is why ctx ended: the *TimeoutError of a wait this package put on
// the edge, when that ended it while the caller's context was still live;
// otherwise ctx's own error (the caller was interrupted), which the CLI
// reports as such.
func ctxErr(ctx context.Context) error {
	var te *TimeoutError
	if errors.As(context.Cause(ctx), &te) {
		return te
	}
	return ctx.Err()
}

// Client calls one edge.
type Client struct {
	base   *url.URL
	http   *http.Client
	apiKey string
}

// ErrAPIKeyHeader refuses an API key that cannot go in an HTTP header.
var ErrAPIKeyHeader = errors.New("the API key holds a character not allowed in an HTTP header")

// SetAPIKey makes every request carry key as "Authorization: Bearer key",
// or as "X-Api-Key: key" when the edge URL has a user (and password) for
// basic auth, which takes the Authorization header.
// A key with a byte no header value may hold (a control character other
// than a tab, or DEL: a pasted key with a line break in it) is refused with
// ErrAPIKeyHeader, which never shows the key: Go's client refused each
// request instead, and that read as "cannot reach the edge".
func (c *Client) SetAPIKey(key string) error {
	for i := 0; i < len(key); i++ {
		if b := key[i]; b < ' ' && b != '\t' || b == 0x7f {
			return ErrAPIKeyHeader
		}
	}
	c.apiKey = key
	return nil
}

// New returns a client of the edge at base ("http://host:port"; a bare
// "host:port" means http).
func New(base string, hc *http.Client) (*Client, error) {
	base = strings.TrimSpace(base)
	if base == "" {
		base = DefaultEdge
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	// A "#" or "?" or "/" in a password ends the authority for the parser:
	// "http://admin:9999#tail@host" is host "admin", port 9999, and the
	// rest a fragment, so the API key went to another host and the URL
	// was shown with the password in it. An edge URL has no fragment, and
	// an "@" after the host is such a password, never a path. It is said
	// so also when the parser refused the URL ("http://admin:s3cr3t/x@host"
	// is host "admin" with port "s3cr3t"): "want http://host:port" next
	// to the redacted URL, which looks right, left the user guessing.
	passwordHint := fmt.Errorf("edge URL %q: a fragment (#…) or an \"@\" after the host is refused; percent-encode a \"#\", \"?\" or \"/\" in a password (%%23, %%3F, %%2F)", redactRaw(base))
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		if atAfterAuthority(base) {
			return nil, passwordHint
		}
		return nil, fmt.Errorf("edge URL %q: want http://host:port", redactRaw(base))
	}
	if strings.Contains(base, "#") || strings.Contains(u.Path, "@") || strings.Contains(u.RawPath, "@") || strings.Contains(u.RawQuery, "@") {
		return nil, passwordHint
	}
	// Every slash at the end goes: request paths start with one, and a
	// path with "//" is cleaned and redirected by the edge's mux.
	u.Path = strings.TrimRight(u.Path, "/")
	if hc == nil {
		hc = &http.Client{}
	}
	// No redirect is followed, whoever built hc: Go's client keeps the
	// Authorization header when only the port or the scheme changes, so
	// the API key (and on 307/308 the request body) would go to another
	// port of the host, or from https down to plain http. do reports a
	// 3xx as an error instead. hc itself is left as it is.
	own := *hc
	own.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Client{base: u, http: &own}, nil
}

// atAfterAuthority reports whether raw ("scheme://…") holds an "@" after
// the first "/", "?" or "#" that ends its authority for a URL parser: a
// password holding one of those, not percent-encoded.
func atAfterAuthority(raw string) bool {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return false
	}
	i := strings.IndexAny(rest, "/?#")
	return i >= 0 && strings.Contains(rest[i:], "@")
}

// Edge is the edge's base URL as it may be shown: a password in it (an
// edge behind a proxy with basic auth) is replaced by "xxxxx", so no error
// message prints it.
func (c *Client) Edge() string { return c.base.Redacted() }

// redactRaw hides the credentials of an edge URL that did not parse, or
// was refused (so URL.Redacted is not at hand or not to be trusted):
// domain.RedactURL, which takes everything between "scheme://" and the
// last "@" of the whole string as user and password, whatever it holds (a
// password may hold "#", "?" or "/", which end the authority for a URL
// parser). A string without a scheme is not a URL the CLI took: as it is.
func redactRaw(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	return domain.RedactURL(s)
}

// do sends a request and returns a 2xx response; any other status becomes
// an *APIError, a transport failure a *ConnError (or ctx's error when ctx
// ended first). path is already escaped: callers url.PathEscape each
// variable segment (a run, node or session id). A stream (accept
// text/event-stream) whose headers do not come within HeaderTimeout ends
// with a *TimeoutError.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body any, accept string) (*http.Response, error) {
	if accept != "text/event-stream" {
		return c.send(ctx, method, path, query, body, accept)
	}
	// A stream has no overall bound, and its idle timer (newIdleBody)
	// starts with its body, so the wait for its headers is bounded here:
	// an edge that takes the connection and never answers hung the command.
	wait := HeaderTimeout
	timeout := &TimeoutError{Edge: c.Edge(), Wait: wait}
	ctx, end := context.WithCancelCause(ctx)
	timer := time.AfterFunc(wait, func() { end(timeout) })
	resp, err := c.send(ctx, method, path, query, body, accept)
	if !timer.Stop() && err == nil {
		// The wait ran out as the headers came: the request is being
		// cancelled under the stream.
		resp.Body.Close()
		err = timeout
	}
	if err != nil {
		end(nil)
		return nil, err
	}
	// The request's context lives as long as the stream; closing the body
	// releases it.
	resp.Body = &endOnClose{ReadCloser: resp.Body, end: func() { end(nil) }}
	return resp, nil
}

// endOnClose is a stream's body that ends the stream's request context
// when closed.
type endOnClose struct {
	io.ReadCloser
	end func()
}

func (b *endOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.end()
	return err
}

// send is do without the wait for a stream's headers.
func (c *Client) send(ctx context.Context, method, path string, query url.Values, body any, accept string) (*http.Response, error) {
	u := *c.base
	// Path and RawPath are set together, as the escaped path and its
	// decoding: appending the escaped path to Path alone made URL.String
	// escape it a second time ("my chat" reached the edge as "my%20chat").
	u.RawPath = c.base.EscapedPath() + path
	p, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return nil, fmt.Errorf("request path %q: %w", path, err)
	}
	u.Path = p
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	switch {
	case c.apiKey == "":
	case c.base.User != nil:
		// The edge URL's user and password are a proxy's basic auth in
		// front of the edge, which Go's client sends only on a request
		// without an Authorization header: the key, in that header, left
		// the proxy without its password. The edge reads X-Api-Key too.
		req.Header.Set("X-Api-Key", c.apiKey)
	default:
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctxErr(ctx)
		}
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return nil, &ConnError{Edge: c.Edge(), Err: err}
	}
	if resp.StatusCode/100 == 3 {
		resp.Body.Close()
		return nil, redirectError(resp)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// redirectError explains a redirect, which the client does not follow (see
// New); the target is shown without a password.
func redirectError(resp *http.Response) error {
	loc, err := resp.Location()
	if err != nil {
		return fmt.Errorf("the edge answered with a redirect (HTTP %d) and no usable Location; point --edge (or IOP_EDGE) at the edge itself", resp.StatusCode)
	}
	return fmt.Errorf("the edge answered with a redirect to %s (HTTP %d); point --edge (or IOP_EDGE) at the final address", loc.Redacted(), resp.StatusCode)
}

func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var body struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	// The edge's error object always has a code. One without (an
	// OpenAI-shaped proxy's {"error":{"message","type","code":null}}) is
	// some other server's JSON: taken as the edge's, it printed "msg ()",
	// and a proxy's 401 read "the edge refused the API key".
	if json.Unmarshal(b, &body) == nil && body.Error != nil && body.Error.Code != "" {
		return &APIError{Status: resp.StatusCode, Code: body.Error.Code, Message: body.Error.Message}
	}
	// Anything else is not the edge's, {"error":"…"} included: the edge
	// answers in that (Ollama's) shape only on its /api routes, which the
	// CLI never calls. Taken as the edge's, another server's 401
	// {"error":"Unauthorized"} read "the edge refused the API key".
	return foreignError(resp, b)
}

// foreignError is an answer that is not the edge's, an error status's or a
// success's, as an *APIError with Foreign set.
func foreignError(resp *http.Response, body []byte) *APIError {
	return &APIError{Status: resp.StatusCode, Code: fmt.Sprintf("http_%d", resp.StatusCode), Message: foreignAnswer(resp, body), Foreign: true}
}

// foreignSnippet bounds how much of a body that is not the API's is shown.
const foreignSnippet = 200

// httpsOnlyAnswer is what Go's HTTPS server answers a plaintext request.
const httpsOnlyAnswer = "Client sent an HTTP request to an HTTPS server."

// foreignAnswer describes an error answer that is not the API's JSON: its
// status, the URL (without a password) and content type, and the start of
// its body, quoted. The body used to be the whole message, up to 1 MiB:
// --edge pointed at a web server printed its HTML page, escapes and all.
func foreignAnswer(resp *http.Response, body []byte) string {
	where := "the edge"
	if resp.Request != nil && resp.Request.URL != nil {
		where = resp.Request.URL.Redacted()
	}
	ct := "no Content-Type"
	if v := resp.Header.Get("Content-Type"); v != "" {
		// Escaped like the body: the header comes from that server too.
		q := strconv.Quote(v)
		ct = q[1 : len(q)-1]
	}
	msg := fmt.Sprintf("HTTP %d from %s: not an iop edge answer (%s)", resp.StatusCode, where, ct)
	text := truncateText(string(body))
	if text == "" {
		return msg
	}
	msg += ": " + strconv.Quote(text)
	if resp.StatusCode == http.StatusBadRequest && text == httpsOnlyAnswer {
		msg += " (the edge serves HTTPS at this address, as its http.tls is set: use an https:// edge URL)"
	}
	return msg
}

// truncateText is a body that is not the API's as it is shown: valid
// UTF-8, runs of whitespace as one space, at most foreignSnippet bytes
// (then "…"). Callers quote it.
func truncateText(s string) string {
	text := strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " ")
	if len(text) > foreignSnippet {
		cut := foreignSnippet
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut] + "…"
	}
	return text
}

// Call sends a JSON request and decodes the JSON answer into out (nil
// discards it; *json.RawMessage keeps it as is).
func (c *Client) Call(ctx context.Context, method, path string, query url.Values, body, out any) error {
	return c.CallFor(ctx, method, path, query, body, out)
}

// CallFor is Call for an answer that must be a JSON object holding each of
// fields as a non-empty string. Any other answer, a success's status or
// not (a proxy's or another server's "{}"), is not the edge's: an
// *APIError with Foreign set, as for an error answer that is not the API's.
// Taken as the edge's, "200 {}" printed a cancel of run "" on node "".
// An answer that is not JSON at all (a proxy's "200 OK" login page) is not
// the edge's either, whatever fields are asked for.
func (c *Client) CallFor(ctx context.Context, method, path string, query url.Values, body, out any, fields ...string) error {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	resp, err := c.do(ctx, method, path, query, body, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := readAnswer(resp.Body)
	if err != nil {
		if ctx.Err() != nil {
			return ctxErr(ctx)
		}
		return fmt.Errorf("read answer from %s: %w", path, err)
	}
	if !json.Valid(b) || !holdsFields(b, fields) {
		return foreignError(resp, b)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode answer from %s: %w", path, err)
	}
	return nil
}

// holdsFields reports whether b is a JSON object whose fields are all
// non-empty strings.
func holdsFields(b []byte, fields []string) bool {
	if len(fields) == 0 {
		return true
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(b, &obj) != nil {
		return false
	}
	for _, f := range fields {
		var s string
		if json.Unmarshal(obj[f], &s) != nil || s == "" {
			return false
		}
	}
	return true
}

// callContext bounds a call that does not stream by CallTimeout; when that
// ends it, ctxErr tells the caller which edge did not answer in how long,
// instead of a bare "context deadline exceeded".
func (c *Client) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	wait := CallTimeout
	return context.WithTimeoutCause(ctx, wait, &TimeoutError{Edge: c.Edge(), Wait: wait})
}

// RunRequest is the body of POST /v1/runs.
type RunRequest struct {
	Node       string          `json:"node,omitempty"`
	Adapter    string          `json:"adapter"`
	Target     string          `json:"target,omitempty"`
	Input      string          `json:"input"`
	SessionID  string          `json:"session_id,omitempty"`
	Background bool            `json:"background,omitempty"`
	Options    json.RawMessage `json:"options,omitempty"`
}

// Usage is a run's reported consumption.
type Usage struct {
	PromptTokens     int64   `json:"prompt_tokens,omitempty"`
	CompletionTokens int64   `json:"completion_tokens,omitempty"`
	TotalTokens      int64   `json:"total_tokens,omitempty"`
	CostUSD          float64 `json:"cost_usd,omitempty"`
	DurationMS       int64   `json:"duration_ms,omitempty"`
	StopReason       string  `json:"stop_reason,omitempty"`
	Model            string  `json:"model,omitempty"`
}

// ErrorInfo is a code and message.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// RunEvent is one event of a run stream.
type RunEvent struct {
	RunID    string          `json:"run_id,omitempty"`
	Node     string          `json:"node,omitempty"`
	Seq      uint64          `json:"seq,omitempty"`
	Type     string          `json:"type"`
	Text     string          `json:"text,omitempty"`
	Usage    *Usage          `json:"usage,omitempty"`
	Error    *ErrorInfo      `json:"error,omitempty"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// Terminal reports whether the event ends its run.
func (e RunEvent) Terminal() bool {
	return e.Type == "complete" || e.Type == "error" || e.Type == "cancelled"
}

// RunStream is a started run: its id and node, and for a foreground run
// its events.
type RunStream struct {
	RunID      string
	Node       string
	Background bool

	body io.ReadCloser
	sse  *SSEReader
}

// StartRun submits a run. A background run returns at once (no events);
// a foreground run's events are read with Next. Cancelling ctx abandons the
// stream, which the edge answers by cancelling the run.
func (c *Client) StartRun(ctx context.Context, req RunRequest) (*RunStream, error) {
	resp, err := c.do(ctx, http.MethodPost, "/v1/runs", nil, req, "text/event-stream")
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusAccepted || !isEventStream(resp) {
		defer resp.Body.Close()
		b, err := c.readWhole(resp.Body, "run answer")
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctxErr(ctx)
			}
			return nil, err
		}
		// Only a 202 with a run id is the edge taking a background run:
		// any other answer that is not a stream (a foreground run answered
		// "200 {}" by another server) was reported as a run started in
		// the background, though none had started.
		var ack struct {
			RunID string `json:"run_id"`
			Node  string `json:"node"`
		}
		if resp.StatusCode != http.StatusAccepted || json.Unmarshal(b, &ack) != nil || ack.RunID == "" {
			return nil, foreignError(resp, b)
		}
		return &RunStream{RunID: ack.RunID, Node: ack.Node, Background: true}, nil
	}
	if resp.Header.Get("X-IOP-Run-ID") == "" {
		// The edge names every run it streams: another server's event
		// stream (an OpenAI-style one) read as a run printed
		// "run : decode message event: …".
		resp.Body.Close()
		e := foreignError(resp, nil)
		e.Message += ": an event stream without the X-IOP-Run-ID header every run stream carries"
		return nil, e
	}
	body := newIdleBody(resp.Body, StreamIdleTimeout)
	return &RunStream{
		RunID: resp.Header.Get("X-IOP-Run-ID"), Node: resp.Header.Get("X-IOP-Node"),
		body: body, sse: NewSSEReader(body),
	}, nil
}

// Next returns the next event and its raw JSON; io.EOF at the end of the
// stream.
func (r *RunStream) Next() (RunEvent, json.RawMessage, error) {
	if r.sse == nil {
		return RunEvent{}, nil, io.EOF
	}
	ev, err := r.sse.Next()
	if err != nil {
		return RunEvent{}, nil, err
	}
	var re RunEvent
	if err := json.Unmarshal([]byte(ev.Data), &re); err != nil {
		return RunEvent{}, nil, fmt.Errorf("decode %s event: %w", ev.Type, err)
	}
	if re.Type == "" {
		re.Type = ev.Type
	}
	return re, json.RawMessage(ev.Data), nil
}

// Close ends the stream.
func (r *RunStream) Close() {
	if r.body != nil {
		r.body.Close()
	}
}

// Command runs a node command and returns its JSON result. With progress
// non-nil the command is asked for as an event stream and each progress
// report is passed to it; an error it returns stops the command.
func (c *Client) Command(ctx context.Context, node, name string, args any, progress func(json.RawMessage) error) (json.RawMessage, error) {
	body := map[string]any{"command": name}
	if args != nil {
		body["args"] = args
	}
	accept := "application/json"
	if progress != nil {
		accept = "text/event-stream"
	} else {
		var cancel context.CancelFunc
		ctx, cancel = c.callContext(ctx)
		defer cancel()
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(node)+"/commands", nil, body, accept)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if !isEventStream(resp) {
		var b []byte
		if progress != nil {
			// Asked for as a stream, the request has no overall bound.
			b, err = c.readWhole(resp.Body, "command result")
		} else if b, err = readAnswer(resp.Body); err != nil {
			err = fmt.Errorf("read command result: %w", err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctxErr(ctx)
			}
			return nil, err
		}
		// The edge answers a command's result as JSON. Anything else (a
		// proxy's "200 OK" login page) was printed as it came, escapes
		// and all, and exited 0: "iop ollama delete" said "deleted".
		if !json.Valid(b) {
			return nil, foreignError(resp, b)
		}
		return b, nil
	}
	sse := NewSSEReader(newIdleBody(resp.Body, StreamIdleTimeout))
	// The result comes as one event, and may be as large as a plain one.
	sse.SetMax(MaxAnswer)
	for {
		ev, err := sse.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctxErr(ctx)
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("command stream ended without a result: %w", err)
		}
		switch ev.Type {
		case "progress":
			if progress != nil {
				if err := progress(json.RawMessage(ev.Data)); err != nil {
					return nil, err
				}
			}
		case "result":
			if !json.Valid([]byte(ev.Data)) {
				return nil, fmt.Errorf("the command's result is not JSON (not an iop edge's answer): %s", strconv.Quote(truncateText(ev.Data)))
			}
			return json.RawMessage(ev.Data), nil
		case "error":
			return nil, eventError(ev.Data)
		}
	}
}

func eventError(data string) error {
	var body struct {
		Error ErrorInfo `json:"error"`
	}
	if err := json.Unmarshal([]byte(data), &body); err != nil || body.Error.Code == "" {
		return &APIError{Code: "internal", Message: strings.TrimSpace(data)}
	}
	return &APIError{Code: body.Error.Code, Message: body.Error.Message}
}

// BusEvent is one event of the edge's event feed.
type BusEvent struct {
	Type   string          `json:"type"`
	Time   time.Time       `json:"time"`
	Node   string          `json:"node,omitempty"`
	Reason string          `json:"reason,omitempty"`
	Remote string          `json:"remote,omitempty"`
	Run    *RunEvent       `json:"run,omitempty"`
	Tunnel *TunnelSummary  `json:"tunnel,omitempty"`
	Raw    json.RawMessage `json:"-"`
}

// TunnelSummary describes a finished provider tunnel.
type TunnelSummary struct {
	ID         string `json:"id"`
	Provider   string `json:"provider,omitempty"`
	Model      string `json:"model,omitempty"`
	Path       string `json:"path,omitempty"`
	Status     int    `json:"status,omitempty"`
	BodyBytes  int64  `json:"body_bytes"`
	DurationMS int64  `json:"duration_ms"`
	Usage      *Usage `json:"usage,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Events follows the event feed, calling fn for each event until ctx ends
// (ctx's error), the stream breaks, or fn fails. dropped, when not nil,
// gets the count of each "dropped N events" report: the edge drops events
// for a subscriber that reads too slowly and says so only in that comment.
func (c *Client) Events(ctx context.Context, types []string, fn func(BusEvent) error, dropped func(n uint64)) error {
	q := url.Values{}
	if len(types) > 0 {
		q.Set("type", strings.Join(types, ","))
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/events", q, nil, "text/event-stream")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sse := NewSSEReader(newIdleBody(resp.Body, StreamIdleTimeout))
	if dropped != nil {
		sse.OnComment(func(text string) {
			var n uint64
			if _, err := fmt.Sscanf(text, "dropped %d events", &n); err == nil && n > 0 {
				dropped(n)
			}
		})
	}
	for {
		ev, err := sse.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				return errors.New("the edge closed the event stream")
			}
			if errors.Is(err, io.ErrUnexpectedEOF) {
				// Cut inside the answer: the edge was killed, or the
				// network between went away.
				return errors.New("the connection to the edge broke: the event stream ended")
			}
			return fmt.Errorf("event stream: %w", err)
		}
		var be BusEvent
		if err := json.Unmarshal([]byte(ev.Data), &be); err != nil {
			return fmt.Errorf("decode %s event: %w", ev.Type, err)
		}
		if be.Type == "" {
			be.Type = ev.Type
		}
		be.Raw = json.RawMessage(ev.Data)
		if err := fn(be); err != nil {
			return err
		}
	}
}

// readWhole reads an answer to a request made as a stream that came as a
// plain body instead (a background run's 202, a node command's result): a
// stream's request has no overall bound, so without these an edge that sent
// the headers and then stalled, or dripped a byte at a time, hung the
// command. Between two reads the body may be silent for StreamIdleTimeout,
// as a stream may; the whole takes at most CallTimeout, as a call does (a
// *TimeoutError past it). what names the answer in other errors.
func (c *Client) readWhole(body io.ReadCloser, what string) ([]byte, error) {
	idle := newIdleBody(body, StreamIdleTimeout)
	defer idle.Close()
	wait := CallTimeout
	var late atomic.Bool
	timer := time.AfterFunc(wait, func() {
		late.Store(true)
		_ = body.Close()
	})
	defer timer.Stop()
	b, err := readAnswer(idle)
	switch {
	case err == nil:
		return b, nil
	case late.Load():
		return nil, &TimeoutError{Edge: c.Edge(), Wait: wait}
	}
	return nil, fmt.Errorf("read %s: %w", what, err)
}

func isEventStream(resp *http.Response) bool {
	return strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
}
