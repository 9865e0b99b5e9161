package edgestore

import (
	"net"
	"time"

	"iop/adapters/internal/sockpeek"
)

// peerClosed reports whether an idle connection to PostgreSQL can no
// longer carry a statement: the server closed or reset it, or sent its
// FATAL goodbye (a restart, idle_session_timeout, pg_terminate_backend).
// Where the socket cannot be looked at (sockpeek.Supported), a statement
// on such a connection is retried once instead (Store.retry).
func peerClosed(nc net.Conn) bool {
	// pgdriver leaves the last statement's read deadline set; once it has
	// passed, a read fails before it looks. Each statement sets its own.
	if sockpeek.Supported && nc.SetReadDeadline(time.Time{}) != nil {
		return true
	}
	return sockpeek.Closed(nc)
}
