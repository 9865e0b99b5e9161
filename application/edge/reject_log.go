package edge

import (
	"log/slog"
	"net"
	"sync"
	"time"
)

// rejectLog aggregates the warnings about connections the edge refused, so a
// flood of bad registrations or idle sockets costs a line per address per
// interval, not one per connection: the first refusal from an address is
// logged at once, the ones after it within the interval are counted and
// logged as one line with the count when the interval ends.
type rejectLog struct {
	log      *slog.Logger
	interval time.Duration

	mu     sync.Mutex
	addrs  map[string]*rejectCount
	closed bool
}

type rejectCount struct {
	n      int
	reason string // the latest
	timer  *time.Timer
}

// maxRejectAddrs bounds the table; past it, new addresses share one entry.
const maxRejectAddrs = 4096

const otherAddrs = "other"

func newRejectLog(log *slog.Logger, interval time.Duration) *rejectLog {
	return &rejectLog{log: log, interval: interval, addrs: map[string]*rejectCount{}}
}

// note records one refusal from remote ("host:port"). It reports whether
// this one was logged on its own (the first from its address this interval).
func (l *rejectLog) note(msg, remote, node, reason string) bool {
	addr := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		addr = h
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	if c := l.addrs[addr]; c != nil {
		c.n++
		c.reason = reason
		return false
	}
	if len(l.addrs) >= maxRejectAddrs {
		addr = otherAddrs
		if c := l.addrs[addr]; c != nil {
			c.n++
			c.reason = reason
			return false
		}
	}
	l.addrs[addr] = &rejectCount{timer: time.AfterFunc(l.interval, func() { l.flush(addr) })}
	l.log.Warn(msg, "node", node, "remote", remote, "reason", reason)
	return true
}

// flush ends addr's interval, logging what it counted after the first.
func (l *rejectLog) flush(addr string) {
	l.mu.Lock()
	c := l.addrs[addr]
	delete(l.addrs, addr)
	l.mu.Unlock()
	if c != nil && c.n > 0 {
		l.log.Warn("connections refused", "address", addr, "count", c.n, "interval", l.interval, "last_reason", c.reason)
	}
}

// close stops the timers and logs what is still counted.
func (l *rejectLog) close() {
	l.mu.Lock()
	l.closed = true
	var pending []string
	for addr, c := range l.addrs {
		if c.timer.Stop() {
			pending = append(pending, addr)
		}
	}
	l.mu.Unlock()
	for _, addr := range pending {
		l.flush(addr)
	}
}
