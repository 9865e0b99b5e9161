// Package deadline keeps a connection's read or write deadline ahead of its
// progress without a timer update per read or write.
package deadline

import "time"

// Lazy moves a deadline Timeout ahead of now at most once per Slack. A
// deadline that only has to catch a stalled or silent peer need not move
// on every frame or chunk (each move is a runtime timer update, which
// showed in profiles); with Lazy the deadline in force is always between
// Timeout-Slack and Timeout ahead of the last call. A Timeout of zero or
// less means no deadline: Next never reports one. The zero Lazy is due at
// once. Not safe for concurrent use.
type Lazy struct {
	Timeout, Slack time.Duration
	set            time.Time // when the deadline was last moved
}

// Next reports whether the deadline should move at now, and to when. The
// caller sets it (e.g. net.Conn.SetReadDeadline(d)).
func (l *Lazy) Next(now time.Time) (d time.Time, due bool) {
	if l.Timeout <= 0 || now.Sub(l.set) < l.Slack {
		return time.Time{}, false
	}
	l.set = now
	return now.Add(l.Timeout), true
}

// Quarter is a Lazy for timeout moved once per quarter of it: the usual
// choice for a write deadline, which then gives every write at least three
// quarters of the timeout.
func Quarter(timeout time.Duration) Lazy { return Lazy{Timeout: timeout, Slack: timeout / 4} }
