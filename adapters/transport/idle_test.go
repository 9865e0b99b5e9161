package transport

import (
	"runtime"
	"strings"
	"testing"
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
