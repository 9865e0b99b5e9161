package transport

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/domain"
)

// goroutineStacks returns the stack of every goroutine in the process.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// A live link costs two goroutines per side: the read loop runs on the
// goroutine that owns the link (the edge's readLink, which took over from
// the connection's serve; the node's Run), and no goroutine of either side
// only waits for the link to end.
func TestLinkReadsOnItsOwnersGoroutine(t *testing.T) {
	p := newPair(t, pairOptions{}, nil)
	owners := map[string]int{"(*Server).readLink": 0, "(*Client).Run": 0}
	eventually(t, p.ctx, "both read loops running on their owners' goroutines", func() bool {
		for name := range owners {
			owners[name] = 0
		}
		for _, g := range goroutineStacks() {
			if !strings.Contains(g, "iop/adapters/transport.") {
				continue
			}
			if strings.Contains(g, "transport.(*Server).serve(") || strings.Contains(g, "transport.(*Client).register(") {
				return false // a handshake goroutine still there
			}
			for name := range owners {
				if strings.Contains(g, "transport."+name+"(") {
					if !strings.Contains(g, "(*Conn).readLoop(") {
						return false // an owner waiting, not reading
					}
					owners[name]++
				}
			}
		}
		return owners["(*Server).readLink"] == 1 && owners["(*Client).Run"] == 1
	})
}

// A node's stats go out now and every interval from timers, not from a
// goroutine of the link's, and stop when the node does.
func TestNodeStatsReportedFromTimers(t *testing.T) {
	var calls atomic.Int64
	stats := func() domain.NodeStats { return domain.NodeStats{ChildProcesses: int(calls.Add(1))} }
	p := newPair(t, pairOptions{client: ClientConfig{Stats: stats, StatsInterval: 20 * time.Millisecond}}, nil)
	eventually(t, p.ctx, "three reports at the edge", func() bool {
		s, ok := p.link.NodeStats()
		return ok && s.ChildProcesses >= 3
	})
	for _, g := range goroutineStacks() {
		if strings.Contains(g, "transport.reportStats") && !strings.Contains(g, "(*statsReporter).send(") {
			t.Errorf("a goroutine waits for the next stats report:\n%s", g)
		}
	}
	if err := p.cli.stop(t); err != nil {
		t.Fatal(err)
	}
	n := calls.Load()
	time.Sleep(100 * time.Millisecond)
	if m := calls.Load(); m != n {
		t.Errorf("%d stats reports after the node stopped", m-n)
	}
}
