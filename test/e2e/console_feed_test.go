package e2e

// Browser tests of how the web console follows the live feed when it
// misbehaves — a connection that dies silently, events the edge dropped, a
// feed that closes, a run longer than the page keeps — and of its small
// formatting helpers. A real edge does none of that on demand, so the page
// here talks to fakeConsoleEdge: the console's own files (the package the
// edge embeds) and a scripted /v1 API. They skip without Chromium, as
// console_test.go does.

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"iop/adapters/http/console"
)

// fakeConsoleEdge answers the routes the console calls.
type fakeConsoleEdge struct {
	*httptest.Server
	t *testing.T

	mu sync.Mutex
	// keys, when not empty, are the accepted API keys: "all" may do
	// anything, "no-events" gets 403 on GET /v1/events, "runs-only" (the
	// "runs" scope without "read") 403 on every GET and on node commands.
	// A revoked key is 401.
	keys    map[string]string
	revoked map[string]bool
	// nodes is what GET /v1/nodes lists.
	nodes []any
	// starts are the bodies of the POST /v1/runs that started a run.
	starts []map[string]any
	// runs are the history's records, oldest first.
	runs []map[string]any
	// runsHold, when set, holds GET /v1/runs answers (read from runs when
	// asked) until it is closed; runsAsked counts those requests.
	runsHold  chan struct{}
	runsAsked int
	// feeds are the open GET /v1/events connections; busKeys the key each
	// connection came with, in order.
	feeds   []*fakeFeed
	busKeys []string
	// keepAlive is how often a feed sends ": keep-alive" (0: never, as a
	// connection that died without a FIN or RST looks).
	keepAlive time.Duration
	// runEvents, when set, is the stream of a run started with POST
	// /v1/runs: each event goes to the caller and to every feed.
	runEvents func(runID string) []map[string]any
	// busAheadDropping, when set, makes the feeds get the run's events
	// first, without these seqs (events the edge dropped for a slow
	// subscriber), 200 ms after the caller got the headers, and the caller
	// its stream 300 ms later.
	busAheadDropping []int
	// stallAfter, when > 0, makes a run's stream send its first stallAfter
	// events, then hold the connection open without a byte more, not even a
	// keep-alive (as a connection that died without a FIN or RST, or that a
	// proxy holds, looks), until the caller closes it. The run, with the
	// events its stream did not send, goes to held; heldClosed counts the
	// streams so held whose callers closed them.
	stallAfter int
	held       chan heldRun
	heldClosed int
	// done is closed when the test ends, so that a held stream lets the
	// server close.
	done chan struct{}
	// eventsTries are the GET /v1/events requests, refused ones too;
	// eventsStatus, when set, is what they are answered.
	eventsTries  []eventsTry
	eventsStatus int
}

type heldRun struct {
	id   string
	rest []map[string]any
}

type eventsTry struct {
	query string
	at    time.Time
}

type fakeFeed struct {
	out  chan string
	quit chan struct{}
}

func newFakeConsoleEdge(t *testing.T) *fakeConsoleEdge {
	f := &fakeConsoleEdge{t: t, keys: map[string]string{}, revoked: map[string]bool{}, held: make(chan heldRun, 1), done: make(chan struct{}),
		nodes: []any{fakeNode("n1")}}
	mux := http.NewServeMux()
	mux.Handle("GET /ui/", console.Handler())
	mux.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, r *http.Request) {
		if f.auth(w, r, "") {
			f.mu.Lock()
			nodes := slices.Clone(f.nodes)
			f.mu.Unlock()
			writeFakeJSON(w, 200, map[string]any{"nodes": nodes})
		}
	})
	mux.HandleFunc("GET /v1/usage", func(w http.ResponseWriter, r *http.Request) {
		if f.auth(w, r, "") {
			writeFakeJSON(w, 200, map[string]any{"usage": []any{}, "tunnels": []any{}})
		}
	})
	mux.HandleFunc("GET /v1/runs", func(w http.ResponseWriter, r *http.Request) {
		if !f.auth(w, r, "") {
			return
		}
		f.mu.Lock()
		var list []map[string]any
		for _, rec := range f.runs {
			if st := r.URL.Query().Get("status"); st == "" || rec["status"] == st {
				list = append(list, maps.Clone(rec))
			}
		}
		hold := f.runsHold
		f.runsAsked++
		f.mu.Unlock()
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		slices.Reverse(list)
		// ?limit= and ?cursor= (here an offset) page the list, as the
		// edge's history does.
		off, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
		list = list[min(off, len(list)):]
		answer := map[string]any{"runs": list}
		if limit, _ := strconv.Atoi(r.URL.Query().Get("limit")); limit > 0 && len(list) > limit {
			answer["runs"] = list[:limit]
			answer["next_cursor"] = strconv.Itoa(off + limit)
		}
		writeFakeJSON(w, 200, answer)
	})
	mux.HandleFunc("GET /v1/runs/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !f.auth(w, r, "") {
			return
		}
		if rec := f.run(r.PathValue("id")); rec != nil {
			writeFakeJSON(w, 200, rec)
			return
		}
		writeFakeJSON(w, 404, map[string]any{"error": map[string]string{"code": "run_not_found", "message": "no such run"}})
	})
	// The scope probe (node "-") sends a body that is not JSON: 400, the
	// scope is there. The nodes page asks n1 for its RTT.
	mux.HandleFunc("POST /v1/nodes/{id}/commands", func(w http.ResponseWriter, r *http.Request) {
		if !f.auth(w, r, "") {
			return
		}
		if r.PathValue("id") == "-" {
			writeFakeJSON(w, 400, map[string]any{"error": map[string]string{"code": "invalid_request", "message": "not JSON"}})
			return
		}
		writeFakeJSON(w, 200, map[string]any{"last_rtt_ms": 1.5})
	})
	mux.HandleFunc("POST /v1/runs", f.startRun)
	mux.HandleFunc("GET /v1/events", f.events)
	f.Server = httptest.NewServer(mux)
	t.Cleanup(func() {
		close(f.done)
		f.closeFeeds()
		f.Close()
	})
	return f
}

// fakeNode is a connected node with one exec adapter.
func fakeNode(id string) map[string]any {
	return map[string]any{"id": id, "connected": true,
		"adapters": []any{map[string]any{"name": "exec", "type": "exec", "max_concurrency": 4, "in_flight": 0}}}
}

// setNodes changes what GET /v1/nodes lists.
func (f *fakeConsoleEdge) setNodes(nodes ...map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = nil
	for _, n := range nodes {
		f.nodes = append(f.nodes, n)
	}
}

// publishNode sends a node.* event on the bus.
func (f *fakeConsoleEdge) publishNode(typ, id string) {
	b, _ := json.Marshal(map[string]any{"type": typ, "time": time.Now().UTC().Format(time.RFC3339Nano), "node": id})
	f.send("event: " + typ + "\ndata: " + string(b) + "\n\n")
}

func writeFakeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// auth answers 401 or 403 as the edge would and reports whether to go on.
func (f *fakeConsoleEdge) auth(w http.ResponseWriter, r *http.Request, route string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.keys) == 0 {
		return true
	}
	key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	kind, ok := f.keys[key]
	if !ok || f.revoked[key] {
		writeFakeJSON(w, 401, map[string]any{"error": map[string]string{"code": "unauthorized", "message": "unknown API key"}})
		return false
	}
	if route == "events" && kind == "no-events" ||
		kind == "runs-only" && (r.Method == http.MethodGet || strings.HasSuffix(r.URL.Path, "/commands")) {
		// The edge's scope refusal (adapters/http auth), which the page
		// tells from its other 403s.
		writeFakeJSON(w, 403, map[string]any{"error": map[string]string{"code": "forbidden",
			"message": fmt.Sprintf("API key %q lacks the %q scope needed for %s %s", kind, "read", r.Method, r.URL.Path)}})
		return false
	}
	return true
}

func (f *fakeConsoleEdge) run(id string) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.runs {
		if r["run_id"] == id {
			return r
		}
	}
	return nil
}

// setRun adds a run record or changes its status.
func (f *fakeConsoleEdge) setRun(id, status string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.runs {
		if r["run_id"] == id {
			r["status"] = status
			if status != "running" {
				r["finished_at"] = time.Now().UTC().Format(time.RFC3339Nano)
			}
			return
		}
	}
	f.runs = append(f.runs, map[string]any{"run_id": id, "node": "n1", "adapter": "exec", "target": "t", "status": status,
		"created_at": time.Now().UTC().Format(time.RFC3339Nano)})
}

func (f *fakeConsoleEdge) events(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.eventsTries = append(f.eventsTries, eventsTry{r.URL.RawQuery, time.Now()})
	status := f.eventsStatus
	f.mu.Unlock()
	if status != 0 {
		writeFakeJSON(w, status, map[string]any{"error": map[string]string{"code": "unavailable", "message": "the edge is restarting"}})
		return
	}
	if !f.auth(w, r, "events") {
		return
	}
	feed := &fakeFeed{out: make(chan string, 1<<14), quit: make(chan struct{})}
	f.mu.Lock()
	f.feeds = append(f.feeds, feed)
	f.busKeys = append(f.busKeys, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	keepAlive := f.keepAlive
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.feeds = slices.DeleteFunc(f.feeds, func(x *fakeFeed) bool { return x == feed })
		f.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, ": subscribed\n\n")
	w.(http.Flusher).Flush()
	var tick <-chan time.Time
	if keepAlive > 0 {
		tk := time.NewTicker(keepAlive)
		defer tk.Stop()
		tick = tk.C
	}
	for {
		select {
		case s := <-feed.out:
			_, _ = io.WriteString(w, s)
			// Whatever else is queued goes in the same write.
			for more := true; more; {
				select {
				case s := <-feed.out:
					_, _ = io.WriteString(w, s)
				default:
					more = false
				}
			}
			w.(http.Flusher).Flush()
		case <-tick:
			_, _ = io.WriteString(w, ": keep-alive\n\n")
			w.(http.Flusher).Flush()
		case <-feed.quit:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// send writes raw SSE text to every open feed.
func (f *fakeConsoleEdge) send(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, feed := range f.feeds {
		feed.out <- s
	}
}

// publish sends one run event on the bus, as a run.event.
func (f *fakeConsoleEdge) publish(ev map[string]any) {
	b, _ := json.Marshal(map[string]any{"type": "run.event", "time": time.Now().UTC().Format(time.RFC3339Nano), "node": "n1", "run": ev})
	f.send("event: run.event\ndata: " + string(b) + "\n\n")
}

// closeFeeds ends every open feed, as an edge's restart would.
func (f *fakeConsoleEdge) closeFeeds() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, feed := range f.feeds {
		close(feed.quit)
	}
	f.feeds = nil
}

// busConnections is how many GET /v1/events were answered with a stream,
// and with which keys.
func (f *fakeConsoleEdge) busConnections() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.busKeys)
}

