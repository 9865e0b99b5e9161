// Package requestid makes the request ids the edge puts on the answers it
// makes itself in the Anthropic API's shape. Anthropic's API sends a
// request-id header on every answer (its errors also carry it as
// "request_id" in the body), and its SDKs and Claude Code show it with an
// error, so a caller can quote it; answers the edge relays from a provider
// keep the provider's own.
package requestid

import (
	"crypto/rand"
	"net/http"
)

// Header is the response header that carries the id ("request-id", as
// Anthropic sends it; header names are case-insensitive).
const Header = "Request-Id"

// prefix and idLen give ids Anthropic's shape: req_ and 24 characters of
// [0-9A-Za-z] (req_011CSHoEeqs5C35K2UUqR7Fy).
const (
	prefix = "req_"
	idLen  = 24
)

const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// New returns a new id: req_ and 24 characters drawn uniformly from
// [0-9A-Za-z] with crypto/rand (143 bits: unique without coordination).
func New() string {
	out := make([]byte, len(prefix), len(prefix)+idLen)
	copy(out, prefix)
	var buf [idLen * 2]byte
	for len(out) < len(prefix)+idLen {
		_, _ = rand.Read(buf[:]) // never fails (crypto/rand's contract)
		for _, b := range buf {
			// 62 of the 64 values of b&63 map evenly; the other two are
			// redrawn, so every character is equally likely.
			if v := b & 63; v < 62 && len(out) < len(prefix)+idLen {
				out = append(out, alphabet[v])
			}
		}
	}
	return string(out)
}

// OpenAIHeader is the header OpenAI's API names each answer's id in
// ("x-request-id"): the OpenAI SDKs keep it as an error's request id, and
// Codex prints it with an error ("request id: req_…"). The edge's own
// answers in OpenAI's shape carry one there (StampOpenAI); a provider's
// relayed answer keeps the provider's.
const OpenAIHeader = "X-Request-Id"

// Stamp returns the id of the answer h belongs to: the one already set as
// its Header, else a new one, set there. An error body that names the id
// takes it from here, so header and body agree.
func Stamp(h http.Header) string { return stamp(h, Header) }

// StampOpenAI is Stamp for an answer in OpenAI's shape: its id is in
// OpenAIHeader.
func StampOpenAI(h http.Header) string { return stamp(h, OpenAIHeader) }

func stamp(h http.Header, name string) string {
	if id := h.Get(name); id != "" {
		return id
	}
	id := New()
	h.Set(name, id)
	return id
}

// anthropicError is the body of an error in Anthropic's shape.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	RequestID string `json:"request_id"`
}

// AnthropicError is the JSON body of an error in Anthropic's shape, of the
// given error type ("not_found_error", …) and message, naming the answer's
// id (Stamp: set as h's request-id if it has none).
func AnthropicError(h http.Header, typ, message string) any {
	b := anthropicError{Type: "error", RequestID: Stamp(h)}
	b.Error.Type, b.Error.Message = typ, message
	return b
}

// openAIError is the body of an error in OpenAI's shape.
type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// OpenAIError is the JSON body of an error in OpenAI's shape, of the given
// type ("invalid_request_error", …), code and message; the answer's id is
// set as h's OpenAIHeader if it has none (StampOpenAI), as OpenAI's API
// names every answer.
func OpenAIError(h http.Header, typ, code, message string) any {
	StampOpenAI(h)
	var b openAIError
	b.Error.Message, b.Error.Type, b.Error.Code = message, typ, code
	return b
}
