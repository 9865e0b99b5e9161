// Package provider is the node's HTTP client for the provider raw tunnel.
package provider

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"iop/adapters/internal/hopheader"
	"iop/adapters/internal/netmsg"
	"iop/domain"
	"iop/ports"
)

// AnthropicVersion is the anthropic-version an anthropic provider is sent
// when the caller named none.
const AnthropicVersion = "2023-06-01"

// Client makes upstream requests for tunnels. Plain-http providers reached
// without a proxy (http.ProxyFromEnvironment answers none for the URL: a
// loopback or NO_PROXY host, or no proxy configured) go through a lean
// HTTP/1.1 path that does the whole exchange in the caller's goroutine
// (lean.go); https providers and proxied URLs go through net/http.Transport
// (TLS, HTTP/2, proxies). Both behave the same to the caller.
type Client struct {
	hc   *http.Client
	tr   *http.Transport
	lean *leanClient // nil when Options.TransportOnly
}

var _ ports.ProviderClient = (*Client)(nil)

// Options tunes the client.
type Options struct {
	// HeaderTimeout bounds the wait for response headers (default 10 min:
	// non-streaming completions on slow hardware can take minutes).
	HeaderTimeout time.Duration
	// DialTimeout bounds connecting to the provider (default 10 s).
	DialTimeout time.Duration
	// MaxIdleConnsPerHost bounds the idle keep-alive connections kept per
	// provider host and port (default 128).
	MaxIdleConnsPerHost int
	// IdleConnTimeout closes a connection idle this long (default 90 s).
	IdleConnTimeout time.Duration
	// TransportOnly sends every request through net/http.Transport, as
	// before the lean path (tests and benchmarks compare the two).
	TransportOnly bool
}