func (f *fakeConsoleEdge) startRun(w http.ResponseWriter, r *http.Request) {
	if !f.auth(w, r, "") {
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err == nil && body["session_id"] == "foreign" {
		// What the edge answers for a session another key owns
		// (application/edge recall_session.go): a 403 that is no scope
		// refusal.
		writeFakeJSON(w, 403, map[string]any{"error": map[string]string{"code": "forbidden",
			"message": fmt.Sprintf("session %q of adapter %q belongs to another API key", body["session_id"], body["adapter"])}})
		return
	} else if err != nil || f.runEvents == nil {
		writeFakeJSON(w, 400, map[string]any{"error": map[string]string{"code": "invalid_request", "message": "not JSON"}})
		return
	}
	f.mu.Lock()
	f.starts = append(f.starts, body)
	f.mu.Unlock()
	id := fmt.Sprintf("run_fake_%d", time.Now().UnixNano())
	f.setRun(id, "running")
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-IOP-Run-ID", id)
	w.Header().Set("X-IOP-Node", "n1")
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
	f.mu.Lock()
	drop, stall := f.busAheadDropping, f.stallAfter
	f.mu.Unlock()
	evs := f.runEvents(id)
	if stall > 0 {
		for _, ev := range evs[:stall] {
			b, _ := json.Marshal(ev)
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev["type"], b)
			f.publish(ev)
		}
		w.(http.Flusher).Flush()
		select {
		case f.held <- heldRun{id, evs[stall:]}:
		case <-f.done:
			return
		}
		select {
		case <-r.Context().Done():
			f.mu.Lock()
			f.heldClosed++
			f.mu.Unlock()
		case <-f.done:
		}
		return
	}
	if drop != nil {
		// The page has the headers (the run's id) before the bus's events
		// come; only its stream's events are behind.
		time.Sleep(200 * time.Millisecond)
		for _, ev := range evs {
			if !slices.Contains(drop, ev["seq"].(int)) {
				f.publish(ev)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	for i, ev := range evs {
		b, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev["type"], b)
		if drop == nil {
			f.publish(ev)
		}
		if i%100 == 0 {
			w.(http.Flusher).Flush()
		}
	}
	w.(http.Flusher).Flush()
	f.setRun(id, "succeeded")
}

// openFake opens the console on the fake edge and waits for its live feed.
func openFake(b *browser, f *fakeConsoleEdge, page string) {
	b.t.Helper()
	b.open(f.URL + "/ui/#/" + page)
	b.waitJS(10*time.Second, "bus connected", `document.getElementById('bus-state').classList.contains('live')`)
}

// The duration column and the usage chart's gridlines read right at the
// edges: no "60.0 s" nor "1m 60s", and no fractional request counts.
func TestConsoleFormatting(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	openFake(b, f, "nodes")
	for _, c := range []struct {
		ms   int
		want string
	}{
		{999, "999 ms"}, {1000, "1.0 s"}, {59949, "59.9 s"}, {59950, "1m 0s"}, {59999, "1m 0s"},
		{60000, "1m 0s"}, {119499, "1m 59s"}, {119500, "2m 0s"}, {119999, "2m 0s"}, {3599600, "60m 0s"},
	} {
		got := evalJS[string](b, fmt.Sprintf(`dur('2026-03-01T12:00:00Z', new Date(Date.parse('2026-03-01T12:00:00Z') + %d).toISOString())`, c.ms))
		if got != c.want {
			t.Errorf("dur of %d ms: %q, want %q", c.ms, got, c.want)
		}
	}
	// A request count's chart top gives four whole gridline steps; cost may
	// step by fractions.
	for _, v := range []float64{1, 3, 4, 5, 7, 8, 9, 10, 11, 19, 21, 37, 99, 101, 990, 12345} {
		for _, m := range []string{"requests", "total_tokens"} {
			top := evalJS[float64](b, fmt.Sprintf(`niceMax(%v, %q)`, v, m))
			if top < v || top != float64(int64(top)) || int64(top)%4 != 0 {
				t.Errorf("niceMax(%v, %s) = %v: want a multiple of 4 at least %v", v, m, top, v)
			}
		}
	}
	if top := evalJS[float64](b, `niceMax(9, 'cost_usd')`); top != 10 {
		t.Errorf("niceMax(9, cost_usd) = %v, want 10 (steps of 2.5)", top)
	}
	// The drawn labels: nine requests in one bucket.
	labels := evalJS[[]string](b, `(() => {
		const pts = Array.from({ length: 9 }, () => ({ t: new Date(), group: 'n1', v: 1 }));
		const el = barChart(pts, new Date(Date.now() - 3600e3), 'requests');
		return [...el.querySelectorAll('svg > text[x="50"]')].map((t) => t.textContent); // the y axis (L - 6)
	})()`)
	if len(labels) != 5 {
		t.Fatalf("gridline labels %q, want 5", labels)
	}
	for _, l := range labels {
		if strings.ContainsAny(l, ".,") {
			t.Errorf("gridline label %q of a request count is not a whole number (labels %q)", l, labels)
		}
	}
	b.checkClean()
}

// A run started from "Start a run" arrives twice, on its own stream and on
// the bus; past the 4,000 events the page keeps, its output was folded
// twice. Its page shows each line once.
func TestConsoleLongRunOutputOnce(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	const n = 4100
	f.runEvents = func(id string) []map[string]any {
		evs := []map[string]any{{"run_id": id, "node": "n1", "seq": 1, "type": "start"}}
		for i := 2; i < n; i++ {
			evs = append(evs, map[string]any{"run_id": id, "node": "n1", "seq": i, "type": "delta", "text": fmt.Sprintf("line %d\n", i)})
		}
		return append(evs, map[string]any{"run_id": id, "node": "n1", "seq": n, "type": "complete"})
	}
	openFake(b, f, "start")
	b.waitJS(10*time.Second, "start form", `document.getElementById('start-submit')`)
	b.click(`#start-submit`)
	b.waitJS(20*time.Second, "run complete", `document.getElementById('start-status').innerText === 'succeeded'`)
	id := evalJS[string](b, `document.querySelector('#start-run a').innerText`)
	// The bus's copies arrive around the same time; give them a moment.
	time.Sleep(500 * time.Millisecond)
	b.click(`#start-run a`)
	b.waitJS(10*time.Second, "run page", `document.querySelector('[data-page="run"]') && document.getElementById('run-output').innerText.includes('line 4099')`)
	out := evalJS[string](b, `document.getElementById('run-output').textContent`)
	if got := strings.Count(out, "line 4099\n"); got != 1 {
		t.Errorf("line 4099 shown %d times on run %s's page", got, id)
	}
	if got, want := strings.Count(out, "\n"), n-2; got != want {
		t.Errorf("run %s's page shows %d lines, want %d", id, got, want)
	}

	// The same by hand, without the Start page's own stream: two feeds of
	// one run, interleaved, each event folded once (the first) however
	// many events the run has.
	lines := evalJS[int](b, `(() => {
		const evs = [{ run_id: 'r2', seq: 1, type: 'start' }];
		for (let i = 2; i <= 4100; i++) evs.push({ run_id: 'r2', seq: i, type: 'delta', text: 'x\n' });
		for (const ev of evs) { applyRunEvent(ev); applyRunEvent({ ...ev }); }
		// A late copy of an early event changes nothing either.
		applyRunEvent({ run_id: 'r2', seq: 3, type: 'delta', text: 'x\n' });
		return runs.get('r2').output.split('\n').length - 1;
	})()`)
	if lines != 4099 {
		t.Errorf("two interleaved feeds of 4099 deltas fold into %d lines, want 4099", lines)
	}

	// The bus ahead of the run's own stream and missing events (dropped for
	// a slow tab): the page follows the run's own stream, which has them
	// all, in order.
	f.mu.Lock()
	f.busAheadDropping = []int{3, 4}
	f.runEvents = func(id string) []map[string]any {
		evs := []map[string]any{{"run_id": id, "node": "n1", "seq": 1, "type": "start"}}
		for i := 2; i <= 5; i++ {
			evs = append(evs, map[string]any{"run_id": id, "node": "n1", "seq": i, "type": "delta", "text": fmt.Sprintf("line %d\n", i)})
		}
		return append(evs, map[string]any{"run_id": id, "node": "n1", "seq": 6, "type": "complete"})
	}
	f.mu.Unlock()
	b.open(f.URL + "/ui/#/start")
	b.waitJS(10*time.Second, "start form", `document.querySelector('#start-adapter option[value="exec"]')`)
	b.click(`#start-submit`)
	b.waitJS(10*time.Second, "short run complete", `document.getElementById('start-status').innerText === 'succeeded'`)
	b.click(`#start-run a`)
	b.waitJS(10*time.Second, "its run page", `document.querySelector('[data-page="run"]') && document.getElementById('run-output').innerText.includes('line 5')`)
	if out := evalJS[string](b, `document.getElementById('run-output').textContent`); out != "line 2\nline 3\nline 4\nline 5\n" {
		t.Errorf("run page output with the bus ahead and lossy: %q", out)
	}
	b.checkClean()
}

// A run whose end the bus never showed leaves "In flight" once the edge says
// it ended: when the history is read, when the edge reports dropped events,
// and when the feed comes back after a break.
func TestConsoleMissedEndsSettle(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	inFlight := func(id string) string { return fmt.Sprintf(`document.querySelector('#runs-live tr[data-run=%q]')`, id) }
	start := func(id string) {
		t.Helper()
		f.setRun(id, "running")
		f.publish(map[string]any{"run_id": id, "node": "n1", "seq": 1, "type": "start", "metadata": map[string]any{"adapter": "exec", "target": "t"}})
		b.waitJS(10*time.Second, id+" in flight", inFlight(id))
		// The history read the start makes the page do is over: only what
		// comes next can tell the page of the end.
		b.waitJS(10*time.Second, id+" running in the history", fmt.Sprintf(`document.querySelector('#runs-history tr[data-run=%q] .badge.running')`, id))
	}
	openFake(b, f, "runs")

	// The history, read again, says r1 ended.
	start("r1")
	f.setRun("r1", "succeeded")
	b.click(`form.panel button.primary`) // Filter
	b.waitJS(10*time.Second, "r1 out of In flight after the history said it ended", "!"+inFlight("r1"))

	// The edge dropped events (r2's end among them).
	start("r2")
	f.setRun("r2", "failed")
	f.send(": dropped 7 events\n\n")
	b.waitJS(10*time.Second, "r2 out of In flight after dropped events", "!"+inFlight("r2"))

	// The feed broke and came back (r3's end was sent while it was away).
	start("r3")
	f.setRun("r3", "cancelled")
	before := len(f.busConnections())
	f.closeFeeds()
	waitFor(t, "the feed made again", func() error {
		if n := len(f.busConnections()); n <= before {
			return fmt.Errorf("%d feed connections", n)
		}
		return nil
	})
	b.waitJS(10*time.Second, "r3 out of In flight after the feed came back", "!"+inFlight("r3"))
	b.checkClean()
}

// A run that starts while the Runs page's first reads are on their way
// (they read the history before it) is in the history once they are
// answered: the page listened to the feed before it read, and read again.
func TestConsoleEventDuringFirstLoad(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	hold := make(chan struct{})
	f.mu.Lock()
	f.runsHold = hold
	f.mu.Unlock()
	openFake(b, f, "runs")
	// Both first reads (runs in flight, the history) are held.
	waitFor(t, "the page's first reads", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.runsAsked < 2 {
			return fmt.Errorf("%d reads of GET /v1/runs", f.runsAsked)
		}
		return nil
	})
	f.setRun("r1", "running")
	f.publish(map[string]any{"run_id": "r1", "node": "n1", "seq": 1, "type": "start", "metadata": map[string]any{"adapter": "exec", "target": "t"}})
	f.mu.Lock()
	f.runsHold = nil
	f.mu.Unlock()
	close(hold)
	b.waitJS(10*time.Second, "r1 running in the history", `document.querySelector('#runs-history tr[data-run="r1"] .badge.running')`)
	b.checkClean()
}

// A feed that stays silent past the idle limit (no keep-alive: the
// connection died without a word) is made again; one whose keep-alives
// arrive is kept. The Events page says its own feed stopped.
func TestConsoleDeadFeed(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.mu.Lock()
	f.keepAlive = 300 * time.Millisecond
	f.mu.Unlock()
	b.open(f.URL + "/ui/#/nodes")
	// The limit is shortened for the test (60 s otherwise), then the page
	// loaded again to read it.
	evalJS[bool](b, `sessionStorage.setItem('iop.console.sseIdleMs', '1500'), true`)
	b.do(15*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#main [data-page]`)))
	b.waitJS(10*time.Second, "bus connected", `document.getElementById('bus-state').classList.contains('live')`)
	if got := evalJS[float64](b, `SSE_IDLE_MS`); got != 1500 {
		t.Fatalf("SSE_IDLE_MS = %v, want the 1500 the test set", got)
	}
	// Keep-alives every 300 ms: the connection is kept.
	kept := len(f.busConnections())
	time.Sleep(4 * time.Second)
	if n := len(f.busConnections()); n != kept {
		t.Fatalf("a feed sending keep-alives was made again: %d connections, then %d", kept, n)
	}
	// Silence: the page drops the connection and makes another.
	f.mu.Lock()
	f.keepAlive = 0
	f.mu.Unlock()
	f.closeFeeds() // the next connection is a silent one
	waitFor(t, "a silent feed's connection", func() error {
		if n := len(f.busConnections()); n <= kept {
			return fmt.Errorf("%d connections", n)
		}
		return nil
	})
	silent := len(f.busConnections())
	waitFor(t, "the silent feed made again", func() error {
		if n := len(f.busConnections()); n <= silent {
			return fmt.Errorf("%d connections", n)
		}
		return nil
	})
	b.waitJS(10*time.Second, "bus live again", `document.getElementById('bus-state').classList.contains('live')`)

	// The Events page shows the tab's feed, silent, stopped, and made
	// again by itself; it opens none of its own.
	b.open(f.URL + "/ui/#/events?type=node.*")
	b.waitJS(20*time.Second, "Events page says the feed stopped", `/stopped: no data from the edge.*Reconnecting in/s.test(document.querySelector('#ev-stopped[data-idle]')?.innerText || '')`)
	again := len(f.busConnections())
	waitFor(t, "the silent feed made again", func() error {
		if n := len(f.busConnections()); n <= again {
			return fmt.Errorf("%d connections", n)
		}
		return nil
	})
	if n := len(f.eventsTriesFor("type=node.*")); n != 0 {
		t.Errorf("the Events page opened %d feeds of its own", n)
	}
	evalJS[bool](b, `sessionStorage.removeItem('iop.console.sseIdleMs'), true`)
	b.checkClean()
}

// A key that may not read events stops the feed ("no live feed"); when a
// later key is entered (the first one refused), the feed starts again with
// it.
func TestConsoleKeyChangeRestartsFeed(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.mu.Lock()
	f.keys = map[string]string{"key-without-events": "no-events", "key-with-events": "all"}
	f.mu.Unlock()
	b.open(f.URL + "/ui/#/nodes")
	b.waitJS(10*time.Second, "key dialog", `document.getElementById('key-dialog').open`)
	b.do(10*time.Second, "enter the key without events", chromedp.SetValue(chromedp.CSS(`#key-input`), "key-without-events"))
	b.click(`#key-submit`)
	b.waitJS(10*time.Second, "no live feed", `/no live feed/.test(document.getElementById('bus-state').innerText)`)

	// The edge no longer takes that key: the nodes page's next refresh
	// (every 5 s) asks for another.
	f.mu.Lock()
	f.revoked["key-without-events"] = true
	f.mu.Unlock()
	b.waitJS(15*time.Second, "key dialog again", `document.getElementById('key-dialog').open`)
	b.do(10*time.Second, "enter the key with events", chromedp.SetValue(chromedp.CSS(`#key-input`), "key-with-events"))
	b.click(`#key-submit`)
	b.waitJS(10*time.Second, "feed live with the new key", `document.getElementById('bus-state').classList.contains('live')`)
	if keys := f.busConnections(); !slices.Contains(keys, "key-with-events") {
		t.Errorf("feed connections were made with %q, never with the new key", keys)
	}
	b.checkClean()
}

// eventsTriesFor is when GET /v1/events was asked with this query.
func (f *fakeConsoleEdge) eventsTriesFor(query string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var at []time.Time
	for _, e := range f.eventsTries {
		if e.query == query {
			at = append(at, e.at)
		}
	}
	return at
}

// A run's own stream (Start a run) that goes silent is taken for dead after
// the idle limit and closed; the page then shows the run from the bus and
// the edge's record: a run that ended while its stream was silent, with the
// output the bus carried meanwhile, and a run that goes on and ends later.
func TestConsoleRunStreamGoesSilent(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.mu.Lock()
	f.keepAlive = 300 * time.Millisecond // the bus stays up
	f.stallAfter = 3
	f.runEvents = func(id string) []map[string]any {
		evs := []map[string]any{{"run_id": id, "node": "n1", "seq": 1, "type": "start"}}
		for i := 1; i <= 3; i++ {
			evs = append(evs, map[string]any{"run_id": id, "node": "n1", "seq": i + 1, "type": "delta", "text": fmt.Sprintf("line %d\n", i)})
		}
		return append(evs, map[string]any{"run_id": id, "node": "n1", "seq": 5, "type": "complete", "usage": map[string]any{"total_tokens": 7}})
	}
	f.mu.Unlock()
	b.open(f.URL + "/ui/#/start")
	// The idle limit is shortened for the test (60 s otherwise).
	evalJS[bool](b, `sessionStorage.setItem('iop.console.sseIdleMs', '1500'), true`)
	b.do(15*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#main [data-page]`)))
	b.waitJS(10*time.Second, "bus connected", `document.getElementById('bus-state').classList.contains('live')`)
	b.waitJS(10*time.Second, "start form", `document.querySelector('#start-adapter option[value="exec"]')`)
	held := func() heldRun {
		t.Helper()
		select {
		case h := <-f.held:
			return h
		case <-time.After(10 * time.Second):
			t.Fatal("no run stream held")
		}
		return heldRun{}
	}
	output := `document.getElementById('run-output').textContent`
	stalledText := `(document.getElementById('start-stalled')?.innerText || '')`

	// The run ends while its stream is silent; the bus carries the rest.
	b.click(`#start-submit`)
	run := held()
	b.waitJS(10*time.Second, "the stream's first lines", output+` === 'line 1\nline 2\n'`)
	for _, ev := range run.rest {
		f.publish(ev)
	}
	f.setRun(run.id, "succeeded")
	b.waitJS(10*time.Second, "the page says the stream stopped", `/stream stopped: no data from the edge/.test(`+stalledText+`)`)
	b.waitJS(10*time.Second, "the run shown ended", `document.getElementById('start-status').innerText === 'succeeded' && /ended: succeeded/.test(`+stalledText+`)`)
	b.screenshot("start-stalled-ended")
	if out := evalJS[string](b, output); out != "line 1\nline 2\nline 3\n" {
		t.Errorf("output after the stream died, with the rest on the bus: %q", out)
	}
	if u := evalJS[string](b, `document.getElementById('run-usage').innerText`); !strings.Contains(u, "7") {
		t.Errorf("usage after the stream died: %q", u)
	}
	waitFor(t, "the silent stream closed by the page", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.heldClosed != 1 {
			return fmt.Errorf("%d held streams closed", f.heldClosed)
		}
		return nil
	})
	if evalJS[bool](b, `document.getElementById('cancel').hidden`) != true {
		t.Error("Cancel still offered for a run that ended")
	}

	// The run goes on after its stream was dropped, and ends later.
	b.click(`#start-submit`)
	run = held()
	b.waitJS(10*time.Second, "the page follows the run", `/stream stopped/.test(`+stalledText+`) && /goes on/.test(`+stalledText+`) && document.getElementById('start-status').innerText === 'running'`)
	if evalJS[bool](b, `document.getElementById('cancel').hidden`) {
		t.Error("Cancel not offered for a run that goes on")
	}
	for _, ev := range run.rest {
		f.publish(ev)
	}
	f.setRun(run.id, "succeeded")
	b.waitJS(10*time.Second, "the later end shown", `document.getElementById('start-status').innerText === 'succeeded' && /ended: succeeded/.test(`+stalledText+`)`)
	if out := evalJS[string](b, output); out != "line 1\nline 2\nline 3\n" {
		t.Errorf("output of the run followed on the bus: %q", out)
	}
	// Its page, and the Runs page, take it for ended too.
	b.click(`#start-run a`)
	b.waitJS(10*time.Second, "its run page", `document.querySelector('[data-page="run"]') && document.getElementById('run-status')?.innerText === 'succeeded'`)
	evalJS[bool](b, `sessionStorage.removeItem('iop.console.sseIdleMs'), true`)
	b.checkClean()
}

// The Events page makes its feed again by itself when it ends, with a
// growing, jittered wait it shows and a "Reconnect now" button; it waits for
// a hidden tab to be shown, and stops on a key that may not read events.
func TestConsoleEventsPageReconnects(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.mu.Lock()
	f.keepAlive = 300 * time.Millisecond
	f.mu.Unlock()
	// The Events page filters the tab's one feed (asked with no query).
	const q = ""
	tries := func() int { return len(f.eventsTriesFor(q)) }
	waitTries := func(what string, n int) {
		t.Helper()
		waitFor(t, what, func() error {
			if got := tries(); got < n {
				return fmt.Errorf("%d connections of the Events page, want %d", got, n)
			}
			return nil
		})
	}
	stopped := `(document.getElementById('ev-stopped')?.innerText || '')`
	row := func(id string) string {
		return fmt.Sprintf(`[...document.querySelectorAll('#events td.sum')].some((td) => td.innerText.startsWith(%q))`, id+" ")
	}
	openFake(b, f, "events?type=run.event")
	waitTries("the tab's feed", 1)

	// The feed ends: the page says so, and is back within the first wait.
	f.closeFeeds()
	b.waitJS(5*time.Second, "the page says its feed ended", `/The event stream ended\. Reconnecting in \d+ s/.test(`+stopped+`) && document.getElementById('ev-reconnect')?.innerText === 'Reconnect now'`)
	waitTries("the feed made again by itself", 2)
	b.waitJS(5*time.Second, "the notice gone", `!document.getElementById('ev-stopped')`)
	waitFor(t, "the feed subscribed", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.feeds) < 1 {
			return fmt.Errorf("%d feeds", len(f.feeds))
		}
		return nil
	})
	f.setRun("r-after", "running") // the bus's reconnects ask the edge about it
	f.publish(map[string]any{"run_id": "r-after", "node": "n1", "seq": 1, "type": "start"})
	b.waitJS(5*time.Second, "an event on the feed made again", row("r-after"))

	// A hidden tab waits to be shown.
	evalJS[bool](b, `Object.defineProperty(document, 'hidden', { configurable: true, get: () => true }), true`)
	f.closeFeeds()
	b.waitJS(10*time.Second, "the page waits for the tab", `/when this tab is shown again/.test(`+stopped+`)`)
	time.Sleep(time.Second)
	if n := tries(); n != 2 {
		t.Fatalf("a hidden tab's feed was made again: %d connections", n)
	}
	evalJS[bool](b, `Object.defineProperty(document, 'hidden', { configurable: true, get: () => false }), document.dispatchEvent(new Event('visibilitychange')), true`)
	waitTries("the feed made again once the tab is shown", 3)
	b.waitJS(5*time.Second, "the notice gone", `!document.getElementById('ev-stopped')`)

	// The edge refuses the feed (503) for a while: "Reconnect now" tries at
	// once and starts the wait again from 1 s; the waits grow.
	f.mu.Lock()
	f.eventsStatus = 503
	f.mu.Unlock()
	f.closeFeeds()
	b.waitJS(5*time.Second, "the page says its feed ended", `/Reconnecting in/.test(`+stopped+`)`)
	before := tries()
	b.click(`#ev-reconnect`)
	waitTries("four tries from Reconnect now", before+4)
	at := f.eventsTriesFor(q)[before:]
	var gaps []time.Duration
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]))
	}
	// Each wait is between half and all of 1 s, 2 s, 4 s.
	for i, g := range gaps[:3] {
		lo, hi := time.Duration(500<<i)*time.Millisecond, time.Duration(1000<<i)*time.Millisecond
		if g < lo-100*time.Millisecond || g > hi+700*time.Millisecond {
			t.Errorf("wait %d before retrying a refused feed: %v, want %v to %v (waits %v)", i+1, g, lo, hi, gaps)
		}
	}
	b.waitJS(5*time.Second, "the page says why", `/failed: unavailable: the edge is restarting\. Reconnecting in \d+ s/.test(`+stopped+`)`)
	b.screenshot("events-reconnecting")
	f.mu.Lock()
	f.eventsStatus = 0
	f.mu.Unlock()
	before = tries()
	b.click(`#ev-reconnect`)
	waitTries("Reconnect now", before+1)
	b.waitJS(5*time.Second, "the notice gone", `!document.getElementById('ev-stopped')`)

	// A key that may not read events: no retries, a button.
	f.mu.Lock()
	f.keys = map[string]string{"key-without-events": "no-events"}
	f.mu.Unlock()
	evalJS[bool](b, `sessionStorage.setItem('iop.console.key', 'key-without-events'), true`)
	b.do(15*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#main [data-page]`)))
	b.waitJS(10*time.Second, "the page says the key may not", `document.querySelector('#ev-stopped[data-refused]') && /may not read the event stream/.test(`+stopped+`) && document.getElementById('ev-reconnect')`)
	before = tries()
	time.Sleep(3 * time.Second)
	if n := tries(); n != before {
		t.Errorf("a refused key's feed was asked again: %d tries, then %d", before, n)
	}
	b.checkClean()
}

