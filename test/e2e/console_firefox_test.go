package e2e

// The console in Firefox: the main flows driven over WebDriver BiDi (the
// protocol Firefox speaks natively with --remote-debugging-port), with a
// minimal client below. It skips, saying so, when Firefox is not installed
// (apt-get install firefox-esr).

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"iop/internal/lockedbuf"
)

// bidi is one WebDriver BiDi session on one browsing context. Calls are
// made from the test goroutine only, one at a time.
type bidi struct {
	t    *testing.T
	conn *websocket.Conn
	ctx  context.Context
	id   int
	bc   string
	logs []string // page log entries of level error
}

func (b *bidi) call(method string, params any) (json.RawMessage, error) {
	b.id++
	msg, _ := json.Marshal(map[string]any{"id": b.id, "method": method, "params": params})
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	if err := b.conn.Write(ctx, websocket.MessageText, msg); err != nil {
		return nil, err
	}
	for {
		_, data, err := b.conn.Read(ctx)
		if err != nil {
			return nil, err
		}
		var m struct {
			ID      int             `json:"id"`
			Result  json.RawMessage `json:"result"`
			Error   string          `json:"error"`
			Message string          `json:"message"`
			Method  string          `json:"method"`
			Params  struct {
				Level string `json:"level"`
				Text  string `json:"text"`
			} `json:"params"`
		}
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, err
		}
		if m.Method == "log.entryAdded" && m.Params.Level == "error" {
			b.logs = append(b.logs, m.Params.Text)
			continue
		}
		if m.ID == b.id {
			if m.Error != "" {
				return nil, fmt.Errorf("%s: %s: %s", method, m.Error, m.Message)
			}
			return m.Result, nil
		}
	}
}

