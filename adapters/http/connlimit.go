package httpapi

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"iop/adapters/internal/connquota"
	"iop/domain"
)

// Connection caps of the HTTP listener (Server.MaxConns, MaxConnsPerAddr).
// Without them one address could hold any number of idle keep-alive
// connections (each a goroutine and its buffers) until the edge ran out of
// file descriptors, the node-link listener included. 256 per address is far
// above what a client, a load tool or a NAT of users needs at once; 8,192 in
// total stays well below usual descriptor limits.
const (
	DefaultMaxConns        = 8192
	DefaultMaxConnsPerAddr = 256
)

// maxRefusing bounds the over-cap connections kept open to be answered 503
// (a goroutine each, for at most the header timeout); past it they are
// closed at once, which is what a flood of them gets.
const maxRefusing = 64

// refusalLogEvery spaces the log lines about refused and evicted
// connections: a flood gives one line per period with the counts.
const refusalLogEvery = 10 * time.Second

// connLimiter enforces the caps. Connections are counted per network prefix
// (connquota.Key: an IPv4 address, an IPv6 /64). At the total, room is made
// by closing a connection that does no work — idle between requests, or new
// and still without a complete request — of the prefix holding the most
// such connections (connquota): a connection in the middle of a request or
// a stream is never closed to make room. A newcomer from a prefix at its
// cap, or from the prefix holding the most itself, is refused: answered 503
// and closed when few refusals are in flight, else closed at once.
type connLimiter struct {
	log *slog.Logger

	mu       sync.Mutex
	q        *connquota.Quota[*limitedConn]
	refusing int
	// Counts since the last log line, the last prefixes refused and
	// closed to make room, and when the line was written.
	refused, evicted         int
	lastRefused, lastEvicted string
	loggedAt                 time.Time
}

func newConnLimiter(total, perAddr int, log *slog.Logger) *connLimiter {
	if total <= 0 {
		total = DefaultMaxConns
	}
	if perAddr <= 0 {
		perAddr = DefaultMaxConnsPerAddr
	}
	return &connLimiter{log: log, q: connquota.New[*limitedConn](total, perAddr)}
}

// listenLimited binds addr and counts its connections with a new
// connLimiter of those caps (zero or less: the API listener's defaults).
// The server serving the listener gets lim's hooks (serveLimited).
func listenLimited(addr string, total, perAddr int, log *slog.Logger) (net.Listener, *connLimiter, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	lim := newConnLimiter(total, perAddr, log)
	return &limitedListener{Listener: ln, lim: lim}, lim, nil
}

// hook makes srv tell l each connection's state (which makes idle ones
// closeable to make room) and hand a refused connection's reason to its
// requests (refusedConn).
func (l *connLimiter) hook(srv *http.Server) {
	srv.ConnContext = refusedConnContext
	srv.ConnState = l.connState
}

// answerRefused answers a request that came on a connection over the caps
// (refusedConn said why): 503 too_many_connections in write's dialect, and
// the connection closed after it. what names the listener in the message.
func answerRefused(w http.ResponseWriter, write Dialect, why, what string) {
	w.Header().Set("Connection", "close")
	w.Header().Set("Retry-After", "1")
	write(w, http.StatusServiceUnavailable, domain.CodeTooManyConnections,
		why+" to "+what+"; close idle connections or retry later")
}

// limitedListener admits every connection through its connLimiter.
type limitedListener struct {
	net.Listener
	lim *connLimiter
}

func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := l.lim.admit(c); lc != nil {
			return lc, nil
		}
	}
}

// limitedConn is a connection counted by a connLimiter; closing it releases
// its place.
type limitedConn struct {
	net.Conn
	lim *connLimiter
	m   *connquota.Member[*limitedConn] // nil for a refused connection
	// refused, if set, is why this connection is over the caps: it is
	// answered 503 with Connection: close (Server.serveHTTP).
	refused string
	once    sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.lim.release(c) })
	return c.Conn.Close()
}

// CloseWrite passes the half-close through: http.Server sends FIN before it
// lingers on a connection it closes with a request body unread, as it does
// on a bare *net.TCPConn, so the client reads the answer and not a reset.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// admit counts c, or closes it and returns nil.
func (l *connLimiter) admit(c net.Conn) *limitedConn {
	lc := &limitedConn{Conn: c, lim: l}
	key := connquota.Key(c.RemoteAddr().String())
	l.mu.Lock()
	m, victim, why := l.q.Admit(key, lc)
	switch {
	case why == "":
		lc.m = m
	case l.refusing < maxRefusing:
		l.refusing++
		lc.refused = string(why)
	default:
		lc = nil
	}
	if why != "" {
		l.refused++
		l.lastRefused = key
	}
	if victim != nil {
		l.evicted++
		l.lastEvicted = connquota.Key(victim.Value.RemoteAddr().String())
	}
	var attrs []any
	if l.dueLocked() {
		attrs = []any{"refused", l.refused, "last_refused", l.lastRefused, "closed_idle", l.evicted, "last_closed_idle", l.lastEvicted}
		l.refused, l.evicted, l.lastRefused, l.lastEvicted = 0, 0, "", ""
	}
	l.mu.Unlock()
	// Closing the victim's socket ends the server's read of its next
	// request; its goroutine then closes it through limitedConn.Close.
	if victim != nil {
		_ = victim.Value.Conn.Close()
	}
	if lc == nil {
		_ = c.Close()
	}
	if attrs != nil {
		l.log.Warn("http connections over the caps: refused, or idle ones closed to make room (counts since the last such line)", attrs...)
	}
	return lc
}

// dueLocked reports whether a refusal or eviction is to be logged now.
func (l *connLimiter) dueLocked() bool {
	if l.refused+l.evicted == 0 {
		return false
	}
	now := time.Now()
	if now.Sub(l.loggedAt) < refusalLogEvery {
		return false
	}
	l.loggedAt = now
	return true
}

func (l *connLimiter) release(c *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.m == nil {
		l.refusing--
		return
	}
	l.q.Remove(c.m)
}

// connState follows the server's view of each connection: one reading or
// answering a request is busy, one idle between requests may be closed to
// make room. A new connection is closeable until its first request has
// been read (http.Server reports StateActive then).
func (l *connLimiter) connState(c net.Conn, st http.ConnState) {
	lc := asLimited(c)
	if lc == nil || lc.m == nil {
		return
	}
	var idle bool
	switch st {
	case http.StateActive:
	case http.StateIdle:
		idle = true
	default:
		return
	}
	l.mu.Lock()
	l.q.SetEvictable(lc.m, idle)
	l.mu.Unlock()
}

// counts reports the connections counted in total and from key, and how
// many of key's may be closed to make room (tests).
func (l *connLimiter) counts(key string) (total, fromKey, evictable int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.q.Len(), l.q.Count(key), l.q.Evictable(key)
}

// asLimited finds the limitedConn under what the http.Server holds (a
// *tls.Conn on an HTTPS listener).
func asLimited(c net.Conn) *limitedConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, _ := c.(*limitedConn)
	return lc
}

// refusedConnKey marks, in a connection's context, a connection kept only to
// be told it is over the caps.
type refusedConnKey struct{}

func refusedConnContext(ctx context.Context, c net.Conn) context.Context {
	if lc := asLimited(c); lc != nil && lc.refused != "" {
		return context.WithValue(ctx, refusedConnKey{}, lc.refused)
	}
	return ctx
}

// refusedConn reports why r's connection is over the caps, if it is.
func refusedConn(r *http.Request) (string, bool) {
	why, ok := r.Context().Value(refusedConnKey{}).(string)
	return why, ok
}
