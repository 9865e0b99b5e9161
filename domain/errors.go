package domain

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Error is a failure with a stable machine-readable code. Two *Error values
// match under errors.Is when their codes are equal, so an error rebuilt from a
// code received over the wire still matches the sentinel below.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" || e.Message == e.Code {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// Is reports whether target is an *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Errorf builds an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the code of the first *Error in err's chain, or "internal".
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// MessageOf returns a human-readable message for err without repeating its code.
func MessageOf(err error) string {
	var e *Error
	if !errors.As(err, &e) {
		return err.Error()
	}
	if e.Message != "" {
		return e.Message
	}
	// A bare sentinel wrapped with context ("…: target_not_found"): the
	// context is the message; the code is reported separately.
	return strings.TrimSuffix(err.Error(), ": "+e.Code)
}

// Stable error codes. They appear on the wire, in HTTP bodies and in events,
// so they never change meaning.
const (
	CodeInternal            = "internal"
	CodeInvalidRequest      = "invalid_request"
	CodeUnknownToken        = "unknown_token"
	CodeDuplicateConn       = "duplicate_connection"
	CodeConfigError         = "config_error"
	CodeNodeNotFound        = "node_not_found"
	CodeNoNodeAvailable     = "no_node_available"
	CodeNodeDisconnected    = "node_disconnected"
	CodeAdapterNotFound     = "adapter_not_found"
	CodeTargetNotFound      = "target_not_found"
	CodeAtCapacity          = "at_capacity"
	CodeRunNotFound         = "run_not_found"
	CodeRunFinished         = "run_finished"
	CodeRunFailed           = "run_failed"
	CodeCancelled           = "cancelled"
	CodeTimeout             = "timeout"
	CodeSessionUnsupported  = "session_unsupported"
	CodeSessionBusy         = "session_busy"
	CodeSessionNotFound     = "session_not_found"
	CodeUnknownCommand      = "unknown_command"
	CodeCommandUnsupported  = "command_unsupported"
	CodeProviderNotFound    = "provider_not_found"
	CodeModelNotFound       = "model_not_found"
	CodeProviderError       = "provider_error"
	CodeProviderUnreachable = "provider_unreachable"
	CodeStreamReset         = "stream_reset"
	CodeShuttingDown        = "shutting_down"
	CodeUnauthorized        = "unauthorized"
	CodeForbidden           = "forbidden"
	CodeRateLimited         = "rate_limited"
	// CodeCrossOrigin refuses a state-changing request a browser sent from
	// another origin; CodeHostNotAllowed a request for a host name a
	// keyless loopback edge does not answer to (DNS rebinding).
	CodeCrossOrigin    = "cross_origin"
	CodeHostNotAllowed = "host_not_allowed"
	// CodeTooManyConnections answers a request that came on a connection
	// over the HTTP listener's caps (in total or from one address).
	CodeTooManyConnections = "too_many_connections"
)

// CodeHistoryUnavailable refuses what needs the edge's history when it
// cannot be read (a session's owner after a restart); the caller may retry.
const CodeHistoryUnavailable = "history_unavailable"

// CodeResultTooLarge fails a node command whose result is larger than the
// edge accepts of one (transport.MaxCommandResult): the caller may ask for
// less (a smaller limit, a page at a time).
const CodeResultTooLarge = "result_too_large"

// CodeBadResult fails a node command whose result (or a progress report)
// is not JSON: the node is broken or hostile, and the edge's answer is JSON.
const CodeBadResult = "bad_result"

// CodeTooManySubscriptions refuses an event feed (GET /v1/events) over
// the edge's caps on live subscriptions, per key or in total: each costs
// the edge a buffer and the encoding of every event it is sent.
const CodeTooManySubscriptions = "too_many_subscriptions"

// CodeRunLost ends a history record whose node has no record of the run:
// it never reached the node, or the node's store lost it.
const CodeRunLost = "run_lost"

// CodeNodeRemoved ends a history record left running on a node a reload
// removed from the edge's config (the edge disconnected the node), or that
// the config lacked when the edge started (removed while it was stopped):
// the node's registration is refused, and the node stops its runs.
const CodeNodeRemoved = "node_removed"

