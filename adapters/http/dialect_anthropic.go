package httpapi

import (
	"net/http"

	"iop/adapters/internal/requestid"
	"iop/domain"
)

// DialectAnthropic is the Anthropic API's
// {"type":"error","error":{"type","message"}}: 401 is authentication_error,
// 403 permission_error, 429 rate_limit_error — what Anthropic SDKs and
// Claude Code recognise; a cross-origin refusal is a permission_error, a
// refused Host an invalid_request_error, a connection over the listener's
// caps (503) an overloaded_error, which the SDKs retry; a route the edge
// does not serve is a not_found_error, a method it does not take an
// invalid_request_error, and so is a request moved to its clean path (308
// "moved": it is not the caller's key that is wrong). A refused key (401,
// 403) says "x-should-retry: false", as Anthropic's API does: Claude Code
// retries a 401 without it (ten times, backing off, for minutes) before it
// reports the key, and the SDKs follow the header over their own rules.
// Like every answer of Anthropic's API it carries a request id (req_…) as its request-id header and as "request_id" in the
// body; the access log names it.
func DialectAnthropic(w http.ResponseWriter, status int, code, message string) {
	typ := "authentication_error"
	switch code {
	case domain.CodeForbidden, domain.CodeCrossOrigin:
		typ = "permission_error"
	case domain.CodeRateLimited:
		typ = "rate_limit_error"
	case domain.CodeHostNotAllowed:
		typ = "invalid_request_error"
	case domain.CodeTooManyConnections:
		typ = "overloaded_error"
	case "not_found":
		typ = "not_found_error" // a route the edge does not serve
	case "method_not_allowed", "moved":
		typ = "invalid_request_error"
	}
	if status == http.StatusUnauthorized || status == http.StatusForbidden {
		w.Header().Set("X-Should-Retry", "false")
	}
	writeJSON(w, status, requestid.AnthropicError(w.Header(), typ, message))
}
