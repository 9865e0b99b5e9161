package e2e

// Browser tests of what the web console keeps of the runs it sees on the
// live feed: within its bounds, and the run an operator is watching kept
// however many other runs come and go. They drive the page against
// fakeConsoleEdge (console_feed_test.go) and skip without Chromium.

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
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

// The page keeps the last 300 runs it saw on the feed; the run whose page is
// open, and a run still going, are not the ones it lets go. A long run
// watched on its page while more than 300 short ones came and went lost its
// output there: the page showed only what came after, and no more event rows
// until the run's count passed what it had shown.
func TestConsoleWatchedRunOutlivesManyRuns(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.setRun("long", "running")
	f.setRun("other", "running")
	openFake(b, f, "run/long")
	f.publish(map[string]any{"run_id": "long", "node": "n1", "seq": 1, "type": "start"})
	f.publish(map[string]any{"run_id": "long", "node": "n1", "seq": 2, "type": "delta", "text": "first part\n"})
	// A second long run, not watched, still going.
	f.publish(map[string]any{"run_id": "other", "node": "n1", "seq": 1, "type": "start"})
	f.publish(map[string]any{"run_id": "other", "node": "n1", "seq": 2, "type": "delta", "text": "other's first part\n"})
	b.waitJS(10*time.Second, "the first part", `document.getElementById('run-output').textContent === 'first part\n'`)
	const short = 400
	for i := range short {
		id := fmt.Sprintf("short%03d", i)
		f.publish(map[string]any{"run_id": id, "node": "n1", "seq": 1, "type": "start"})
		f.publish(map[string]any{"run_id": id, "node": "n1", "seq": 2, "type": "complete"})
	}
	f.publish(map[string]any{"run_id": "long", "node": "n1", "seq": 3, "type": "delta", "text": "second part\n"})
	f.publish(map[string]any{"run_id": "other", "node": "n1", "seq": 3, "type": "delta", "text": "other's second part\n"})
	b.waitJS(20*time.Second, "the short runs and the second parts folded",
		`runs.has('short399') && document.getElementById('run-output').textContent.includes('second part') && runs.get('other') && runs.get('other').lastSeq === 3`)
	if out := evalJS[string](b, `document.getElementById('run-output').textContent`); out != "first part\nsecond part\n" {
		t.Errorf("the watched run's page shows %q after %d other runs, want both parts", out, short)
	}
	if rows := evalJS[[]string](b, `[...document.querySelectorAll('.events-table tbody tr')].map((tr) => tr.firstElementChild.textContent)`); strings.Join(rows, ",") != "1,2,3" {
		t.Errorf("the watched run's event rows: seqs %q, want 1,2,3", rows)
	}
	if out := evalJS[string](b, `runs.get('other').output`); out != "other's first part\nother's second part\n" {
		t.Errorf("a run still going, after %d short runs that ended: output kept %q, want both parts", short, out)
	}
	if n := evalJS[int](b, `runs.size`); n > 300 {
		t.Errorf("the tab keeps %d runs, want at most 300", n)
	}
	b.checkClean()
}

// intercept puts fn in front of the fake edge's routes (before the page
// makes any request): a request fn answers (returning true) goes no further.
func intercept(f *fakeConsoleEdge, fn func(w http.ResponseWriter, r *http.Request) bool) {
	next := f.Config.Handler
	f.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fn(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// checkCleanBut is checkClean, but for the browser's report of the failed
// requests a test made the edge answer with status.
func (b *browser) checkCleanBut(status int) {
	b.t.Helper()
	b.mu.Lock()
	var rest []string
	for _, p := range b.problems {
		if !strings.Contains(p, fmt.Sprintf("status of %d", status)) {
			rest = append(rest, p)
		}
	}
	b.problems = rest
	b.mu.Unlock()
	b.checkClean()
}

// historyDown answers as an edge whose history database is unreachable.
func historyDown(w http.ResponseWriter) {
	writeFakeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": map[string]string{"code": "history_unavailable",
		"message": "the run history cannot be read right now (its database is unreachable); the edge's log has the details"}})
}

// errorShown is a page expression: an error box that says code is on the
// page.
func errorShown(code string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('#main .error-box')].some((e) => e.textContent.includes(%q))`, code)
}

// A run's page whose first read of the run's record failed (the history's
// database down a moment) says so, and says it no more once the record is
// read: the error stayed for good above a run that streamed, ended and
// showed its record.
func TestConsoleRunPageRecordErrorClears(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	var down atomic.Bool
	down.Store(true)
	intercept(f, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet && r.URL.Path == "/v1/runs/w1" && down.Load() {
			historyDown(w)
			return true
		}
		return false
	})
	f.setRun("w1", "running")
	openFake(b, f, "run/w1")
	b.waitJS(10*time.Second, "the record's error", errorShown("history_unavailable"))
	f.publish(map[string]any{"run_id": "w1", "node": "n1", "seq": 1, "type": "start"})
	f.publish(map[string]any{"run_id": "w1", "node": "n1", "seq": 2, "type": "delta", "text": "hello\n"})
	b.waitJS(10*time.Second, "the output", `document.getElementById('run-output').textContent === 'hello\n'`)
	down.Store(false)
	f.setRun("w1", "succeeded")
	f.publish(map[string]any{"run_id": "w1", "node": "n1", "seq": 3, "type": "complete"})
	b.waitJS(10*time.Second, "the record read", `[...document.querySelectorAll('#run-record dt')].some((dt) => dt.textContent === 'finished at')`)
	if evalJS[bool](b, errorShown("history_unavailable")) {
		t.Errorf("the run's page still shows the failed read of its record once the record was read: %q", b.text(`#main`))
	}
	b.checkCleanBut(http.StatusServiceUnavailable)
}

