package domain

import "net/http"

// TunnelRequest asks a node to make one HTTP request to one of its providers.
type TunnelRequest struct {
	Provider string
	Method   string
	Path     string
	Query    string
	Header   http.Header
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
	Header   http.Header
	Body     []byte
	Usage    *Usage
	Metadata []byte
	Error    *ErrorInfo
}
