// Package provider is the node's HTTP client for the provider raw tunnel.
package provider

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"iop/domain"
	"iop/ports"
)

// Client makes upstream requests for tunnels.
type Client struct {
	hc *http.Client
}

var _ ports.ProviderClient = (*Client)(nil)

// Options tunes the client.
type Options struct {
	// HeaderTimeout bounds the wait for response headers (default 10 min:
	// non-streaming completions on slow hardware can take minutes).
	HeaderTimeout time.Duration
	// DialTimeout bounds connecting to the provider (default 10 s).
	DialTimeout time.Duration
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
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ResponseHeaderTimeout: o.HeaderTimeout,
		DisableCompression:    true,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
	}
	return &Client{hc: &http.Client{Transport: tr}}
}

// Do sends req to provider p. The path passes through unchanged below
// p.BaseURL, except that p.PathPrefix (when set) replaces a leading "/v1".
func (c *Client) Do(ctx context.Context, p domain.ProviderConfig, req domain.TunnelRequest, body io.Reader) (*ports.ProviderResponse, error) {
	u := UpstreamURL(p, req.Path, req.Query)
	var rd io.Reader = bytes.NewReader(req.Body)
	if body != nil {
		rd = io.MultiReader(rd, body)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	hreq, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "build upstream request: %v", err)
	}
	if body == nil {
		hreq.ContentLength = int64(len(req.Body))
		if len(req.Body) == 0 {
			hreq.Body = http.NoBody
		}
	}
	hreq.Header = CleanRequestHeader(req.Header)
	if p.APIKeyEnv != "" {
		if key := os.Getenv(p.APIKeyEnv); key != "" {
			hreq.Header.Set("Authorization", "Bearer "+key)
		}
	}
	resp, err := c.hc.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return nil, domain.Errorf(domain.CodeCancelled, "upstream request cancelled")
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, domain.Errorf(domain.CodeTimeout, "provider %s: no response headers in time: %v", p.Name, err)
		}
		return nil, domain.Errorf(domain.CodeProviderUnreachable, "provider %s: %v", p.Name, err)
	}
	scan := NewUsageScanner(resp.Header.Get("Content-Type"))
	return &ports.ProviderResponse{
		Status: resp.StatusCode,
		Header: CleanResponseHeader(resp.Header),
		Body:   &scanningBody{rc: resp.Body, scan: scan},
		Usage:  scan.Usage,
	}, nil
}

// UpstreamURL joins a provider's base URL with a request path and query.
func UpstreamURL(p domain.ProviderConfig, path, query string) string {
	if p.PathPrefix != "" && (path == "/v1" || strings.HasPrefix(path, "/v1/")) {
		path = strings.TrimSuffix(p.PathPrefix, "/") + strings.TrimPrefix(path, "/v1")
	}
	u := strings.TrimSuffix(p.BaseURL, "/") + path
	if query != "" {
		u += "?" + query
	}
	return u
}

// hopByHop are connection-scoped headers (RFC 9110 §7.6.1) that a proxy
// must not forward.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// CleanRequestHeader copies h without hop-by-hop headers, without the
// caller's credentials (the node adds its own key) and without
// Accept-Encoding, so the provider answers in identity encoding and usage
// can be read from the stream.
func CleanRequestHeader(h http.Header) http.Header {
	out := h.Clone()
	if out == nil {
		out = http.Header{}
	}
	for _, f := range strings.Split(out.Get("Connection"), ",") {
		if f = strings.TrimSpace(f); f != "" {
			out.Del(f)
		}
	}
	for _, k := range hopByHop {
		out.Del(k)
	}
	out.Del("Authorization")
	out.Del("Accept-Encoding")
	out.Del("Content-Length")
	out.Del("Host")
	for k := range out {
		if strings.HasPrefix(strings.ToLower(k), "x-iop-") {
			out.Del(k)
		}
	}
	return out
}

// CleanResponseHeader copies h without hop-by-hop headers and without
// Content-Length (the edge streams the body and lets HTTP frame it).
func CleanResponseHeader(h http.Header) http.Header {
	out := h.Clone()
	for _, f := range strings.Split(out.Get("Connection"), ",") {
		if f = strings.TrimSpace(f); f != "" {
			out.Del(f)
		}
	}
	for _, k := range hopByHop {
		out.Del(k)
	}
	out.Del("Content-Length")
	return out
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
	return n, err
}

func (b *scanningBody) Close() error { return b.rc.Close() }
