package httpapi

import (
	"log/slog"
	"strings"
	"sync"
	"time"
)

// tlsHandshakeError starts the line http.Server logs for every connection
// whose TLS handshake failed.
const tlsHandshakeError = "http: TLS handshake error from "

// serverErrorLog is what the API's http.Server logs through (its
// ErrorLog): each line at warn, except failed TLS handshakes, which anyone
// who reaches an HTTPS port can cause at will (a scanner, a plaintext
// client, a load balancer's TCP check): those are counted and logged at
// most once per refusalLogEvery, the first at once, each line with the
// count since the last and the last address and reason, as refused
// connections are.
type serverErrorLog struct {
	log *slog.Logger
	now func() time.Time // time.Now when nil

	mu       sync.Mutex
	failed   int // failed handshakes not logged yet
	loggedAt time.Time
}

func (e *serverErrorLog) Write(p []byte) (int, error) {
	msg := strings.TrimRight(string(p), "\n")
	rest, ok := strings.CutPrefix(msg, tlsHandshakeError)
	if !ok {
		e.log.Warn(msg)
		return len(p), nil
	}
	remote, reason, _ := strings.Cut(rest, ": ")
	now := time.Now()
	if e.now != nil {
		now = e.now()
	}
	e.mu.Lock()
	e.failed++
	if !e.loggedAt.IsZero() && now.Sub(e.loggedAt) < refusalLogEvery {
		e.mu.Unlock()
		return len(p), nil
	}
	n := e.failed
	e.failed, e.loggedAt = 0, now
	e.mu.Unlock()
	e.log.Warn("http api: failed TLS handshakes", "count", n, "last_remote", remote, "last_err", reason)
	return len(p), nil
}
