package e2e

// Browser tests of the web console (/ui/): a real headless Chromium, driven
// through the DevTools protocol by chromedp, against the real iop-edge and
// iop-node. They skip, saying so, when no Chromium is installed
// (apt-get install chromium). Screenshots of each step are written under the
// test's temp dir (kept with IOP_CONSOLE_SCREENSHOTS=DIR, which copies them
// there).

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromiumPath finds a Chromium to drive, or "" when none is installed.
func chromiumPath() string {
	if p := os.Getenv("IOP_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser is one headless Chromium tab plus what its page reported.
type browser struct {
	t    *testing.T
	ctx  context.Context
	shot string // screenshot directory

	mu       sync.Mutex
	problems []string // uncaught exceptions, console errors, CSP violations
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		if os.Getenv("IOP_REQUIRE_CHROMIUM") == "1" {
			t.Fatal("IOP_REQUIRE_CHROMIUM=1 but no Chromium found (apt-get install chromium, or set IOP_CHROMIUM)")
		}
		t.Skip("console browser tests skipped: no Chromium found (apt-get install chromium, or set IOP_CHROMIUM)")
	}
	var (
		ctx                    context.Context
		cancelTab, cancelAlloc context.CancelFunc
	)
	// On a loaded machine (two cores, the e2e suite in parallel) Chromium
	// now and then fails to start at all ("chrome failed to start"): that
	// is tried again, with a fresh profile, before the test is failed.
	for attempt := 1; ; attempt++ {
		opts := append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(path),
			chromedp.Headless,
			chromedp.NoSandbox,
			chromedp.DisableGPU,
			chromedp.UserDataDir(t.TempDir()),
			chromedp.WindowSize(1440, 960),
			chromedp.Flag("disable-quic", true),
			chromedp.Flag("disable-component-update", true),
			chromedp.Flag("no-proxy-server", true),
		)
		var actx context.Context
		actx, cancelAlloc = chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancelTab = chromedp.NewContext(actx)
		// The first Do starts the browser; it must not carry a timeout.
		err := chromedp.Do(ctx)
		if err == nil {
			break
		}
		cancelTab()
		cancelAlloc()
		if attempt == 3 {
			t.Fatalf("starting Chromium %s (%d tries): %v", path, attempt, err)
		}
		t.Logf("starting Chromium %s: %v; trying again", path, err)
	}
	b := &browser{t: t, ctx: ctx, shot: t.TempDir()}
	// Everything the page logs as an error is collected; the owner of the
	// goroutine is the tab's context, cancelled at cleanup.
	messages := chromedp.Console(ctx)
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for m, err := range messages {
			if err != nil {
				return
			}
			// A refused request (401 before the key is given, 403 for a
			// forbidden action, 400 answering the scope probes) is logged by
			// the browser; the page handles it.
			if m.Source == "network" && (strings.Contains(m.Text, "status of 401") || strings.Contains(m.Text, "status of 403") ||
				strings.Contains(m.Text, "status of 400") && (strings.HasSuffix(m.URL, "/v1/runs") || strings.HasSuffix(m.URL, "/v1/nodes/-/commands")) ||
				strings.Contains(m.Text, "status of 404") && strings.HasSuffix(m.URL, "/v1/runs/no-such-run") ||
				strings.Contains(m.Text, "status of 503") && strings.Contains(m.URL, "/v1/events")) {
				continue
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.problem(m.String() + " " + m.URL)
			}
		}
	}()
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
		<-collected
	})
	return b
}

func (b *browser) problem(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.problems = append(b.problems, s)
}

// checkClean fails the test if the page threw or logged an error (a CSP
// violation is logged as one).
func (b *browser) checkClean() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.problems) > 0 {
		b.t.Errorf("the page reported errors:\n%s", strings.Join(b.problems, "\n"))
	}
}

// do runs steps with a deadline.
func (b *browser) do(within time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, within)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.screenshot("failed-" + strings.ReplaceAll(what, " ", "-"))
		b.t.Fatalf("%s: %v", what, err)
	}
}

