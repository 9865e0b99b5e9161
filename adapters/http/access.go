package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
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
	s.logAccessN(sw, r, start, key, -1)
}

// logRefused logs a request refused before its route's handler (a
// connection over the caps, a browser guard, a missing or wrong key, a
// throttled address): the first refusal of an address at once, later ones
// as one line per address per refusalLogEvery, counting in unlogged those
// not logged since. One unauthenticated connection pipelining requests
// made one line each, 50,000 in 1.4 s. pattern is the route the request
// would have reached ("" for none).
func (s *Server) logRefused(sw *statusWriter, r *http.Request, start time.Time, key, pattern string) {
	skipped, due := s.refusals.due(remoteHost(r), time.Now())
	if !due {
		return
	}
	r.Pattern = pattern // the mux, which sets it, was never reached
	s.logAccessN(sw, r, start, key, skipped)
}

// logAccessN is logAccess; unlogged, if not negative, is the number of the
// address's refused requests not logged since its last refusal line.
func (s *Server) logAccessN(sw *statusWriter, r *http.Request, start time.Time, key string, unlogged int) {
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
	var attrs [11]slog.Attr // room for all
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
	id := h.Get(requestid.Header)
	if id == "" {
		id = h.Get(requestid.OpenAIHeader)
	}
	if id != "" {
		if len(id) > maxLoggedRequestID {
			id = id[:maxLoggedRequestID] // a provider's header: bounded in the log
		}
		a = append(a, slog.String("request_id", id))
	}
	a = append(a, slog.String("remote", r.RemoteAddr))
	if unlogged >= 0 {
		a = append(a, slog.Int("refused_unlogged", unlogged))
	}
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

// refusalLog spaces the access lines of refused requests per address (see
// logRefused). At most maxThrottled addresses are tracked; when full,
// those whose last line is older than the interval are forgotten first,
// then any.
type refusalLog struct {
	mu sync.Mutex
	m  map[string]*refusalCount
}

type refusalCount struct {
	unlogged int
	lastLog  time.Time
}

// due counts a refusal from addr and reports whether to log it, with the
// number of addr's refusals not logged since its last line.
func (l *refusalLog) due(addr string, now time.Time) (skipped int, log bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.m[addr]
	if !ok {
		if l.m == nil {
			l.m = map[string]*refusalCount{}
		}
		if len(l.m) >= maxThrottled {
			for a, o := range l.m {
				if now.Sub(o.lastLog) >= refusalLogEvery {
					delete(l.m, a)
				}
			}
			for a := range l.m {
				if len(l.m) < maxThrottled {
					break
				}
				delete(l.m, a)
			}
		}
		l.m[addr] = &refusalCount{lastLog: now}
		return 0, true
	}
	if now.Sub(c.lastLog) < refusalLogEvery {
		c.unlogged++
		return 0, false
	}
	skipped = c.unlogged
	c.unlogged, c.lastLog = 0, now
	return skipped, true
}
