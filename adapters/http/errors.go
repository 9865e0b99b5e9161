package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"iop/domain"
)

// statusClientClosed is the status recorded for a request whose caller
// left before its answer (nginx's 499, as the provider surfaces record it):
// nobody reads it, and it is no failure of the edge's.
const statusClientClosed = 499

// statusFor is the one mapping from domain errors to HTTP statuses.
func statusFor(err error) int {
	switch domain.CodeOf(err) {
	case domain.CodeInvalidRequest, domain.CodeUnknownCommand:
		return http.StatusBadRequest
	case domain.CodeNodeNotFound, domain.CodeRunNotFound, domain.CodeSessionNotFound,
		domain.CodeAdapterNotFound, domain.CodeTargetNotFound, domain.CodeModelNotFound, domain.CodeProviderNotFound:
		return http.StatusNotFound
	case domain.CodeRunFinished, domain.CodeSessionBusy:
		return http.StatusConflict
	case domain.CodeConfigError:
		return http.StatusUnprocessableEntity
	case domain.CodeAtCapacity, domain.CodeTooManySubscriptions:
		return http.StatusTooManyRequests
	case domain.CodeSessionUnsupported, domain.CodeCommandUnsupported:
		return http.StatusNotImplemented
	case domain.CodeProviderError, domain.CodeProviderUnreachable, domain.CodeStreamReset, domain.CodeResultTooLarge, domain.CodeBadResult:
		return http.StatusBadGateway
	case domain.CodeNoNodeAvailable, domain.CodeNodeDisconnected, domain.CodeShuttingDown, domain.CodeHistoryUnavailable:
		return http.StatusServiceUnavailable
	case domain.CodeTimeout:
		return http.StatusGatewayTimeout
	case domain.CodeUnauthorized:
		return http.StatusUnauthorized
	case domain.CodeForbidden:
		return http.StatusForbidden
	case domain.CodeCancelled:
		return statusClientClosed
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// writeError answers err as {"error":{"code","message"}} with statusFor's status.
// An internal error's text (a database's, a library's) never reaches the
// caller: it is logged, and the caller gets a generic message.
func writeError(w http.ResponseWriter, err error) {
	code := domain.CodeOf(err)
	if code == domain.CodeInternal && errors.Is(err, context.DeadlineExceeded) {
		code = domain.CodeTimeout
	}
	if code == domain.CodeInternal && errors.Is(err, context.Canceled) {
		// The request's context ended: its caller left (or the edge cut
		// the connection at its stop). A 499, not an internal error.
		code = domain.CodeCancelled
		err = &domain.Error{Code: code, Message: "the request was cancelled: " + err.Error()}
	}
	msg := domain.MessageOf(err)
	if code == domain.CodeInternal {
		noteInternal(w, err)
		msg = "internal error; the edge's log has the details"
	}
	if domain.RetrySoon(code) {
		w.Header().Set("Retry-After", "1") // clients back off by it, not by their own guess
	}
	writeJSONError(w, statusFor(err), code, msg)
}

// noteInternal hands err to the access log's writer, found through any
// wrapping middleware; without one it goes to the default logger.
func noteInternal(w http.ResponseWriter, err error) {
	for {
		if n, ok := w.(interface{ noteInternal(error) }); ok {
			n.noteInternal(err)
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			slog.Error("internal error answered", "err", err)
			return
		}
		w = u.Unwrap()
	}
}

type errorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type errorBody struct {
	Error errorJSON `json:"error"`
}

func writeJSONError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, errorBody{Error: errorJSON{Code: code, Message: message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(errorBody{Error: errorJSON{Code: domain.CodeInternal, Message: "encode response: " + err.Error()}})
	}
	writeRawJSON(w, status, b)
}

func writeRawJSON(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
	_, _ = w.Write([]byte("\n"))
}
