package domain

import (
	"maps"
	"net/textproto"
	"slices"
)

// Header is an HTTP header block as the tunnel carries it: canonical names
// to values. It has net/http's Header shape, so adapters convert with
// http.Header(h) and domain.Header(h); the domain stays free of net/http.
type Header map[string][]string

// Get returns the first value of name (any case).
func (h Header) Get(name string) string {
	if v := h[textproto.CanonicalMIMEHeaderKey(name)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of name (any case).
func (h Header) Set(name, value string) {
	h[textproto.CanonicalMIMEHeaderKey(name)] = []string{value}
}

// Del removes name (any case).
func (h Header) Del(name string) { delete(h, textproto.CanonicalMIMEHeaderKey(name)) }

// Clone returns a deep copy; nil stays nil.
func (h Header) Clone() Header {
	if h == nil {
		return nil
	}
	out := make(Header, len(h))
	for k, v := range maps.All(h) {
		out[k] = slices.Clone(v)
	}
	return out
}

// TunnelRequest asks a node to make one HTTP request to one of its providers.
type TunnelRequest struct {
	Provider string
	Method   string
	Path     string // escaped, as the caller sent it (URL.EscapedPath)
	Query    string // raw, as the caller sent it
	Header   Header
	Body     []byte // the whole body when small; larger bodies stream separately
}

// TunnelFrameKind names the pieces of a provider response, in wire order.
type TunnelFrameKind int

const (
	TunnelStatus TunnelFrameKind = iota + 1
	TunnelHeader
	TunnelBody
	TunnelUsage
	TunnelMetadata
	TunnelEnd
	TunnelError
)

// TunnelFrame is one piece of a provider response relayed by a node.
type TunnelFrame struct {
	Kind     TunnelFrameKind
	Status   int
	Header   Header
	Body     []byte
	Usage    *Usage
	Metadata []byte
	Error    *ErrorInfo
}

// ListedModel is one model as a provider's own model list names it.
type ListedModel struct {
	ID string
	// Created is the model's creation time in Unix seconds as the provider
	// reported it; zero when it reported none.
	Created int64
	// Raw is the provider's own entry when callers are handed it back (an
	// Ollama /api/tags entry keeps size, digest and details); else nil.
	Raw []byte
}