// steady calls fn(1), fn(2), … every interval until the stop it returns is
// called (or the test ends); stop waits for the last call and says how
// many there were.
func steady(t *testing.T, every time.Duration, fn func(i int)) (stop func() int) {
	quit, done := make(chan struct{}), make(chan struct{})
	n := 0
	go func() {
		defer close(done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tk.C:
				n++
				fn(n)
			}
		}
	}()
	var once sync.Once
	stop = func() int {
		once.Do(func() { close(quit) })
		<-done
		return n
	}
	t.Cleanup(func() { stop() })
	return stop
}

// A run's page draws its output while the run streams. It redrew 50 ms
// after the last event, so with events closer together than that (an LLM
// streaming 20 tokens a second or more) nothing showed until the stream
// paused.
func TestConsoleRunPageDrawsWhileStreaming(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.setRun("rfast", "running")
	openFake(b, f, "run/rfast")
	b.waitJS(10*time.Second, "the run's record", `document.getElementById('run-status')?.innerText === 'running'`)
	f.publish(map[string]any{"run_id": "rfast", "node": "n1", "seq": 1, "type": "start"})
	var last atomic.Int64
	stop := steady(t, 20*time.Millisecond, func(i int) {
		f.publish(map[string]any{"run_id": "rfast", "node": "n1", "seq": i + 1, "type": "delta", "text": fmt.Sprintf("line %d\n", i)})
		last.Store(int64(i))
	})
	output := `document.getElementById('run-output').textContent`
	b.waitJS(3*time.Second, "output drawn while the run streams", output+`.includes('line 1\n')`)
	// Drawn again as more comes, not once: a line half a second on.
	b.waitJS(3*time.Second, "later output drawn while the run streams", fmt.Sprintf(`%s.includes('line %d\n')`, output, last.Load()+25))
	n := stop()
	f.publish(map[string]any{"run_id": "rfast", "node": "n1", "seq": n + 2, "type": "complete"})
	f.setRun("rfast", "succeeded")
	b.waitJS(5*time.Second, "the run's end", `document.getElementById('run-status').innerText === 'succeeded'`)
	var want strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	b.waitJS(5*time.Second, "the whole output", output+` === `+jsString(want.String()))
	b.checkClean()
}