// evalJS evaluates a JS expression in the page.
func evalJS[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitJS polls a JS expression until it is true.
func (b *browser) waitJS(within time.Duration, what, expr string) {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.screenshot("timeout-" + strings.ReplaceAll(what, " ", "-"))
			body, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.getElementById('main').innerText`))
			b.t.Fatalf("waiting for %s (%s): not true within %v (err %v); page text:\n%s", what, expr, within, err, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	return evalJS[string](b, fmt.Sprintf(`(document.querySelector(%q) || {}).innerText || ''`, sel))
}

// screenshot writes a PNG of the page under the test's temp dir (and
// IOP_CONSOLE_SCREENSHOTS when set).
func (b *browser) screenshot(name string) {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	for _, dir := range []string{b.shot, os.Getenv("IOP_CONSOLE_SCREENSHOTS")} {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name+".png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			b.t.Errorf("screenshot %s: %v", name, err)
			continue
		}
		b.t.Logf("screenshot: %s", p)
	}
}

func (b *browser) open(url string) {
	b.t.Helper()
	b.do(15*time.Second, "open "+url, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`#main [data-page]`)))
}

func (b *browser) click(sel string) {
	b.t.Helper()
	b.do(10*time.Second, "click "+sel, chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible))
}

// consoleNodes has a slow target for streaming and a long one for cancel,
// and n3, a node of the config that no test starts.
func consoleNodes() string {
	return fmt.Sprintf(`
  - id: n1
    token: %s
    adapters:
      - name: exec
        type: exec
        max_concurrency: 4
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
          ticks: {command: ["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do echo tick$i; sleep 0.25; done"]}
          fail: {command: ["sh", "-c", "echo partial; exit 3"]}
          sleep: {command: ["sh", "-c", "echo started; exec sleep 300"]}
  - id: n2
    token: e2e-token-0002
    adapters:
      - name: shell
        type: exec
        max_concurrency: 2
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
  - id: n3
    token: e2e-token-0003
    adapters:
      - name: gpu
        type: exec
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
`, testToken)
}

