package domain

import (
	"maps"
	"net/textproto"
	"slices"
	"strings"
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
	// StreamError, on a TunnelMetadata frame, is an error the provider
	// reported inside its successful response body (wire: the metadata
	// JSON's "stream_error").
	StreamError *ProviderStreamError
	Error       *ErrorInfo
}

// ProviderStreamError is an error a provider reported inside a successful
// (2xx) response body: an Anthropic `event: error`, an OpenAI-compatible
// `data: {"error":…}` chunk, an Ollama `{"error":"…"}` line. The body is
// relayed unchanged; the edge records the tunnel as failed (provider_error)
// with its HTTP status as it was.
type ProviderStreamError struct {
	// Type is the provider's own error type or code ("overloaded_error"),
	// "" when it gave none (Ollama).
	Type    string
	Message string
}

// Bounds on a ProviderStreamError's text: the type is a short name, the
// message a sentence; a provider's longer text is cut.
const (
	MaxStreamErrorType    = 64
	MaxStreamErrorMessage = 1024
)

// Bounded is e with its type and message cut to their bounds and made
// valid UTF-8.
func (e ProviderStreamError) Bounded() ProviderStreamError {
	return ProviderStreamError{Type: cutText(e.Type, MaxStreamErrorType), Message: cutText(e.Message, MaxStreamErrorMessage)}
}

// String is the type and message as one line of text.
func (e ProviderStreamError) String() string {
	switch {
	case e.Type == "":
		return e.Message
	case e.Message == "":
		return e.Type
	}
	return e.Type + ": " + e.Message
}

func cutText(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.ToValidUTF8(s, "")
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
