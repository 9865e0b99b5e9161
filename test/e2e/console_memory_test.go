package e2e

// Browser tests of what the web console keeps of the runs it sees on the
// live feed: within its bounds, and the run an operator is watching kept
// however many other runs come and go. They drive the page against
// fakeConsoleEdge (console_feed_test.go) and skip without Chromium.

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A run of large deltas (an exec target's 32 KiB reads) is kept within the
// page's bounds: the events list keeps what its rows show of each event, not
// every delta's text, which made the tab hold hundreds of MiB for one run of
// a big output while its output was cut to 1 MiB.
func TestConsoleRunEventsKeepNoFullText(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	openFake(b, f, "nodes")
	const n = 3000 // deltas of 4 KiB: 12 MiB of output, past the 1 MiB kept
	chunk := strings.Repeat("y", 4095) + "\n"
	f.setRun("big", "running")
	f.publish(map[string]any{"run_id": "big", "node": "n1", "seq": 1, "type": "start"})
	for i := 2; i <= n+1; i++ {
		f.publish(map[string]any{"run_id": "big", "node": "n1", "seq": i, "type": "delta", "text": chunk})
	}
	f.publish(map[string]any{"run_id": "big", "node": "n1", "seq": n + 2, "type": "complete"})
	f.setRun("big", "succeeded")
	b.waitJS(60*time.Second, "the run's end folded", `runs.get('big') && runs.get('big').status === 'succeeded'`)
	// What the tab holds of the run: its output (at most 1 MiB and a
	// quarter) and its events, which must not hold each delta's 4 KiB again.
	held := evalJS[int](b, `JSON.stringify(runs.get('big').events).length`)
	if held > n*400 {
		t.Errorf("the run's %d events hold %d characters (its output is %d): each delta's text is kept again in its event", n+2, held,
			evalJS[int](b, `runs.get('big').output.length`))
	}
	// The run's page still shows each event's row as before: its type and
	// the start of its data.
	evalJS[string](b, `location.hash = '#/run/big'`)
	b.waitJS(10*time.Second, "run page rows", `document.querySelectorAll('.events-table tbody tr').length === `+fmt.Sprint(n+2))
	row := evalJS[[]string](b, `[...document.querySelectorAll('.events-table tbody tr')[1].children].map((td) => td.textContent)`)
	if want := `{"text":"` + strings.Repeat("y", 291) + "…"; len(row) != 3 || row[0] != "2" || row[1] != "delta" || row[2] != want {
		t.Errorf("a delta's row: %q, want [2 delta %q]", row, want)
	}
	b.checkClean()
}