// jsString is s as a JS string literal (a JSON string is one).
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// The Runs page's history and the Usage page are read again while runs keep
// ending, not only once the ends stop coming: each waited for a pause in
// the terminal events (400 ms, 1 s) that steady traffic never leaves.
func TestConsoleReloadsWhileRunsKeepEnding(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	end := func(i int) {
		id := fmt.Sprintf("u%03d", i)
		f.setRun(id, "running")
		f.setRun(id, "succeeded")
		f.publish(map[string]any{"run_id": id, "node": "n1", "seq": 1, "type": "complete"})
	}
	openFake(b, f, "runs")
	b.waitJS(10*time.Second, "the empty history", `document.getElementById('runs-history').innerText === 'No runs match.'`)
	stop := steady(t, 150*time.Millisecond, end)
	rows := `document.querySelectorAll('#runs-history tbody tr').length`
	b.waitJS(4*time.Second, "the history read again while runs keep ending", rows+` > 0`)
	n := stop()
	b.waitJS(3*time.Second, "the history read again once they stop", fmt.Sprintf(`%s === %d`, rows, n))

	b.open(f.URL + "/ui/#/usage")
	count := `([...document.querySelectorAll('#usage-totals tbody tr')].find((tr) => tr.cells[0].innerText === 'n1')?.cells[1].innerText || '0')`
	b.waitJS(10*time.Second, "the usage totals", fmt.Sprintf(`%s === '%d'`, count, n))
	stop = steady(t, 300*time.Millisecond, func(i int) { end(n + i) })
	b.waitJS(4*time.Second, "usage read again while runs keep ending", fmt.Sprintf(`+%s > %d`, count, n))
	m := stop()
	b.waitJS(4*time.Second, "usage read again once they stop", fmt.Sprintf(`%s === '%d'`, count, n+m))
	b.checkClean()
}