// New returns a client. Bodies are never buffered whole and never
// decompressed: bytes reach the caller as the provider sent them.
func New(o Options) *Client {
	if o.HeaderTimeout <= 0 {
		o.HeaderTimeout = 10 * time.Minute
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.MaxIdleConnsPerHost <= 0 {
		// Sized for a node relaying many concurrent tunnels to one
		// provider: at 16, 32 concurrent requests dialled a fresh connection
		// for half of them (a tenth of the node's CPU in the profile).
		o.MaxIdleConnsPerHost = 128
	}
	if o.IdleConnTimeout <= 0 {
		o.IdleConnTimeout = 90 * time.Second
	}
	tr := &http.Transport{
		Proxy:       http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		// Built from scratch, the Transport has no handshake limit: a
		// provider that takes the connection but never finishes its TLS
		// handshake would hold the request for good. (Nor HTTP/2: with a
		// custom dialer it is off, and it stays off — one connection per
		// request in flight, each bounded by its socket buffer, as the lean
		// path has.)
		TLSHandshakeTimeout:   o.DialTimeout,
		ResponseHeaderTimeout: o.HeaderTimeout,
		DisableCompression:    true,
		MaxIdleConns:          2 * o.MaxIdleConnsPerHost,
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       o.IdleConnTimeout,
	}
	c := &Client{tr: tr, hc: &http.Client{
		Transport: tr,
		// A proxy relays 3xx answers; following them would also re-send the
		// request body and key to wherever the provider points.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	if !o.TransportOnly {
		// The lean path follows no redirects either: it makes one exchange.
		c.lean = newLeanClient(o.DialTimeout, o.HeaderTimeout, o.MaxIdleConnsPerHost, o.IdleConnTimeout)
	}
	return c
}

// Close closes idle provider connections; requests in flight finish.
func (c *Client) Close() {
	if c.lean != nil {
		c.lean.Close()
	}
	c.tr.CloseIdleConnections()
}

// useLean reports whether hreq goes through the lean path: plain http with
// no proxy for its URL.
func (c *Client) useLean(hreq *http.Request) bool {
	if c.lean == nil || hreq.URL.Scheme != "http" {
		return false
	}
	proxy, err := http.ProxyFromEnvironment(hreq)
	return err == nil && proxy == nil
}

// Do sends req to provider p. The path (escaped, as the caller sent it)
// passes through unchanged below p.BaseURL, except that p.PathPrefix (when
// set) replaces a leading "/v1"; see UpstreamURL.
// body, when non-nil, follows req.Body; a Content-Length the caller sent is
// kept so the provider sees a sized (not chunked) request.
//
// Errors are domain errors: cancelled (ctx ended), timeout (no response
// headers within HeaderTimeout), provider_unreachable (connect failed,
// connection reset before headers) and invalid_request (unusable URL).
// Redirects are not followed: a 3xx reaches the caller as the provider sent it.
func (c *Client) Do(ctx context.Context, p domain.ProviderConfig, req domain.TunnelRequest, body io.Reader) (*ports.ProviderResponse, error) {
	u, err := UpstreamURL(p, req.Path, req.Query)
	if err != nil {
		return nil, err
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	var rd io.Reader = bytes.NewReader(req.Body)
	var streamed *countingReader
	if body != nil {
		streamed = &countingReader{r: body}
		rd = io.MultiReader(rd, streamed)
	}
	// The URL is set after the request is built, not given as a string: a
	// string would be parsed again, and the parser's errors quote the whole
	// URL, base URL credentials and host included — text that reaches the
	// caller.
	hreq, err := http.NewRequestWithContext(ctx, method, "", rd)
	if err != nil {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "the request method %q is not valid", method)
	}
	hreq.URL, hreq.Host = u, strings.TrimSuffix(u.Host, ":")
	switch {
	case body == nil && len(req.Body) == 0:
		hreq.Body, hreq.GetBody, hreq.ContentLength = http.NoBody, nil, 0
	case body == nil:
		hreq.ContentLength = int64(len(req.Body))
	default:
		hreq.ContentLength = -1 // chunked unless the caller declared a size
		if n, err := strconv.ParseInt(req.Header.Get("Content-Length"), 10, 64); err == nil && n >= int64(len(req.Body)) {
			hreq.ContentLength = n
		}
	}
	hreq.Header = CleanRequestHeader(http.Header(req.Header))
	var key string
	if p.APIKeyEnv != "" {
		key = os.Getenv(p.APIKeyEnv)
	}
	if p.Type == domain.ProviderAnthropic {
		// Anthropic's API takes the key as x-api-key and wants a version;
		// the caller's anthropic-version (Claude Code sends one) wins.
		if key != "" {
			hreq.Header.Set("X-Api-Key", key)
		}
		if hreq.Header.Get("Anthropic-Version") == "" {
			hreq.Header.Set("Anthropic-Version", AnthropicVersion)
		}
	} else if key != "" {
		hreq.Header.Set("Authorization", "Bearer "+key)
	}
	var resp *http.Response
	if c.useLean(hreq) {
		// A retry re-sends the body if nothing of a streamed one was read.
		newBody := func() (io.ReadCloser, bool) {
			if hreq.ContentLength == 0 && body == nil {
				return http.NoBody, true
			}
			if streamed == nil {
				return io.NopCloser(bytes.NewReader(req.Body)), true
			}
			if streamed.n > 0 {
				return nil, false
			}
			return io.NopCloser(io.MultiReader(bytes.NewReader(req.Body), streamed)), true
		}
		resp, err = c.lean.do(ctx, hreq, newBody)
	} else {
		resp, err = c.hc.Do(hreq)
	}
	if err != nil {
		return nil, classify(ctx, p, err)
	}
	scan := NewUsageScanner(resp.Header.Get("Content-Type"))
	return &ports.ProviderResponse{
		Status:      resp.StatusCode,
		Header:      domain.Header(stripResponseHeader(resp.Header)),
		Body:        &scanningBody{rc: resp.Body, scan: scan},
		Usage:       scan.Usage,
		StreamError: scan.StreamError,
	}, nil
}

// classify turns a failed round trip into a domain error. Messages name the
// provider but never its credentials nor its host and port (netmsg): they
// are relayed to the edge's callers.
func classify(ctx context.Context, p domain.ProviderConfig, err error) error {
	if ctx.Err() != nil {
		return domain.Errorf(domain.CodeCancelled, "upstream request to provider %s cancelled", p.Name)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return domain.Errorf(domain.CodeTimeout, "provider %s: no response headers in time", p.Name)
	}
	return domain.Errorf(domain.CodeProviderUnreachable, "provider %s: %s", p.Name, netmsg.Describe(err))
}

// UpstreamURL is the URL of a request to provider p: the base URL's path
// followed by path, then query. path is the escaped path as the caller sent
// it (its %2F, %3F, %23 and %25 stay what they are, a part of a segment,
// not a separator, query, fragment or escape) and query the raw query, both
// passed through as they are. p.PathPrefix, when set, replaces a leading
// "/v1" segment.
//
// An error is invalid_request with a fixed message: neither the base URL
// (which may hold credentials) nor its host is ever part of it.
func UpstreamURL(p domain.ProviderConfig, path, query string) (*url.URL, error) {
	base, err := url.Parse(p.BaseURL)
	if err != nil {
		// Config validation refuses such a base URL; the text of err would
		// quote it whole.
		return nil, domain.Errorf(domain.CodeInvalidRequest, "provider %s has an unusable base_url", p.Name)
	}
	if p.PathPrefix != "" && strings.HasPrefix(path, "/") {
		// The first segment is compared decoded, as the edge routed on it
		// ("/%761/…" is "/v1/…" too); the rest of the path stays escaped.
		first, rest, more := strings.Cut(path[1:], "/")
		if seg, err := url.PathUnescape(first); err == nil && seg == "v1" {
			path = prefixPath(p.PathPrefix)
			if more {
				path += "/" + rest
			}
		}
	}
	escaped := strings.TrimSuffix(base.EscapedPath(), "/") + path
	decoded, err := url.PathUnescape(escaped)
	if err != nil {
		// A "%" not followed by two hex digits: no URL can carry it as is.
		return nil, domain.Errorf(domain.CodeInvalidRequest, "the request path is not a valid URL path (a %% must start an escape such as %%25)")
	}
	u := *base
	u.Path, u.RawPath = decoded, escaped
	if base.RawQuery != "" {
		// The base URL's own parameters (Azure's api-version) go first,
		// the caller's after them.
		query = strings.TrimSuffix(base.RawQuery+"&"+query, "&")
	}
	u.RawQuery, u.ForceQuery = query, false
	u.Fragment, u.RawFragment = "", ""
	return &u, nil
}

// prefixPath is a path_prefix as an escaped path, spelled as the openai
// adapter takes it: one leading slash and none trailing, whatever the
// config wrote ("api/v1", "/api/v1/"), "" for "/" (no prefix), and a
// character that must be escaped in a path (a space, a letter beyond
// ASCII) escaped, so that the caller's own escapes (a %2F) stay valid.
func prefixPath(prefix string) string {
	trimmed := strings.Trim(prefix, "/")
	if trimmed == "" {
		return ""
	}
	if raw, err := url.PathUnescape(trimmed); err == nil && raw != trimmed {
		return "/" + trimmed // written escaped already ("/my%20api")
	}
	return (&url.URL{Path: "/" + trimmed}).EscapedPath()
}

// filterHeader copies h under canonical names, leaving out hop-by-hop
// headers and those drop rejects. Names are canonicalized first, so a header
// sent as "authorization" cannot slip past a filter for "Authorization".
// The copy shares h's value slices, capped at their length so that adding a
// value to the copy never writes into h.
func filterHeader(h http.Header, drop func(canonical string) bool) http.Header {
	listed := hopheader.Listed(h)
	out := make(http.Header, len(h))
	for k, vs := range h {
		ck := http.CanonicalHeaderKey(k)
		if hopheader.Hop(ck, listed) || drop(ck) {
			continue
		}
		if prev, dup := out[ck]; dup {
			out[ck] = append(prev, vs...)
		} else {
			out[ck] = vs[:len(vs):len(vs)]
		}
	}
	return out
}

// stripResponseHeader is CleanResponseHeader in place, for a header the
// client parsed and owns: copying it cost a map and a slice per name on
// every response.
func stripResponseHeader(h http.Header) http.Header {
	listed := hopheader.Listed(h)
	for k, vs := range h {
		ck := http.CanonicalHeaderKey(k)
		switch {
		case hopheader.Hop(ck, listed):
			delete(h, k)
		case ck != k:
			delete(h, k)
			h[ck] = append(h[ck][:len(h[ck]):len(h[ck])], vs...)
		}
	}
	return h
}

// CleanRequestHeader copies h without hop-by-hop headers (including those
// named in Connection) and without what stays with the relay
// (hopheader.CallerOnly: the caller's credentials, X-IOP-* routing headers,
// and Accept-Encoding, Expect, Host and Content-Length, so the provider
// answers in identity encoding and usage can be read from the stream).
func CleanRequestHeader(h http.Header) http.Header {
	return filterHeader(h, hopheader.CallerOnly)
}

// CleanResponseHeader copies h without hop-by-hop headers. Content-Length
// stays: the body is relayed byte for byte (never decoded), so a sized
// answer reaches the caller sized, as the provider sent it.
func CleanResponseHeader(h http.Header) http.Header {
	return filterHeader(h, func(string) bool { return false })
}

// countingReader counts what was read of a streamed request body: once
// any of it is gone, the request cannot be sent again.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

type scanningBody struct {
	rc   io.ReadCloser
	scan *UsageScanner
}

func (b *scanningBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.scan.Write(p[:n])
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, context.Canceled) {
		// Read errors name the connection's addresses; callers see this.
		err = errors.New(netmsg.Describe(err))
	}
	return n, err
}

func (b *scanningBody) Close() error { return b.rc.Close() }