func TestConsole(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	e := startEdge(t, consoleNodes())
	startNode(t, e, testToken)
	n2 := startNode(t, e, "e2e-token-0002")
	waitNode(t, e, "n1")
	waitNode(t, e, "n2")

	t.Run("assets", func(t *testing.T) {
		resp, err := http.Get(e.url + "/ui/app.js")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), "javascript") ||
			!strings.Contains(resp.Header.Get("Content-Security-Policy"), "connect-src 'self'") {
			t.Fatalf("GET /ui/app.js: %d %q csp %q", resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Content-Security-Policy"))
		}
		noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err = noRedirect.Get(e.url + "/ui")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/ui/" {
			t.Fatalf("GET /ui: %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
		}
	})

	// The nodes page lists both nodes with their adapters and heartbeat RTT,
	// and greys a node out, live, when it disconnects.
	b.open(e.url + "/ui/#/nodes")
	b.waitJS(15*time.Second, "node n1 listed with its adapter and RTT",
		`document.querySelector('[data-node="n1"] [data-slots="exec"]') && /ms$/.test(document.querySelector('[data-node="n1"] [data-rtt]').innerText)`)
	b.waitJS(10*time.Second, "node n2 listed", `document.querySelector('[data-node="n2"]:not(.disconnected) [data-slots="shell"]')`)
	// n3 is in the config but never connected: greyed from the first load,
	// with its configured adapter.
	b.waitJS(5*time.Second, "n3 greyed from the first load", `document.querySelector('[data-node="n3"].disconnected [data-slots="gpu"]')`)
	if s := b.text(`[data-node="n3"] [data-disconnected]`); s != "not connected since the edge started" {
		t.Errorf("n3 disconnected: %q", s)
	}
	b.waitJS(10*time.Second, "bus connected", `document.getElementById('bus-state').classList.contains('live')`)
	if s := b.text(`[data-node="n1"] [data-slots="exec"]`); s != "0 / 4 slots" {
		t.Errorf("n1 exec slots: %q", s)
	}
	b.screenshot("nodes")
	n2.stop(syscall.SIGTERM, 5*time.Second)
	b.waitJS(10*time.Second, "n2 greyed out after it disconnected", `document.querySelector('[data-node="n2"].disconnected')`)
	b.waitJS(5*time.Second, "n1 still connected", `document.querySelector('[data-node="n1"]:not(.disconnected)')`)
	// A fresh page knows n2 left, when and why, from the edge alone.
	b.open(e.url + "/ui/#/nodes")
	b.waitJS(10*time.Second, "n2 greyed on a fresh load with when and why it left",
		`document.querySelector('[data-node="n2"].disconnected [data-disconnected]') && /ago\): \S/.test(document.querySelector('[data-node="n2"] [data-disconnected]').innerText)`)
	t.Logf("n2 on a fresh load: disconnected %s", b.text(`[data-node="n2"] [data-disconnected]`))
	b.waitJS(5*time.Second, "n1 connected and n3 greyed on a fresh load",
		`document.querySelector('[data-node="n1"]:not(.disconnected)') && document.querySelector('[data-node="n3"].disconnected')`)
	b.screenshot("nodes-offline")

	// iop nodes tells the same story.
	out, errOut, code := cli(t, e, "", "nodes")
	if code != 0 || !regexp.MustCompile(`(?m)^n1\s+online\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^n2\s+offline\s+-\s+left .*ago\s+shell\(0/2\)`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^n3\s+offline\s+-\s+-\s+gpu\(0/4\)`).MatchString(out) {
		t.Errorf("iop nodes: exit %d\n%s%s", code, out, errOut)
	}

	// Starting a run from the page streams its output: the first lines show
	// while the run is still going, then it completes.
	b.open(e.url + "/ui/#/start")
	b.waitJS(10*time.Second, "adapter choices", `document.querySelector('#start-adapter option[value="exec"]')`)
	b.do(10*time.Second, "fill the run form",
		chromedp.SetValue(chromedp.CSS(`#start-node`), "n1"),
		chromedp.SetValue(chromedp.CSS(`#start-target`), "ticks"))
	b.click(`#start-submit`)
	b.waitJS(10*time.Second, "first output while streaming",
		`document.getElementById('run-output').innerText.includes('tick1') && document.getElementById('start-status').innerText === 'streaming'`)
	partial := evalJS[string](b, `document.getElementById('run-output').innerText`)
	if strings.Contains(partial, "tick8") {
		t.Fatalf("output arrived all at once, not streamed: %q", partial)
	}
	b.screenshot("start-streaming")
	b.waitJS(10*time.Second, "run complete", `document.getElementById('start-status').innerText === 'succeeded'`)
	if out := b.text(`#run-output`); !strings.Contains(out, "tick1\ntick2") || !strings.Contains(out, "tick8") {
		t.Errorf("final output: %q", out)
	}
	b.waitJS(5*time.Second, "events table with the terminal event", `[...document.querySelectorAll('.events-table td')].some(td => td.innerText === 'complete')`)
	b.screenshot("start-done")

	// Moving to the run's own page while it streams does not cancel it:
	// the run page goes on showing its output until it completes.
	b.click(`#start-submit`)
	b.waitJS(10*time.Second, "second run streaming", `document.getElementById('run-output').innerText.includes('tick1') && document.querySelector('#start-run a')`)
	b.click(`#start-run a`)
	b.waitJS(15*time.Second, "run page shows the rest of the output and success",
		`document.querySelector('[data-page="run"]') && document.getElementById('run-output').innerText.includes('tick8') && document.getElementById('run-status').innerText === 'succeeded'`)

	// A run that fails shows its error.
	b.open(e.url + "/ui/#/start")
	b.waitJS(10*time.Second, "adapter choices again", `document.querySelector('#start-adapter option[value="exec"]')`)
	b.do(10*time.Second, "fill fail", chromedp.SetValue(chromedp.CSS(`#start-target`), "fail"))
	b.click(`#start-submit`)
	b.waitJS(10*time.Second, "failed run", `document.getElementById('start-status').innerText === 'failed' && document.getElementById('run-error').innerText.length > 0`)
	failedID := evalJS[string](b, `document.querySelector('#start-run a').innerText`)

	// Cancel on a long run's page ends it as cancelled.
	resp, body := postJSON(t, e.url+"/v1/runs", map[string]any{"node": "n1", "adapter": "exec", "target": "sleep", "background": true})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("background run: %d %s", resp.StatusCode, body)
	}
	var bg struct {
		RunID string `json:"run_id"`
	}
	if err := json.Unmarshal(body, &bg); err != nil || bg.RunID == "" {
		t.Fatalf("background run answer %s: %v", body, err)
	}
	// The runs page shows it in flight although it started before the page
	// opened.
	b.open(e.url + "/ui/#/runs")
	b.waitJS(10*time.Second, "background run in flight", fmt.Sprintf(`document.querySelector('#runs-live tr[data-run=%q]')`, bg.RunID))
	b.open(e.url + "/ui/#/run/" + bg.RunID)
	b.waitJS(10*time.Second, "run page with Cancel", `document.querySelector('#cancel:not([hidden])') && document.getElementById('run-status').innerText === 'running'`)
	b.screenshot("run-running")
	b.click(`#cancel`)
	b.waitJS(15*time.Second, "run shown cancelled", `document.getElementById('run-status').innerText === 'cancelled' && !document.querySelector('#cancel')`)
	// The edge's store records the end a moment after the terminal event
	// the page showed.
	waitFor(t, "run record cancelled after Cancel", func() error {
		var rec struct {
			Status string `json:"status"`
		}
		if err := getJSON(e.url+"/v1/runs/"+bg.RunID, &rec); err != nil || rec.Status != "cancelled" {
			return fmt.Errorf("run record after Cancel: %+v %v", rec, err)
		}
		return nil
	})
	b.screenshot("run-cancelled")

	// The runs page lists the history and filters it.
	b.open(e.url + "/ui/#/runs")
	b.waitJS(10*time.Second, "nothing in flight after the cancel", `!document.querySelector('#runs-live tr[data-run]')`)
	// Opening a run's page does not put the run in flight: neither a
	// finished run this tab never saw run (after a reload) nor an unknown id,
	// which has no Cancel either.
	b.do(15*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#main [data-page]`)))
	b.open(e.url + "/ui/#/run/" + failedID)
	b.waitJS(10*time.Second, "finished run's page", `document.getElementById('run-status').innerText === 'failed' && !document.querySelector('#cancel')`)
	b.open(e.url + "/ui/#/run/no-such-run")
	b.waitJS(10*time.Second, "unknown run's page", `/run_not_found/.test(document.querySelector('[data-page="run"] .error-box')?.innerText || '')`)
	if s, cancel := b.text(`#run-status`), evalJS[bool](b, `!!document.querySelector('#cancel')`); s != "unknown" || cancel {
		t.Errorf("unknown run's page: status %q, Cancel shown %v", s, cancel)
	}
	b.open(e.url + "/ui/#/runs")
	b.waitJS(10*time.Second, "history loaded", `document.querySelector('#runs-history tbody tr')`)
	if n := evalJS[int](b, `document.querySelectorAll('#runs-live tr[data-run]').length`); n != 0 {
		t.Errorf("%d runs in flight after opening run pages, want 0: %s", n, b.text(`#runs-live`))
	}
	b.open(e.url + "/ui/#/runs?status=cancelled")
	b.waitJS(10*time.Second, "cancelled run in the filtered history",
		fmt.Sprintf(`document.querySelector('#runs-history tr[data-run=%q]') && document.querySelectorAll('#runs-history tbody tr').length === 1`, bg.RunID))
	// A link with a node filter applies it on the first load, before the
	// node choices arrive: n2 ran nothing.
	b.open(e.url + "/ui/#/runs?node=n2")
	b.waitJS(10*time.Second, "node-filtered history", `document.querySelector('#runs-history table, #runs-history p')`)
	if s, v := b.text(`#runs-history`), evalJS[string](b, `document.getElementById('f-node').value`); s != "No runs match." || v != "n2" {
		t.Errorf("#/runs?node=n2: node %q, history %q", v, s)
	}
	b.open(e.url + "/ui/#/runs")
	b.waitJS(10*time.Second, "whole history", `document.querySelectorAll('#runs-history tbody tr').length >= 3`)
	// The history pages: Older appends the next page under the first.
	b.open(e.url + "/ui/#/runs?limit=2")
	b.waitJS(10*time.Second, "first page of 2", `document.querySelectorAll('#runs-history tbody tr').length === 2 && document.querySelector('#runs-older:not([hidden])')`)
	first := evalJS[string](b, `[...document.querySelectorAll('#runs-history tbody tr')].map(tr => tr.dataset.run).join(' ')`)
	b.click(`#runs-older`)
	b.waitJS(10*time.Second, "second page appended", `document.querySelectorAll('#runs-history tbody tr').length === 4`)
	if all := evalJS[string](b, `[...document.querySelectorAll('#runs-history tbody tr')].map(tr => tr.dataset.run).join(' ')`); !strings.HasPrefix(all, first+" ") {
		t.Errorf("after Older: %q, want it to start with the first page %q", all, first)
	}
	// A run starting and ending elsewhere does not put page one back alone
	// over the pages Older added (the bus reloads the history 400 ms after).
	collectRun(t, startRun(t, context.Background(), e, map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "x"}))
	time.Sleep(1500 * time.Millisecond)
	if n := evalJS[int](b, `document.querySelectorAll('#runs-history tbody tr').length`); n != 4 {
		t.Errorf("%d history rows after another run, want the 4 Older showed", n)
	}
	b.screenshot("runs")

	// The usage chart renders bars for the runs so far, grouped by node.
	b.open(e.url + "/ui/#/usage")
	b.waitJS(10*time.Second, "usage chart bars", `document.querySelectorAll('#usage-chart svg rect.bar[data-group="n1"]').length >= 1`)
	runsInChart := evalJS[int](b, `[...document.querySelectorAll('#usage-totals tbody tr')].filter(tr => tr.cells[0].innerText === 'n1').map(tr => +tr.cells[1].innerText)[0] || 0`)
	if runsInChart < 3 {
		t.Errorf("usage totals show %d runs for n1, want >= 3", runsInChart)
	}
	// The chart follows next_cursor: with a page size of 2 it still counts
	// every run; past 20 pages it says it shows only the newest runs.
	b.open(e.url + "/ui/#/usage?limit=2")
	b.waitJS(10*time.Second, "usage over pages of 2", fmt.Sprintf(`[...document.querySelectorAll('#usage-totals tbody tr')].some(tr => tr.cells[0].innerText === 'n1' && +tr.cells[1].innerText === %d)`, runsInChart))
	if evalJS[bool](b, `!!document.getElementById('usage-capped')`) {
		t.Errorf("usage over %d runs in pages of 2 says it is capped", runsInChart)
	}
	for i := runsInChart; i <= 20; i++ {
		collectRun(t, startRun(t, context.Background(), e, map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "x"}))
	}
	// The history is written in batches (every 200 ms): the page must find
	// more than 20 runs there when it loads.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var hist struct {
			Runs []json.RawMessage `json:"runs"`
		}
		if err := getJSON(e.url+"/v1/runs?limit=1000", &hist); err != nil {
			t.Fatal(err)
		}
		if len(hist.Runs) > 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the history holds %d runs, want more than 20", len(hist.Runs))
		}
	}
	b.open(e.url + "/ui/#/usage?limit=1")
	b.waitJS(15*time.Second, "usage capped at 20 pages of 1", `/newest 20 runs/.test(document.getElementById('usage-capped')?.innerText || '')`)
	if n := evalJS[int](b, `[...document.querySelectorAll('#usage-totals tbody tr')].reduce((s, tr) => s + +tr.cells[1].innerText, 0)`); n != 20 {
		t.Errorf("capped usage totals count %d runs, want 20", n)
	}
	// An edge that keeps a history also answers GET /v1/usage?group_by=
	// with totals, which the page charts too.
	var usage struct {
		Usage []json.RawMessage `json:"usage"`
	}
	if err := getJSON(e.url+"/v1/usage?group_by=node", &usage); err != nil {
		t.Fatal(err)
	}
	if usage.Usage != nil {
		b.waitJS(10*time.Second, "usage totals chart from GET /v1/usage", `document.querySelector('#usage-api:not([hidden]) svg rect.bar[data-group="n1"]')`)
	} else {
		t.Log("this edge's GET /v1/usage has no history totals; only the runs chart is checked")
	}
	b.screenshot("usage")

	// The events page shows the live bus, filtered by type.
	b.open(e.url + "/ui/#/events?type=run.event")
	time.Sleep(300 * time.Millisecond) // let the feed connect before the run
	collectRun(t, startRun(t, context.Background(), e, map[string]any{"node": "n1", "adapter": "exec", "target": "upper", "input": "hi"}))
	b.waitJS(10*time.Second, "run events on the events page", `document.querySelector('#events tr[data-type="run.event"]')`)
	other := evalJS[int](b, `document.querySelectorAll('#events tr:not([data-type="run.event"])').length`)
	if other != 0 {
		t.Errorf("%d events of other types shown under a run.event filter", other)
	}
	b.screenshot("events")
	b.checkClean()
}