// The Runs page's Older that failed says so, and says it no more once it
// worked: the error stayed above the rows it then added.
func TestConsoleOlderErrorClears(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	for i := range 150 {
		f.setRun(fmt.Sprintf("done-%03d", i), "succeeded")
	}
	var down atomic.Bool
	intercept(f, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet && r.URL.Path == "/v1/runs" && r.URL.Query().Get("cursor") != "" && down.Load() {
			historyDown(w)
			return true
		}
		return false
	})
	openFake(b, f, "runs")
	b.waitJS(10*time.Second, "history drawn", `document.querySelectorAll('#runs-history tbody tr').length === 100`)
	down.Store(true)
	b.click(`#runs-older`)
	b.waitJS(10*time.Second, "Older's error", errorShown("history_unavailable"))
	down.Store(false)
	b.do(10*time.Second, "click Older again", chromedp.Click(chromedp.CSS(`#runs-older`), chromedp.NodeVisible))
	b.waitJS(10*time.Second, "the older runs", `document.querySelectorAll('#runs-history tbody tr').length === 150`)
	if evalJS[bool](b, errorShown("history_unavailable")) {
		t.Errorf("the Runs page still shows Older's failure once Older worked")
	}
	b.checkCleanBut(http.StatusServiceUnavailable)
}

// A run's cost reads as what it was, however small: the run's page showed
// $0.000123 as "0" (a plain number rounded to three decimals), and the Runs
// table a cost under a thousandth of a cent as "$0.00000".
func TestConsoleSmallCosts(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.setRun("cheap", "succeeded")
	f.setRun("cheaper", "succeeded")
	f.mu.Lock()
	for _, r := range f.runs {
		switch r["run_id"] {
		case "cheap":
			r["usage"] = map[string]any{"prompt_tokens": 1000, "completion_tokens": 234, "total_tokens": 1234, "cost_usd": 0.000123}
		case "cheaper":
			r["usage"] = map[string]any{"total_tokens": 12, "cost_usd": 0.0000012}
		}
	}
	f.mu.Unlock()
	openFake(b, f, "runs")
	b.waitJS(10*time.Second, "history drawn", `document.querySelectorAll('#runs-history tbody tr').length === 2`)
	costCell := func(id string) string {
		return evalJS[string](b, fmt.Sprintf(`document.querySelector('#runs-history tr[data-run=%q]').children[8].textContent`, id))
	}
	if got := costCell("cheap"); got != "$0.000123" {
		t.Errorf("the Runs table's cost of $0.000123: %q", got)
	}
	if got := costCell("cheaper"); got != "$0.00000120" {
		t.Errorf("the Runs table's cost of $0.0000012: %q", got)
	}
	evalJS[string](b, `location.hash = '#/run/cheap'`)
	b.waitJS(10*time.Second, "the run's usage", `[...document.querySelectorAll('#run-usage dt')].some((dt) => dt.textContent === 'cost usd')`)
	usage := evalJS[map[string]string](b, `Object.fromEntries([...document.querySelectorAll('#run-usage dt')].map((dt) => [dt.textContent, dt.nextElementSibling.textContent]))`)
	if usage["cost usd"] != "$0.000123" || usage["total tokens"] != "1,234" {
		t.Errorf("the run's page shows usage %q, want cost usd $0.000123 and total tokens 1,234", usage)
	}
	// The usage chart's gridlines of a range that cost $0.0004 in all.
	labels := evalJS[[]string](b, `(() => {
		const pts = Array.from({ length: 4 }, () => ({ t: new Date(), group: 'n1', v: 0.0001 }));
		const el = barChart(pts, new Date(Date.now() - 3600e3), 'cost_usd');
		return [...el.querySelectorAll('svg > text[x="50"]')].map((t) => t.textContent);
	})()`)
	if strings.Join(labels, " ") != "$0 $0.000100 $0.000200 $0.000300 $0.000400" {
		t.Errorf("the cost chart's gridlines for $0.0004: %q", labels)
	}
	b.checkClean()
}