// "Start a run" follows the nodes as they connect, leave and begin to stop,
// and says when none is connected (its adapter list was empty, Start
// ended in the browser's "select an item", and a node that connected later
// showed only once the page was opened again). A key with the "runs" scope
// but not "read" may not list the nodes: it types node and adapter.
func TestConsoleStartFollowsNodes(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.setNodes()
	openFake(b, f, "start")
	noNode := `/No connected node/.test(document.getElementById('start-nodes')?.innerText || '')`
	disabled := `document.getElementById('start-submit').disabled`
	b.waitJS(10*time.Second, "the page says no node is connected", noNode+` && `+disabled)
	b.screenshot("start-no-node")

	f.setNodes(fakeNode("n1"))
	f.publishNode("node.registered", "n1")
	b.waitJS(5*time.Second, "n1 offered once it connects",
		`document.querySelector('#start-node option[value="n1"]') && document.querySelector('#start-adapter option[value="exec"]') && !`+disabled+` && !`+noNode)
	b.do(5*time.Second, "choose n1", chromedp.SetValue(chromedp.CSS(`#start-node`), "n1"))

	// n1 begins to stop: it takes no new run.
	draining := fakeNode("n1")
	draining["draining"] = true
	f.setNodes(draining)
	f.publishNode("node.draining", "n1")
	b.waitJS(5*time.Second, "no node once n1 drains", noNode+` && `+disabled+
		` && document.getElementById('start-node').selectedOptions[0].innerText === 'n1 (unavailable)'`)
	f.setNodes(fakeNode("n1"))
	f.publishNode("node.registered", "n1")
	b.waitJS(5*time.Second, "n1 back", `!`+noNode+` && document.getElementById('start-node').selectedOptions[0].innerText === 'n1'`)
	offline := fakeNode("n1")
	offline["connected"] = false
	f.setNodes(offline)
	f.publishNode("node.disconnected", "n1")
	b.waitJS(5*time.Second, "no node once n1 left", noNode+` && `+disabled)

	// A key without "read": GET /v1/nodes answers 403.
	f.setNodes(fakeNode("n1"))
	f.mu.Lock()
	f.keys = map[string]string{"runs-key": "runs-only"}
	f.runEvents = func(id string) []map[string]any {
		return []map[string]any{{"run_id": id, "node": "n1", "seq": 1, "type": "start"},
			{"run_id": id, "node": "n1", "seq": 2, "type": "delta", "text": "ok\n"},
			{"run_id": id, "node": "n1", "seq": 3, "type": "complete"}}
	}
	f.mu.Unlock()
	evalJS[bool](b, `sessionStorage.setItem('iop.console.key', 'runs-key'), true`)
	b.do(15*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#main [data-page]`)))
	b.waitJS(10*time.Second, "node and adapter typed",
		`document.querySelector('input#start-node') && document.querySelector('input#start-adapter') && document.getElementById('start-free-text') && !`+disabled)
	b.screenshot("start-free-text")
	b.do(5*time.Second, "fill the form",
		chromedp.SetValue(chromedp.CSS(`#start-node`), "n1"),
		chromedp.SetValue(chromedp.CSS(`#start-adapter`), "exec"),
		chromedp.SetValue(chromedp.CSS(`#start-target`), "t"))
	b.click(`#start-submit`)
	b.waitJS(10*time.Second, "the run streamed", `document.getElementById('start-status').innerText === 'succeeded' && document.getElementById('run-output').textContent === 'ok\n'`)
	f.mu.Lock()
	starts := slices.Clone(f.starts)
	f.mu.Unlock()
	if len(starts) != 1 || starts[0]["node"] != "n1" || starts[0]["adapter"] != "exec" || starts[0]["target"] != "t" {
		t.Errorf("runs started: %v, want one on n1's exec adapter, target t", starts)
	}
	b.checkClean()
}

// A link with a malformed escape shows "not found" (decodeURIComponent
// threw before the page's error handling, leaving it blank), on load and
// on a hash change alike.
func TestConsoleMalformedLink(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	notFound := `/not a valid percent-encoded name/.test(document.getElementById('not-found')?.innerText || '')`
	b.open(f.URL + "/ui/#/run/%E0%A4")
	b.waitJS(5*time.Second, "not found on load", notFound)
	b.screenshot("malformed-link")
	b.open(f.URL + "/ui/#/nodes")
	b.waitJS(5*time.Second, "the nodes page after it", `document.querySelector('[data-node="n1"]')`)
	b.open(f.URL + "/ui/#/run/%E0%A4")
	b.waitJS(5*time.Second, "not found on a hash change", notFound)
	b.checkClean()
}

// The key dialog, opened by the page without a click, closes on one Escape.
// The page then says a key is needed (in the header, with a button that
// opens the dialog again, and on the page) instead of waiting for good on
// a dialog that is gone and looking empty.
func TestConsoleKeyDialogDismissed(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.mu.Lock()
	f.keys = map[string]string{"good-key": "all"}
	f.mu.Unlock()
	b.open(f.URL + "/ui/#/nodes")
	b.waitJS(10*time.Second, "key dialog", `document.getElementById('key-dialog').open`)
	b.do(10*time.Second, "press Escape", chromedp.KeyEvent(kb.Escape))
	b.waitJS(5*time.Second, "dialog closed", `!document.getElementById('key-dialog').open`)
	b.waitJS(10*time.Second, "the header says a key is needed", `/API key needed/.test(document.getElementById('key-state').innerText) && document.getElementById('key-enter')`)
	b.waitJS(10*time.Second, "the page says a key is needed", `/API key/.test(document.querySelector('[data-page="nodes"] .error-box')?.innerText || '')`)
	b.waitJS(10*time.Second, "the feed says a key is needed", `/API key needed/.test(document.getElementById('bus-state').innerText)`)
	// Other pages say so too, and no dialog pops up by itself.
	b.open(f.URL + "/ui/#/runs")
	b.waitJS(10*time.Second, "runs page says a key is needed", `/API key/.test(document.querySelector('[data-page="runs"] .error-box')?.innerText || '')`)
	if evalJS[bool](b, `document.getElementById('key-dialog').open`) {
		t.Error("the dialog opened again by itself")
	}
	b.click(`#key-enter`)
	b.waitJS(5*time.Second, "dialog open again", `document.getElementById('key-dialog').open`)
	b.do(10*time.Second, "enter the key", chromedp.SetValue(chromedp.CSS(`#key-input`), "good-key"))
	b.click(`#key-submit`)
	b.waitJS(10*time.Second, "runs page drawn with the key", `!document.querySelector('[data-page="runs"] .error-box') && document.querySelector('#runs-history')`)
	b.waitJS(10*time.Second, "feed live", `document.getElementById('bus-state').classList.contains('live')`)
	if s := b.text(`#key-state`); !strings.Contains(s, "key set") {
		t.Errorf("header after the key: %q", s)
	}
	b.checkClean()
}

// A key pasted with characters an HTTP header cannot carry (smart quotes)
// is refused in the dialog, and one already kept in the tab is asked for
// again rather than failing every request with a TypeError.
func TestConsoleKeyNotASCII(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.mu.Lock()
	f.keys = map[string]string{"good-key": "all"}
	f.mu.Unlock()
	b.open(f.URL + "/ui/#/nodes")
	b.waitJS(10*time.Second, "key dialog", `document.getElementById('key-dialog').open`)
	b.do(10*time.Second, "enter a smart-quoted key", chromedp.SetValue(chromedp.CSS(`#key-input`), "“good-key”"))
	b.click(`#key-submit`)
	b.waitJS(5*time.Second, "the dialog says why", `document.getElementById('key-dialog').open && /quotes/.test(document.getElementById('key-error').innerText)`)
	if k := evalJS[string](b, `sessionStorage.getItem('iop.console.key') || ''`); k != "" {
		t.Errorf("the bad key was kept: %q", k)
	}
	b.do(10*time.Second, "enter the key", chromedp.SetValue(chromedp.CSS(`#key-input`), "good-key"))
	b.click(`#key-submit`)
	b.waitJS(10*time.Second, "nodes with the key", `!document.getElementById('key-dialog').open && document.querySelector('[data-node="n1"]')`)

	// A bad key already in the tab: asked for again.
	evalJS[bool](b, `sessionStorage.setItem('iop.console.key', '‘good-key’'), true`)
	b.do(15*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#main [data-page]`)))
	b.waitJS(10*time.Second, "asked again", `document.getElementById('key-dialog').open && /cannot be sent/.test(document.getElementById('key-reason').innerText)`)
	b.do(10*time.Second, "enter the key again", chromedp.SetValue(chromedp.CSS(`#key-input`), "good-key"))
	b.click(`#key-submit`)
	b.waitJS(10*time.Second, "nodes with the key again", `!document.getElementById('key-dialog').open && document.querySelector('[data-node="n1"]')`)
	b.checkClean()
}

// A 403 that is not the edge's scope refusal (a session another key owns)
// is shown as the edge said it; the form stays and Start a run is not
// taken for forbidden.
func TestConsoleStartForeignSession(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.runEvents = func(id string) []map[string]any {
		return []map[string]any{{"run_id": id, "node": "n1", "seq": 1, "type": "start"}, {"run_id": id, "node": "n1", "seq": 2, "type": "complete"}}
	}
	openFake(b, f, "start")
	b.waitJS(10*time.Second, "start form", `document.querySelector('#start-adapter option[value="exec"]')`)
	b.do(10*time.Second, "a foreign session", chromedp.SetValue(chromedp.CSS(`#start-session`), "foreign"))
	b.click(`#start-submit`)
	b.waitJS(10*time.Second, "the edge's refusal shown", `/forbidden: session "foreign" of adapter "exec" belongs to another API key/.test(document.querySelector('[data-page="start"] .error-box')?.innerText || '')`)
	if evalJS[bool](b, `document.getElementById('start-form').hidden || document.querySelector('#nav a[data-page="start"]').hidden || !!sessionStorage.getItem('iop.console.forbidden')?.includes('runs.start')`) {
		t.Fatal("a foreign session's 403 was taken for a key that may not start runs")
	}
	evalJS[bool](b, `document.getElementById('start-session').value = '', true`)
	b.click(`#start-submit`)
	b.waitJS(10*time.Second, "the run goes", `document.getElementById('start-status').innerText === 'succeeded'`)
	b.checkClean()
}

// A run longer than the page keeps: Start a run and the run's page keep the
// same bounds, keep the END of the output (where an answer ends) and say
// what they cut.
func TestConsoleOutputBounds(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	const n = 6000 // deltas of 256 characters: about 1.5 MiB, past the 1 MiB kept
	f.runEvents = func(id string) []map[string]any {
		evs := []map[string]any{{"run_id": id, "node": "n1", "seq": 1, "type": "start"}}
		for i := 1; i <= n; i++ {
			evs = append(evs, map[string]any{"run_id": id, "node": "n1", "seq": i + 1, "type": "delta", "text": fmt.Sprintf("line %05d %s\n", i, strings.Repeat("x", 244))})
		}
		return append(evs, map[string]any{"run_id": id, "node": "n1", "seq": n + 2, "type": "complete"})
	}
	openFake(b, f, "start")
	b.waitJS(10*time.Second, "start form", `document.querySelector('#start-adapter option[value="exec"]')`)
	b.click(`#start-submit`)
	b.waitJS(30*time.Second, "run complete", `document.getElementById('start-status').innerText === 'succeeded'`)
	check := func(where string) {
		t.Helper()
		b.waitJS(10*time.Second, where+": the end of the output", `document.getElementById('run-output').textContent.endsWith('line 06000 '+'x'.repeat(244)+'\n')`)
		out := evalJS[int](b, `document.getElementById('run-output').textContent.length`)
		if out > (1<<20)+(1<<18) {
			t.Errorf("%s: %d characters of output shown, want at most about 1 MiB", where, out)
		}
		if rows := evalJS[int](b, `document.querySelectorAll('.events-table tbody tr').length`); rows > 4000 {
			t.Errorf("%s: %d event rows, want at most 4000", where, rows)
		}
		msg := b.text(`#run-cut`)
		if !regexp.MustCompile(`^Output cut: showing the last [\d,]+ characters; [\d,]+ earlier ones not shown; [\d,]+ earlier events not shown`).MatchString(msg) {
			t.Errorf("%s: cut notice %q", where, msg)
		}
	}
	check("Start a run")
	b.click(`#start-run a`)
	b.waitJS(10*time.Second, "run page", `document.querySelector('[data-page="run"]')`)
	check("the run's page")
	b.checkClean()
}

// "In flight" lists every run the edge has running or queued, however far
// back it started and whatever the history's filter: a long run older than
// the history's first page was missed.
func TestConsoleInFlightOldRuns(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.setRun("old-long", "running")
	f.setRun("old-queued", "queued")
	for i := range 150 {
		f.setRun(fmt.Sprintf("done-%03d", i), "succeeded")
	}
	inFlight := func(id string) string { return fmt.Sprintf(`document.querySelector('#runs-live tr[data-run=%q]')`, id) }
	openFake(b, f, "runs")
	b.waitJS(10*time.Second, "history drawn", `document.querySelectorAll('#runs-history tbody tr').length === 100`)
	b.waitJS(10*time.Second, "the old runs in flight", inFlight("old-long")+" && "+inFlight("old-queued"))
	// The history's filter does not change what is in flight.
	b.open(f.URL + "/ui/#/runs?status=succeeded&limit=10")
	b.do(15*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#main [data-page]`)))
	b.waitJS(10*time.Second, "filtered history drawn", `document.querySelectorAll('#runs-history tbody tr').length === 10`)
	b.waitJS(10*time.Second, "the old runs still in flight", inFlight("old-long")+" && "+inFlight("old-queued"))
	// It ends: out of In flight when the bus says so.
	f.setRun("old-long", "succeeded")
	f.publish(map[string]any{"run_id": "old-long", "node": "n1", "seq": 9, "type": "complete"})
	b.waitJS(10*time.Second, "old-long out of In flight", "!"+inFlight("old-long"))
	b.checkClean()
}

// Heartbeat RTT shows for each connected node, not only the first 50.
func TestConsoleRTTEveryNode(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	var nodes []map[string]any
	for i := 1; i <= 70; i++ {
		nodes = append(nodes, fakeNode(fmt.Sprintf("n%02d", i)))
	}
	f.setNodes(nodes...)
	openFake(b, f, "nodes")
	b.waitJS(15*time.Second, "RTT on every node", `[...document.querySelectorAll('[data-node] [data-rtt]')].filter((dd) => dd.innerText === '1.5 ms').length === 70`)
	b.checkClean()
}

// The Events page shows the tab's one feed, filtered in the page: it opens
// no connection of its own (a browser keeps six per host over HTTP/1.1;
// three Events tabs held them all and any new tab hung).
func TestConsoleEventsPageSharesFeed(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	openFake(b, f, "events?type=node.*")
	f.publishNode("node.registered", "n7")
	f.publish(map[string]any{"run_id": "r1", "node": "n1", "seq": 1, "type": "start"})
	b.waitJS(10*time.Second, "the node event shown", `document.querySelector('#events tr[data-type="node.registered"]')`)
	time.Sleep(300 * time.Millisecond)
	if n := evalJS[int](b, `document.querySelectorAll('#events tr:not([data-type^="node."])').length`); n != 0 {
		t.Errorf("%d events of other types shown under a node.* filter", n)
	}
	// Another filter, applied in the page.
	b.do(10*time.Second, "filter run.event", chromedp.SetValue(chromedp.CSS(`#ev-types`), "run.event"))
	b.click(`form.panel button.primary`)
	f.publish(map[string]any{"run_id": "r2", "node": "n1", "seq": 1, "type": "start"})
	b.waitJS(10*time.Second, "the run event shown", `document.querySelector('#events tr[data-type="run.event"]')`)
	f.mu.Lock()
	feeds, tries := len(f.feeds), slices.Clone(f.eventsTries)
	f.mu.Unlock()
	if feeds != 1 || len(tries) != 1 {
		t.Errorf("%d feeds open, %d asked for (%v): want the tab's one", feeds, len(tries), tries)
	}
	b.checkClean()
}

// A reload that adds a node to the file (offline until it connects) shows
// on the Nodes page as soon as config.reloaded comes: no node.* event says
// so, and the page used to wait for its next poll.
func TestConsoleNodesFollowAReload(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	b.open(f.URL + "/ui/#/nodes")
	// The poll is lengthened past the test, then the page loaded again to
	// read it: only the feed can make the page look again.
	evalJS[bool](b, `sessionStorage.setItem('iop.console.nodesPollMs', '600000'), true`)
	b.do(15*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#main [data-page]`)))
	b.waitJS(10*time.Second, "bus connected", `document.getElementById('bus-state').classList.contains('live')`)
	b.waitJS(10*time.Second, "n1 listed", `!!document.querySelector('[data-node="n1"]')`)

	added := fakeNode("n2")
	added["connected"] = false
	f.setNodes(fakeNode("n1"), added)
	ev, _ := json.Marshal(map[string]any{"type": "config.reloaded", "time": time.Now().UTC().Format(time.RFC3339Nano)})
	f.send("event: config.reloaded\ndata: " + string(ev) + "\n\n")
	b.waitJS(10*time.Second, "n2 listed after the reload", `!!document.querySelector('[data-node="n2"].disconnected')`)
	evalJS[bool](b, `sessionStorage.removeItem('iop.console.nodesPollMs'), true`)
	b.checkClean()
}
