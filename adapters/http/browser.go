package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"iop/domain"
)

// A keyless edge makes every caller admin, and the operator's browser can
// be made a caller by any page it opens. Such a page can send a "simple"
// cross-origin request (a POST with a text/plain body, which needs no CORS
// preflight) that starts a run, a node command or a reload; and, by DNS
// rebinding (its own name re-pointed at 127.0.0.1), it can make requests
// its browser deems same-origin and read the answers. browserGuard closes
// both, on every route, before authentication:
//
//   - a state-changing request (any method but GET, HEAD and OPTIONS) that
//     a browser marks as coming from another origin — Sec-Fetch-Site other
//     than same-origin or none, or, from browsers too old for that header,
//     an Origin whose host is not the request's Host — is refused 403
//     cross_origin (net/http.CrossOriginProtection). Another port of
//     localhost is another origin. Clients that are not browsers (the iop
//     CLI, OpenAI and Ollama SDKs, the ollama CLI, curl) send neither header
//     and pass; the console under /ui/ is same-origin. A cross-origin GET
//     still reaches its route, but without CORS headers the page cannot read
//     the answer (the passthrough drops a provider's), and no GET route
//     changes state.
//   - an edge without API keys that listens on a loopback address answers
//     only requests whose Host is a loopback address or localhost (any
//     port), and refuses others 421 host_not_allowed: a rebound page's
//     requests carry its own name. With keys a rebound page has no key to
//     send, so any Host is served (an edge behind a proxy or on a public
//     name must answer to it); a keyless edge on a network address
//     (http.allow_unauthenticated) is called by names the edge cannot know
//     and keeps only the cross-origin check.
//
// The Content-Type of a body is not checked: `curl -d` sends
// application/x-www-form-urlencoded and Node's fetch text/plain, and the
// cross-origin check already refuses what a JSON-only rule would.
type browserGuard struct {
	origins *http.CrossOriginProtection
	// loopbackHosts limits the Host a request may name (see above).
	loopbackHosts bool
}

func newBrowserGuard(keyless bool, addr string) browserGuard {
	return browserGuard{origins: http.NewCrossOriginProtection(), loopbackHosts: keyless && loopbackListen(addr)}
}

// check returns the refusal for r, or ok.
func (g browserGuard) check(r *http.Request) (status int, code, message string, ok bool) {
	if g.loopbackHosts && !loopbackHost(r.Host) {
		return http.StatusMisdirectedRequest, domain.CodeHostNotAllowed, fmt.Sprintf(
			"this edge has no API keys and answers only requests addressed to a loopback address or localhost, not to host %q; "+
				"a reverse proxy in front of it must send its upstream address as Host (e.g. Host: 127.0.0.1:7701), or configure http.api_keys",
			r.Host), false
	}
	if err := g.origins.Check(r); err != nil {
		return http.StatusForbidden, domain.CodeCrossOrigin, fmt.Sprintf(
			"%s %s was sent by a web page of another origin; this edge takes state-changing requests only from its own pages "+
				"(the console) or from clients outside a browser", r.Method, r.URL.Path), false
	}
	return 0, "", "", true
}

// MetricsOnlyHandler serves h on metrics.listen, which checks no API key.
// On a loopback address it answers only requests whose Host is a loopback
// address or localhost (421 host_not_allowed otherwise), as a keyless edge
// does: without that, a page the operator's browser opens could re-point
// its own name at 127.0.0.1 (DNS rebinding) and read the metrics. On a
// network address any Host is served: Prometheus and proxies call it by
// names the edge cannot know.
func MetricsOnlyHandler(addr string, h http.Handler) http.Handler {
	if !loopbackListen(addr) {
		return h
	}
	return LoopbackHostsOnly("metrics.listen", h)
}

// LoopbackHostsOnly serves h only to requests whose Host is a loopback
// address or localhost, answering others 421 host_not_allowed: a listener
// on loopback that checks no key (metrics.listen, --pprof) would otherwise
// answer a page that re-points its own name at 127.0.0.1 (DNS rebinding).
// what names the listener in the message.
func LoopbackHostsOnly(what string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			writeJSONError(w, http.StatusMisdirectedRequest, domain.CodeHostNotAllowed, fmt.Sprintf(
				"%s answers only requests addressed to a loopback address or localhost, not to host %q", what, r.Host))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loopbackListen reports whether the listen address addr is a loopback
// address or localhost.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && isLoopbackName(host)
}

// loopbackHost reports whether a request's Host (host, host:port, [v6] or
// [v6]:port) names a loopback address or localhost. An empty Host (HTTP/1.0)
// passes: browsers always send one.
func loopbackHost(hostport string) bool {
	if hostport == "" {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	return isLoopbackName(host)
}

func isLoopbackName(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