func (b *bidi) eval(expr string) (any, error) {
	r, err := b.call("script.evaluate", map[string]any{"expression": expr, "target": map[string]any{"context": b.bc}, "awaitPromise": true})
	if err != nil {
		return nil, err
	}
	var v struct {
		Type   string `json:"type"`
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		ExceptionDetails struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	if err := json.Unmarshal(r, &v); err != nil {
		return nil, err
	}
	if v.Type == "exception" {
		return nil, fmt.Errorf("%s: %s", expr, v.ExceptionDetails.Text)
	}
	return v.Result.Value, nil
}

func (b *bidi) waitJS(within time.Duration, what, expr string) {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		v, err := b.eval("!!(" + expr + ")")
		if err == nil && v == true {
			return
		}
		if time.Now().After(deadline) {
			b.screenshot("firefox-timeout")
			text, _ := b.eval(`document.getElementById('bus-state').innerText + ' / ' + document.getElementById('main').innerText`)
			b.t.Fatalf("Firefox: waiting for %s: not true within %v (err %v); page text:\n%v", what, within, err, text)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *bidi) do(expr string) {
	b.t.Helper()
	if _, err := b.eval(expr); err != nil {
		b.t.Fatalf("Firefox: %v", err)
	}
}

func (b *bidi) open(url string) {
	b.t.Helper()
	if _, err := b.call("browsingContext.navigate", map[string]any{"context": b.bc, "url": url, "wait": "complete"}); err != nil {
		b.t.Fatalf("Firefox: open %s: %v", url, err)
	}
}

func (b *bidi) screenshot(name string) {
	r, err := b.call("browsingContext.captureScreenshot", map[string]any{"context": b.bc})
	if err != nil {
		b.t.Logf("Firefox screenshot: %v", err)
		return
	}
	var v struct {
		Data string `json:"data"`
	}
	_ = json.Unmarshal(r, &v)
	png, err := base64.StdEncoding.DecodeString(v.Data)
	if err != nil {
		return
	}
	p := filepath.Join(b.t.TempDir(), name+".png")
	if os.WriteFile(p, png, 0o644) == nil {
		b.t.Logf("screenshot: %s", p)
	}
}

func newFirefox(t *testing.T) *bidi {
	t.Helper()
	var path string
	for _, name := range []string{"firefox-esr", "firefox"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skip("console Firefox test skipped: no Firefox found (apt-get install firefox-esr)")
	}
	_, port, _ := net.SplitHostPort(freeAddr(t))
	cmd := exec.Command(path, "--headless", "--no-remote", "--profile", t.TempDir(), "--remote-debugging-port", port,
		"--width", "1440", "--height", "960")
	cmd.Env = append(os.Environ(), "MOZ_CRASHREPORTER_DISABLE=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &lockedbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start Firefox: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	b := &bidi{t: t, ctx: ctx}
	deadline := time.Now().Add(30 * time.Second)
	for {
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
		c, _, err := websocket.Dial(dctx, "ws://127.0.0.1:"+port+"/session", nil)
		dcancel()
		if err == nil {
			b.conn = c
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Firefox's WebDriver BiDi never answered on port %s: %v\n%s", port, err, out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.conn.SetReadLimit(32 << 20)
	t.Cleanup(func() { _ = b.conn.CloseNow() })
	if _, err := b.call("session.new", map[string]any{"capabilities": map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.call("session.subscribe", map[string]any{"events": []string{"log.entryAdded"}}); err != nil {
		t.Fatal(err)
	}
	r, err := b.call("browsingContext.getTree", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	var tree struct {
		Contexts []struct {
			Context string `json:"context"`
		} `json:"contexts"`
	}
	if err := json.Unmarshal(r, &tree); err != nil || len(tree.Contexts) == 0 {
		t.Fatalf("Firefox browsing contexts %s: %v", r, err)
	}
	b.bc = tree.Contexts[0].Context
	return b
}

func TestConsoleFirefox(t *testing.T) {
	t.Parallel()
	ff := newFirefox(t)
	e := startEdge(t, consoleNodes())
	startNode(t, e, testToken)
	waitNode(t, e, "n1")

	ff.open(e.url + "/ui/#/nodes")
	ff.waitJS(15*time.Second, "n1 listed with RTT", `document.querySelector('[data-node="n1"] [data-slots="exec"]') && /ms$/.test(document.querySelector('[data-node="n1"] [data-rtt]').innerText)`)
	ff.waitJS(10*time.Second, "bus connected", `document.getElementById('bus-state').classList.contains('live')`)

	ff.open(e.url + "/ui/#/start")
	ff.waitJS(10*time.Second, "adapter choices", `document.querySelector('#start-adapter option[value="exec"]')`)
	ff.do(`document.getElementById('start-target').value = 'ticks'; document.getElementById('start-submit').click()`)
	ff.waitJS(10*time.Second, "first output while streaming",
		`document.getElementById('run-output').innerText.includes('tick1') && document.getElementById('start-status').innerText === 'streaming'`)
	ff.waitJS(10*time.Second, "run complete", `document.getElementById('start-status').innerText === 'succeeded' && document.getElementById('run-output').innerText.includes('tick8')`)
	ff.screenshot("firefox-start")

	ff.do(`document.getElementById('start-target').value = 'sleep'; document.getElementById('start-submit').click()`)
	ff.waitJS(10*time.Second, "long run started", `document.getElementById('run-output').innerText.includes('started') && document.querySelector('#cancel:not([hidden])')`)
	ff.do(`document.getElementById('cancel').click()`)
	ff.waitJS(15*time.Second, "long run cancelled", `document.getElementById('start-status').innerText === 'cancelled'`)

	ff.open(e.url + "/ui/#/usage")
	ff.waitJS(10*time.Second, "usage chart", `document.querySelectorAll('#usage-chart svg rect.bar[data-group="n1"]').length >= 1`)
	ff.screenshot("firefox-usage")
	if len(ff.logs) > 0 {
		t.Errorf("Firefox logged page errors:\n%s", strings.Join(ff.logs, "\n"))
	}
}
