package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Connection caps of the metrics.listen listener. A Prometheus server keeps
// one connection per scrape target; 16 per address leaves room for a few
// scrapers behind one NAT, and 64 in total bounds what the keyless
// listener can cost the edge (goroutines, buffers, descriptors).
const (
	DefaultMetricsMaxConns        = 64
	DefaultMetricsMaxConnsPerAddr = 16
)

// MaxHeaderBytes bounds a request's line and headers on the API and
// metrics listeners; past it (plus the 4 KiB net/http allows on top: 68 KiB
// in all) net/http answers 431 and closes. Go's default
// (1 MiB) let ~130,000 tiny distinct headers cost ~15 MiB of edge memory per
// connection before any key was checked. The largest legitimate headers (an
// API key, the Claude Code, Codex and OpenAI SDK headers, a browser's
// cookies) are a few KiB.
const MaxHeaderBytes = 64 << 10

// MetricsServer serves GET /metrics alone on metrics.listen, without an API
// key (MetricsOnlyHandler), under the same kind of connection caps as the
// API's listener (connLimiter): a connection over them is answered 503
// too_many_connections with Connection: close, or closed at once in a
// flood. Every request, and every idle connection, has a deadline.
type MetricsServer struct {
	addr string
	h    http.Handler
	log  *slog.Logger
	// MaxConns and MaxConnsPerAddr: the caps; zero takes the defaults. Set
	// them before Start.
	MaxConns, MaxConnsPerAddr int

	mu  sync.Mutex
	srv *http.Server
	ln  net.Listener
	lim *connLimiter
}

// NewMetricsServer serves metrics on addr once started.
func NewMetricsServer(addr string, metrics http.Handler, log *slog.Logger) *MetricsServer {
	if metrics == nil || log == nil {
		panic("httpapi.NewMetricsServer: nil handler or logger")
	}
	return &MetricsServer{addr: addr, h: metrics, log: log}
}

// Start binds the listener synchronously, so a busy port fails here, and
// serves on a goroutine until Stop.
func (m *MetricsServer) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.srv != nil {
		return errors.New("metrics server already started")
	}
	total, perAddr := m.MaxConns, m.MaxConnsPerAddr
	if total <= 0 {
		total = DefaultMetricsMaxConns
	}
	if perAddr <= 0 {
		perAddr = DefaultMetricsMaxConnsPerAddr
	}
	ln, lim, err := listenLimited(m.addr, total, perAddr, m.log)
	if err != nil {
		return fmt.Errorf("metrics.listen %s: %w", m.addr, err)
	}
	m.ln, m.lim = ln, lim
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", MetricsOnlyHandler(m.addr, m.h))
	m.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if why, over := refusedConn(r); over {
				answerRefused(w, writeJSONError, why, "the metrics listener")
				return
			}
			h, pattern := mux.Handler(r)
			if pattern == "" {
				unrouted(w, r, h, DialectIOP)
				return
			}
			mux.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
	}
	lim.hook(m.srv)
	srv, sln := m.srv, m.ln
	go func() {
		if err := srv.Serve(sln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("metrics listener stopped", "err", err)
		}
	}()
	return nil
}

// Addr is the bound address; nil before Start.
func (m *MetricsServer) Addr() net.Addr {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ln == nil {
		return nil
	}
	return m.ln.Addr()
}

// Stop closes the listener and waits, up to ctx, for requests in flight.
func (m *MetricsServer) Stop(ctx context.Context) error {
	m.mu.Lock()
	srv := m.srv
	m.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Shutdown(ctx)
}