// The tunnel ledger's lines are per node, key, provider and model: the
// Usage page's table left out the key, so two keys' lines of one model read
// as the same line twice.
func TestConsoleTunnelLinesByKey(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	line := func(key string, requests int) map[string]any {
		return map[string]any{"node": "n1", "key": key, "provider": "openai", "model": "gpt-4o", "requests": requests, "errors": 0,
			"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "body_bytes": 900}
	}
	intercept(f, func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/v1/usage" {
			return false
		}
		writeFakeJSON(w, 200, map[string]any{"usage": []any{}, "tunnels": []any{line("ci", 5), line("alice", 3)}})
		return true
	})
	openFake(b, f, "usage")
	b.waitJS(10*time.Second, "the tunnel lines", `document.querySelectorAll('#usage-tunnels tbody tr').length === 2`)
	rows := evalJS[[]string](b, `[...document.querySelectorAll('#usage-tunnels tr')].map((tr) => [...tr.children].map((c) => c.textContent).join('|'))`)
	if want := []string{
		"node|key|provider|model|requests|errors|prompt|completion|total tokens|bytes",
		"n1|ci|openai|gpt-4o|5|0|10|5|15|900",
		"n1|alice|openai|gpt-4o|3|0|10|5|15|900",
	}; strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("the tunnel table:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	b.checkClean()
}

// The Nodes page left while its first read of the nodes was on its way
// stops reading them: its poll, started once that read was answered, went
// on reading GET /v1/nodes every 5 s for a page no longer shown, until the
// page after it was left too.
func TestConsoleNodesPollStopsWhenLeft(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	var held atomic.Bool
	var asked atomic.Int64
	release := make(chan struct{})
	intercept(f, func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/v1/nodes" {
			return false
		}
		asked.Add(1)
		if held.Load() {
			select {
			case <-release:
			case <-r.Context().Done():
				return true
			}
		}
		return false
	})
	openFake(b, f, "events")
	evalJS[any](b, `sessionStorage.setItem('iop.console.nodesPollMs', '100'), location.hash = '#/nodes'`)
	held.Store(true)
	b.do(15*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#main [data-page="nodes"]`)))
	waitFor(t, "the held read of the nodes", func() error {
		if asked.Load() == 0 {
			return fmt.Errorf("GET /v1/nodes not asked yet")
		}
		return nil
	})
	evalJS[string](b, `location.hash = '#/events'`)
	b.waitJS(10*time.Second, "the Events page", `document.querySelector('#main [data-page="events"]')`)
	before := asked.Load()
	held.Store(false)
	close(release)
	// Ten of the page's polls' time on the Events page, which reads no
	// nodes.
	time.Sleep(time.Second)
	if n := asked.Load() - before; n > 0 {
		t.Errorf("GET /v1/nodes asked %d times in 1 s after the Nodes page (polling every 100 ms) was left", n)
	}
	b.checkClean()
}

// A tab opened while the edge was away (restarting) reads what its page
// shows again once the live feed comes up: the feed's first connection
// reloaded nothing, so the Runs page kept its failed reads' errors under a
// header that said "● live" until a run started or ended.
func TestConsolePageOpenedWhileEdgeAwayRecovers(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.setRun("r1", "succeeded")
	var down atomic.Bool
	down.Store(true)
	intercept(f, func(w http.ResponseWriter, r *http.Request) bool {
		if !down.Load() || !strings.HasPrefix(r.URL.Path, "/v1/") {
			return false
		}
		writeFakeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": map[string]string{"code": "unavailable", "message": "the edge is restarting"}})
		return true
	})
	b.open(f.URL + "/ui/#/runs")
	b.waitJS(10*time.Second, "the Runs page's errors", errorShown("the edge is restarting"))
	b.waitJS(10*time.Second, "the feed retrying", `document.getElementById('bus-state').textContent.includes('reconnecting')`)
	down.Store(false)
	b.waitJS(15*time.Second, "the feed live", `document.getElementById('bus-state').classList.contains('live')`)
	b.waitJS(10*time.Second, "the history read again", `document.querySelector('#runs-history tr[data-run="r1"]') && !`+errorShown("the edge is restarting"))
	b.checkCleanBut(http.StatusServiceUnavailable)
}

// The Nodes page says what GET /v1/nodes says of a node beyond connected or
// not: that a connected one is draining (stopping: Start a run no longer
// offers it), and why an offline one left.
func TestConsoleNodesDrainingAndWhyLeft(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	draining := fakeNode("n1")
	draining["draining"] = true
	left := fakeNode("n2")
	left["connected"] = false
	left["disconnected_at"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	left["disconnect_reason"] = "heartbeat timeout: no heartbeat for 30s"
	f.setNodes(draining, left)
	openFake(b, f, "nodes")
	b.waitJS(10*time.Second, "both nodes", `document.querySelector('[data-node="n1"]') && document.querySelector('[data-node="n2"]')`)
	if !evalJS[bool](b, `!!document.querySelector('[data-node="n1"] h3 .badge.draining')`) {
		t.Errorf("the draining node's card: %q, want a draining badge", b.text(`[data-node="n1"] h3`))
	}
	if got := b.text(`[data-node="n2"] [data-disconnected]`); !strings.Contains(got, "heartbeat timeout: no heartbeat for 30s") {
		t.Errorf("the offline node's card says it left %q, without why", got)
	}
	b.checkClean()
}