// getWithKey GETs url with a Bearer key and decodes the JSON answer.
func getWithKey(url, key string, v any) (int, error) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return resp.StatusCode, nil
	}
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
}

func TestConsoleAPIKeys(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	const adminKey, readKey = "console-admin-key-0001", "console-read-key-00001"
	e := startEdgeHTTP(t, fmt.Sprintf(`  api_keys:
    - {name: ops, key_sha256: %s, scopes: [read, runs, admin]}
    - {name: viewer, key_sha256: %s, scopes: [read]}
`, keyHash(adminKey), keyHash(readKey)), consoleNodes())
	startNode(t, e, testToken)
	waitNodeKey(t, e, "n1", adminKey)

	// The static page loads without a key; the API behind it asks for one.
	b.open(e.url + "/ui/#/nodes")
	b.waitJS(10*time.Second, "key dialog", `document.getElementById('key-dialog').open`)
	b.screenshot("key-prompt")
	b.do(10*time.Second, "enter a wrong key", chromedp.SetValue(chromedp.CSS(`#key-input`), "not-a-key-of-this-edge"))
	b.click(`#key-submit`)
	b.waitJS(10*time.Second, "key refused, asked again",
		`document.getElementById('key-dialog').open && document.getElementById('key-reason').innerText.includes('refused')`)

	// A read key sees the nodes but is not offered starting or cancelling runs.
	b.do(10*time.Second, "enter the read key", chromedp.SetValue(chromedp.CSS(`#key-input`), readKey))
	b.click(`#key-submit`)
	b.waitJS(10*time.Second, "nodes listed with the read key", `!document.getElementById('key-dialog').open && document.querySelector('[data-node="n1"]')`)
	b.waitJS(5*time.Second, "Start a run hidden", `document.querySelector('#nav a[data-page="start"]').hidden`)
	if rtt := b.text(`[data-node="n1"] [data-rtt]`); rtt != "—" {
		t.Errorf("a read key cannot run node commands, yet RTT shows %q", rtt)
	}
	b.open(e.url + "/ui/#/start")
	b.waitJS(5*time.Second, "start page refuses", `document.getElementById('start-forbidden') && !document.getElementById('start-submit')`)
	b.screenshot("read-key-start")

	// A running run's page offers no Cancel to the read key.
	req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/runs", strings.NewReader(`{"node":"n1","adapter":"exec","target":"sleep","background":true}`))
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var bg struct {
		RunID string `json:"run_id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&bg)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || err != nil {
		t.Fatalf("background run with the admin key: %d %v", resp.StatusCode, err)
	}
	b.open(e.url + "/ui/#/run/" + bg.RunID)
	b.waitJS(10*time.Second, "run page", `document.getElementById('run-status').innerText === 'running'`)
	if evalJS[bool](b, `!!document.querySelector('#cancel:not([hidden])')`) {
		t.Error("a read key is offered Cancel")
	}
	// The key stayed in the tab: no second prompt after navigating.
	if evalJS[bool](b, `document.getElementById('key-dialog').open`) {
		t.Error("asked for the key again")
	}

	// Forgetting the key and giving the admin key offers both again.
	b.click(`#key-state button`)
	b.waitJS(10*time.Second, "key dialog after forget", `document.getElementById('key-dialog').open`)
	b.do(10*time.Second, "enter the admin key", chromedp.SetValue(chromedp.CSS(`#key-input`), adminKey))
	b.click(`#key-submit`)
	b.waitJS(10*time.Second, "Cancel offered to the admin key", `document.querySelector('#cancel:not([hidden])') && !document.querySelector('#nav a[data-page="start"]').hidden`)
	b.click(`#cancel`)
	b.waitJS(15*time.Second, "cancelled with the admin key", `document.getElementById('run-status').innerText === 'cancelled'`)
	// The edge's store records the end a moment after the terminal event
	// the page showed.
	waitFor(t, "run record cancelled after Cancel", func() error {
		var rec struct {
			Status string `json:"status"`
		}
		if code, err := getWithKey(e.url+"/v1/runs/"+bg.RunID, readKey, &rec); code != 200 || err != nil || rec.Status != "cancelled" {
			return fmt.Errorf("%d %v %+v", code, err, rec)
		}
		return nil
	})
	b.checkClean()
}
