package httpapi

import (
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Response headers naming the run and node a request concerned; the access
// log reads them back.
const (
	headerRunID = "X-IOP-Run-ID"
	headerNode  = "X-IOP-Node"
)

// logAccess writes one access-log line for a finished request: the route
// pattern (never the query or body, which may carry user data), status,
// duration, the caller's key name, and the run and node it concerned.
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
	attrs := make([]slog.Attr, 0, 9) // room for all: one allocation per line
	attrs = append(attrs,
		slog.String("method", r.Method), slog.String("route", route), slog.Int("status", sw.status()),
		slog.Duration("duration", time.Since(start)), slog.Int64("bytes", sw.bytes), slog.String("key", key),
	)
	h := sw.Header()
	run := h.Get(headerRunID)
	if run == "" && strings.HasPrefix(route, "/v1/runs/{id}") {
		run = r.PathValue("id")
	}
	if run != "" {
		attrs = append(attrs, slog.String("run", run))
	}
	if node := h.Get(headerNode); node != "" {
		attrs = append(attrs, slog.String("node", node))
	} else if strings.HasPrefix(route, "/v1/nodes/{id}") {
		attrs = append(attrs, slog.String("node", r.PathValue("id")))
	}
	attrs = append(attrs, slog.String("remote", r.RemoteAddr))
	s.log.LogAttrs(ctx, level, "http request", attrs...)
}
