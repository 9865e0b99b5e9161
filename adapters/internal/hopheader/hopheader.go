// Package hopheader decides which HTTP headers a relay of iop's provider
// tunnel leaves out: the edge's OpenAI-compatible relay and the node's
// provider client apply the same rules, so a header one of them drops
// never reaches the provider through the other.
package hopheader

import (
	"net/http"
	"strings"
)

// hopByHop are the connection-scoped headers (RFC 9110 §7.6.1) a proxy must
// not forward, in canonical form.
var hopByHop = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// Listed returns the canonical names listed in h's Connection headers
// (every line, under any spelling of the name, comma-separated), which are
// hop-by-hop too; nil when there is none, the usual case.
func Listed(h http.Header) map[string]bool {
	var out map[string]bool
	for k, vs := range h {
		if len(k) != len("Connection") || !strings.EqualFold(k, "Connection") {
			continue
		}
		for _, v := range vs {
			for f := range strings.SplitSeq(v, ",") {
				if f = strings.TrimSpace(f); f != "" {
					if out == nil {
						out = map[string]bool{}
					}
					out[http.CanonicalHeaderKey(f)] = true
				}
			}
		}
	}
	return out
}

// Hop reports whether the header named ck (canonical) is hop-by-hop: by
// nature, or because the message's Connection header lists it (listed,
// from Listed).
func Hop(ck string, listed map[string]bool) bool { return hopByHop[ck] || listed[ck] }

// CallerOnly reports whether a request header named ck (canonical) stays
// with the relay rather than reaching the provider: the caller's
// credentials for the edge (Authorization, X-Api-Key, Api-Key, Cookie; the
// node adds its own key), X-IOP-* routing headers, and what the node's
// HTTP client sets itself (Host, Content-Length, Expect, and
// Accept-Encoding, so the provider answers in identity encoding and usage
// can be read from the stream).
func CallerOnly(ck string) bool {
	switch ck {
	case "Authorization", "X-Api-Key", "Api-Key", "Cookie", "Host", "Content-Length", "Accept-Encoding", "Expect":
		return true
	}
	return IOP(ck)
}

// IOP reports whether a header named ck (canonical) is one of iop's own
// (X-IOP-*: routing on the way in, the node and the run on the way out),
// which only the edge sets: a caller's or a provider's would pass for it.
func IOP(ck string) bool { return strings.HasPrefix(ck, "X-Iop-") }
