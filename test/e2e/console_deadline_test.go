package e2e

// Browser tests of the console's requests against an edge that answers too
// late: a refusal of a key the tab no longer uses, and an answer that never
// comes. They run against fakeConsoleEdge (console_feed_test.go) and skip
// without Chromium, as console_test.go does.

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// A request sent with the old key whose 401 comes after the user entered a
// new key (the old one revoked meanwhile) is sent again with the new key:
// it neither drops the new key nor asks for a key again.
func TestConsoleStaleRefusalKeepsNewKey(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.mu.Lock()
	f.keys = map[string]string{"old-key": "all", "new-key": "all"}
	f.mu.Unlock()
	f.setRun("run_slow", "running")
	held, release := make(chan struct{}, 1), make(chan struct{})
	intercept(f, func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/v1/runs/run_slow" || r.Header.Get("Authorization") != "Bearer old-key" {
			return false
		}
		select {
		case held <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return false // the edge's answer, once released: 401, the key revoked
	})

	b.open(f.URL + "/ui/#/nodes")
	b.waitJS(10*time.Second, "key dialog", `document.getElementById('key-dialog').open`)
	b.do(10*time.Second, "enter the old key", chromedp.SetValue(chromedp.CSS(`#key-input`), "old-key"))
	b.click(`#key-submit`)
	b.waitJS(10*time.Second, "bus live with the old key", `!document.getElementById('key-dialog').open && document.getElementById('bus-state').classList.contains('live')`)

	// The run's record is asked with the old key and held.
	evalJS[string](b, `location.hash = '#/run/run_slow'`)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the run's record was never asked with the old key")
	}
	// The old key is revoked; the feed, made again, meets the 401 and the
	// page asks for a key.
	f.mu.Lock()
	f.revoked["old-key"] = true
	f.mu.Unlock()
	f.closeFeeds()
	b.waitJS(15*time.Second, "key dialog after the revocation", `document.getElementById('key-dialog').open`)
	b.do(10*time.Second, "enter the new key", chromedp.SetValue(chromedp.CSS(`#key-input`), "new-key"))
	b.click(`#key-submit`)
	b.waitJS(10*time.Second, "bus live with the new key", `!document.getElementById('key-dialog').open && document.getElementById('bus-state').classList.contains('live')`)

	// Now the old key's request is answered: 401.
	close(release)
	b.waitJS(10*time.Second, "the record shown, or the key asked again",
		`document.getElementById('run-record').innerText.includes('n1') || document.getElementById('key-dialog').open`)
	if evalJS[bool](b, `document.getElementById('key-dialog').open`) {
		t.Errorf("a 401 for the old key asked for a key again after the new one was entered: %q", b.text(`#key-reason`))
	}
	if k := evalJS[string](b, `sessionStorage.getItem('iop.console.key') || ''`); k != "new-key" {
		t.Errorf("key kept in the tab = %q, want the new key", k)
	}
	b.checkCleanBut(401)
}

// A request the edge never answers ends at the console's deadline with a
// message saying so, where the page waited without end; the live feed, a
// stream, stays open past it.
func TestConsoleRequestDeadline(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	var hang atomic.Bool
	var abandoned atomic.Int32
	intercept(f, func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/v1/nodes" || !hang.Load() {
			return false
		}
		select {
		case <-r.Context().Done():
			abandoned.Add(1)
		case <-f.done:
		}
		return true
	})
	openFake(b, f, "nodes")
	b.waitJS(10*time.Second, "nodes listed", `document.querySelector('[data-node="n1"]')`)
	evalJS[bool](b, `sessionStorage.setItem('iop.console.requestTimeoutMs', '1500'), true`)
	defer evalJS[bool](b, `sessionStorage.removeItem('iop.console.requestTimeoutMs'), true`)
	hang.Store(true)
	b.do(15*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#main [data-page]`)))
	b.waitJS(10*time.Second, "bus connected", `document.getElementById('bus-state').classList.contains('live')`)
	feeds := len(f.busConnections())

	b.waitJS(10*time.Second, "the hung request's error shown", errorShown("timeout"))
	if msg := b.text(`#main .error-box`); msg != "timeout: the edge did not answer GET /v1/nodes within 2 s" {
		t.Errorf("error shown = %q", msg)
	}
	waitFor(t, "the hung request closed", func() error {
		if abandoned.Load() == 0 {
			return fmt.Errorf("still open")
		}
		return nil
	})
	// The feed is a stream: well past the deadline it is the same
	// connection, still live.
	time.Sleep(2 * time.Second)
	if n := len(f.busConnections()); n != feeds {
		t.Errorf("the live feed was made again (%d connections, then %d): the deadline cut it", feeds, n)
	}
	if !evalJS[bool](b, `document.getElementById('bus-state').classList.contains('live')`) {
		t.Errorf("bus state %q past the deadline", b.text(`#bus-state`))
	}
	b.checkClean()
}

// Cancel on a run that ended while the page did not hear of it (the live
// feed away: an edge restarting) meets the edge's run_finished; the page
// then reads the run's end from its record, where it went on showing the
// run running, and offering Cancel, until the feed came back.
func TestConsoleCancelEndedRun(t *testing.T) {
	b := newBrowser(t)
	f := newFakeConsoleEdge(t)
	f.setRun("run_done", "running")
	intercept(f, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/runs/run_done/cancel" {
			return false
		}
		writeFakeJSON(w, http.StatusConflict, map[string]any{"error": map[string]string{"code": "run_finished", "message": "run run_done has already finished"}})
		return true
	})
	openFake(b, f, "run/run_done")
	b.waitJS(10*time.Second, "run shown running with Cancel", `document.getElementById('run-status').innerText === 'running' && document.querySelector('#cancel:not([hidden])')`)

	// The edge goes away and comes back refusing feeds; the run ends
	// meanwhile, its terminal event lost with the feed.
	f.mu.Lock()
	f.eventsStatus = http.StatusServiceUnavailable
	f.mu.Unlock()
	f.closeFeeds()
	b.waitJS(10*time.Second, "feed down", `!document.getElementById('bus-state').classList.contains('live')`)
	f.setRun("run_done", "succeeded")

	b.click(`#cancel`)
	b.waitJS(10*time.Second, "the edge's run_finished shown", errorShown("run_finished"))
	b.waitJS(5*time.Second, "the run's end read from its record", `document.getElementById('run-status').innerText === 'succeeded'`)
	if evalJS[bool](b, `!!document.querySelector('#cancel:not([hidden])')`) {
		t.Error("Cancel still offered on a run the page shows ended")
	}
	b.checkCleanBut(http.StatusConflict)
}
