package openaiapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"iop/adapters/internal/requestid"
	"iop/domain"
)

// dialectOf is the API family whose error shape a request gets: Ollama's on
// /api/* and on the root (Ollama clients probe it), Anthropic's on
// /v1/messages and for Anthropic clients (an anthropic-version header)
// anywhere under /v1, OpenAI's elsewhere.
func dialectOf(r *http.Request) string {
	p := r.URL.Path
	switch {
	case p == "/" || strings.HasPrefix(p, "/api/"):
		return domain.ProviderOllama
	case p == "/v1/messages" || strings.HasPrefix(p, "/v1/messages/") || r.Header.Get("Anthropic-Version") != "":
		return domain.ProviderAnthropic
	}
	return domain.ProviderOpenAI
}

// WriteError writes an error the edge itself raises on one of this
// surface's routes, in the dialect of the route (see dialectOf): code is
// the iop error code (OpenAI's "code"), message the human text, so callers
// of these routes get errors their SDK can read. (Authentication failures
// come from adapters/http's Dialect functions, with the codes SDKs expect
// for a bad key.)
func WriteError(w http.ResponseWriter, r *http.Request, status int, code, message string) {
	if domain.RetrySoon(code) {
		// The SDKs (OpenAI's, Anthropic's, Claude Code) wait as long as
		// this says before they retry, instead of their own guess.
		w.Header().Set("Retry-After", "1")
	}
	switch dialectOf(r) {
	case domain.ProviderOllama:
		writeJSON(w, status, struct {
			Error string `json:"error"`
		}{message})
	case domain.ProviderAnthropic:
		// With a request id, as Anthropic's API answers: see package requestid.
		writeJSON(w, status, requestid.AnthropicError(w.Header(), anthropicType(status), message))
	default:
		// With a request id, as OpenAI's API answers: see package requestid.
		writeJSON(w, status, requestid.OpenAIError(w.Header(), openaiType(status), code, message))
	}
}

// openaiType is OpenAI's error "type" for a status.
func openaiType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// anthropicType is the Anthropic API's error "type" for a status, as its
// documentation lists them (504 is timeout_error, the SDKs'
// GatewayTimeoutError; other 5xx but 503 and 529 are api_error).
func anthropicType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// writeJSON writes v as the whole, sized response, with the content type
// the providers themselves send (Ollama and most servers: charset=utf-8).
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding failed","type":"server_error","param":null,"code":"internal"}}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
