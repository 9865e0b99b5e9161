package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"iop/adapters/internal/requestid"
)

// Response headers naming the run and node a request concerned; the access
// log reads them back.
const (
	headerRunID = "X-IOP-Run-ID"
	headerNode  = "X-IOP-Node"
)

// logAccess writes one access-log line for a finished request: the route
// pattern (never the query or body, which may carry user data), status,
// duration, the caller's key name, the run and node it concerned, and the
// request id the caller got (an Anthropic-shaped answer's request-id: one
// the edge made for its own answer, or the provider's on one it relayed),
// so a caller quoting it finds the line.
func (s *Server) logAccess(sw *statusWriter, r *http.Request, start time.Time, key string) {
	level := slog.LevelDebug
	if s.AccessLog {
		level = slog.LevelInfo
	}
	ctx := r.Context()
	if !s.log.Enabled(ctx, level) {
		return
	}
	route := r.Pattern
	if route == "" {
		route = "(unrouted)"
	} else if _, rest, ok := strings.Cut(route, " "); ok {
		route = rest
	}
	now := time.Now()
	var attrs [10]slog.Attr // room for all
	a := append(attrs[:0],
		slog.String("method", r.Method), slog.String("route", route), slog.Int("status", sw.status()),
		slog.Duration("duration", now.Sub(start)), slog.Int64("bytes", sw.bytes), slog.String("key", key),
	)
	h := sw.Header()
	run := h.Get(headerRunID)
	if run == "" && strings.HasPrefix(route, "/v1/runs/{id}") {
		run = r.PathValue("id")
	}
	if run != "" {
		a = append(a, slog.String("run", run))
	}
	if node := h.Get(headerNode); node != "" {
		a = append(a, slog.String("node", node))
	} else if strings.HasPrefix(route, "/v1/nodes/{id}") {
		a = append(a, slog.String("node", r.PathValue("id")))
	}
	if id := h.Get(requestid.Header); id != "" {
		if len(id) > maxLoggedRequestID {
			id = id[:maxLoggedRequestID] // a provider's header: bounded in the log
		}
		a = append(a, slog.String("request_id", id))
	}
	a = append(a, slog.String("remote", r.RemoteAddr))
	logNoSource(ctx, s.log, now, level, "http request", a...)
}

// maxLoggedRequestID bounds the request id an access line carries
// (Anthropic's are 28 bytes).
const maxLoggedRequestID = 128

// logNoSource logs like Logger.LogAttrs but without the caller's program
// counter, which Logger takes with runtime.Callers on every line (a
// measurable share of a request's CPU) for handlers that report the source
// line. The edge's handlers do not (bootstrap.NewLogger sets no AddSource),
// so the line is the same.
func logNoSource(ctx context.Context, log *slog.Logger, t time.Time, level slog.Level, msg string, attrs ...slog.Attr) {
	rec := slog.NewRecord(t, level, msg, 0)
	rec.AddAttrs(attrs...)
	_ = log.Handler().Handle(ctx, rec)
}