// Sentinels for errors.Is. Wrap them with context; never compare strings.
var (
	ErrInvalidRequest     = &Error{Code: CodeInvalidRequest}
	ErrUnknownToken       = &Error{Code: CodeUnknownToken}
	ErrDuplicateConn      = &Error{Code: CodeDuplicateConn}
	ErrConfig             = &Error{Code: CodeConfigError}
	ErrNodeNotFound       = &Error{Code: CodeNodeNotFound}
	ErrNoNodeAvailable    = &Error{Code: CodeNoNodeAvailable}
	ErrNodeDisconnected   = &Error{Code: CodeNodeDisconnected}
	ErrAdapterNotFound    = &Error{Code: CodeAdapterNotFound}
	ErrTargetNotFound     = &Error{Code: CodeTargetNotFound}
	ErrAtCapacity         = &Error{Code: CodeAtCapacity}
	ErrRunNotFound        = &Error{Code: CodeRunNotFound}
	ErrRunFinished        = &Error{Code: CodeRunFinished}
	ErrSessionUnsupported = &Error{Code: CodeSessionUnsupported}
	ErrSessionBusy        = &Error{Code: CodeSessionBusy}
	ErrSessionNotFound    = &Error{Code: CodeSessionNotFound}
	ErrUnknownCommand     = &Error{Code: CodeUnknownCommand}
	ErrCommandUnsupported = &Error{Code: CodeCommandUnsupported}
	ErrProviderNotFound   = &Error{Code: CodeProviderNotFound}
	ErrModelNotFound      = &Error{Code: CodeModelNotFound}
	ErrTimeout            = &Error{Code: CodeTimeout}
	ErrShuttingDown       = &Error{Code: CodeShuttingDown}
	ErrUnauthorized       = &Error{Code: CodeUnauthorized}
	ErrForbidden          = &Error{Code: CodeForbidden}
)

// RetrySoon reports whether code refuses a request for a passing reason —
// every slot busy, no node up, a node stopping or gone — that the same
// request may not meet a moment later: its answer says when to retry.
func RetrySoon(code string) bool {
	switch code {
	case CodeAtCapacity, CodeNoNodeAvailable, CodeShuttingDown, CodeNodeDisconnected:
		return true
	}
	return false
}

// knownCodes are this version's stable codes (KnownCode).
var knownCodes = func() map[string]struct{} {
	m := map[string]struct{}{}
	for _, c := range []string{
		CodeInternal, CodeInvalidRequest, CodeUnknownToken, CodeDuplicateConn, CodeConfigError,
		CodeNodeNotFound, CodeNoNodeAvailable, CodeNodeDisconnected, CodeAdapterNotFound,
		CodeTargetNotFound, CodeAtCapacity, CodeRunNotFound, CodeRunFinished, CodeRunFailed,
		CodeCancelled, CodeTimeout, CodeSessionUnsupported, CodeSessionBusy, CodeSessionNotFound,
		CodeUnknownCommand, CodeCommandUnsupported, CodeProviderNotFound, CodeModelNotFound,
		CodeProviderError, CodeProviderUnreachable, CodeStreamReset, CodeShuttingDown,
		CodeUnauthorized, CodeForbidden, CodeRateLimited, CodeCrossOrigin, CodeHostNotAllowed,
		CodeTooManyConnections, CodeHistoryUnavailable, CodeRunLost, CodeNodeRemoved, CodeIdentityMismatch,
		CodeResultTooLarge, CodeBadResult, CodeTooManySubscriptions,
	} {
		m[c] = struct{}{}
	}
	return m
}()

// KnownCode reports whether code is one of this version's stable codes.
// A node may report others (a newer node's, or made up): they reach
// callers and the history as they are (PeerCode), but metrics count them
// under one label value, so a node cannot grow the edge's series.
func KnownCode(code string) bool {
	_, ok := knownCodes[code]
	return ok
}

// MaxPeerCode is the longest error code the edge keeps from a node.
const MaxPeerCode = 64

// PeerCode is the code the edge keeps for an error a node reported: code
// itself when it is shaped like one (1 to MaxPeerCode bytes of a–z, 0–9
// and _, as every stable code is; a newer node may report one this edge
// does not know), CodeProviderError otherwise, so a caller's answer, an
// event or the history never carries arbitrary text as a code.
func PeerCode(code string) string {
	if code == "" || len(code) > MaxPeerCode {
		return CodeProviderError
	}
	for i := 0; i < len(code); i++ {
		c := code[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return CodeProviderError
		}
	}
	return code
}

// MaxPeerMessage is the most of an error message the edge keeps from a
// node, in bytes: what a node cuts its own to before it sends them.
const MaxPeerMessage = 8 << 10

// ClipMessage returns msg if it is at most max bytes, else its head, cut
// at a character boundary, and a marker saying how long it was, within
// limit bytes in all.
func ClipMessage(msg string, limit int) string {
	if len(msg) <= limit {
		return msg
	}
	mark := fmt.Sprintf("… (%d bytes in all)", len(msg))
	cut := limit - len(mark)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:max(cut, 0)] + mark
}

// PeerError is the code and message the edge keeps for an error a node
// reported: the code as PeerCode keeps it, and the message cut to
// MaxPeerMessage (a node cuts its own so; a broken or hostile one that
// does not must not have the edge log, publish and keep megabytes),
// quoting (cut) a code PeerCode replaced.
func PeerError(code, msg string) (string, string) {
	msg = ClipMessage(msg, MaxPeerMessage)
	if c := PeerCode(code); c != code {
		return c, fmt.Sprintf("the node reported an error with an invalid code (%.*q): %s", MaxPeerCode, code, msg)
	}
	return code, msg
}
