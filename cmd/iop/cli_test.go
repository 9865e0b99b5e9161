package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/goleak"

	"iop/cmd/iop/internal/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeEdge speaks the edge HTTP API from canned handlers and records the
// requests it gets.
type fakeEdge struct {
	*httptest.Server
	mux *http.ServeMux

	mu   sync.Mutex
	reqs []recorded
}

type recorded struct {
	method, path, query, accept string
	body                        string
}

func newFakeEdge(t *testing.T) *fakeEdge {
	t.Helper()
	e := &fakeEdge{mux: http.NewServeMux()}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		e.mu.Lock()
		e.reqs = append(e.reqs, recorded{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Accept"), string(b)})
		e.mu.Unlock()
		e.mux.ServeHTTP(w, r)
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *fakeEdge) last() recorded {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reqs[len(e.reqs)-1]
}

func (e *fakeEdge) json(pattern string, status int, body string) {
	e.mux.HandleFunc(pattern, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})
}

// sse answers pattern with an event stream of (type, data) pairs.
func (e *fakeEdge) sse(pattern string, header map[string]string, events ...string) {
	e.mux.HandleFunc(pattern, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for k, v := range header {
			w.Header().Set(k, v)
		}
		_, _ = io.WriteString(w, ": keep-alive\n\n")
		for i := 0; i+1 < len(events); i += 2 {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", events[i], events[i+1])
			w.(http.Flusher).Flush()
		}
	})
}

type result struct {
	stdout, stderr string
	code           int
}

type cliOpt func(*app)

func withStdin(s string) cliOpt { return func(a *app) { a.stdin = strings.NewReader(s) } }
func withTTY(in, out, err bool) cliOpt {
	return func(a *app) { a.stdinTTY, a.stdoutTTY, a.stderrTTY = in, out, err }
}

// withStdoutSeen closes seen once the CLI has printed want, so a test can
// interrupt it after the output it expects rather than after a guess at
// how long getting there takes.
func withStdoutSeen(want string, seen chan<- struct{}) cliOpt {
	return func(a *app) { a.stdout = &seenWriter{w: a.stdout, want: want, seen: seen} }
}

// interruptWhen waits for seen; a CLI that never prints what it should is
// interrupted anyway after a while, and the test then fails on its output.
func interruptWhen(seen <-chan struct{}) {
	select {
	case <-seen:
	case <-time.After(10 * time.Second):
	}
}

// seenWriter passes writes on to w and closes seen once they hold want.
type seenWriter struct {
	w    io.Writer
	want string
	got  []byte
	seen chan<- struct{}
}

func (s *seenWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if s.seen != nil {
		s.got = append(s.got, p[:n]...)
		if bytes.Contains(s.got, []byte(s.want)) {
			close(s.seen)
			s.seen = nil
		}
	}
	return n, err
}

// cli runs iop against edge (through IOP_EDGE) and returns what it printed.
func cli(t *testing.T, ctx context.Context, edge string, opts []cliOpt, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	a := &app{
		stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr,
		getenv: func(k string) string {
			if k == "IOP_EDGE" {
				return edge
			}
			return ""
		},
		now: func() time.Time { return testNow }, loc: time.UTC,
		httpClient: &http.Client{Transport: &http.Transport{}},
	}
	for _, o := range opts {
		o(a)
	}
	defer a.httpClient.CloseIdleConnections()
	code := a.run(ctx, args)
	return result{stdout.String(), stderr.String(), code}
}

func run(t *testing.T, edge string, args ...string) result {
	t.Helper()
	return cli(t, context.Background(), edge, nil, args...)
}

func (r result) want(t *testing.T, code int, stdout string) {
	t.Helper()
	if r.code != code || r.stdout != stdout {
		t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s\nwant exit %d, stdout:\n%s", r.code, r.stdout, r.stderr, code, stdout)
	}
}

func TestRunStreamsOutput(t *testing.T) {
	e := newFakeEdge(t)
	e.sse("POST /v1/runs", map[string]string{"X-IOP-Run-ID": "run_1", "X-IOP-Node": "n1"},
		"start", `{"run_id":"run_1","node":"n1","seq":1,"type":"start"}`,
		"reasoning_delta", `{"run_id":"run_1","seq":2,"type":"reasoning_delta","text":"thinking"}`,
		"delta", `{"run_id":"run_1","seq":3,"type":"delta","text":"HEL"}`,
		"delta", `{"run_id":"run_1","seq":4,"type":"delta","text":"LO"}`,
		"complete", `{"run_id":"run_1","seq":5,"type":"complete","usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"model":"m"}}`,
	)
	r := cli(t, context.Background(), e.URL, nil, "run", "-v", "--adapter", "exec", "--target", "upper", "--node", "n1",
		"--session", "s1", "--options", `{"a":1,"b":"x"}`, "--option", "b=two", "--option", "think=true", "hello")
	r.want(t, 0, "HELLO")
	if !strings.Contains(r.stderr, "thinking\n") || strings.Contains(r.stderr, "\x1b[") {
		t.Fatalf("stderr %q", r.stderr)
	}
	if !strings.Contains(r.stderr, "run run_1 on node n1") || !strings.Contains(r.stderr, "3 prompt + 4 completion = 7 tokens, model m") {
		t.Fatalf("verbose stderr %q", r.stderr)
	}
	req := e.last()
	var body map[string]any
	if err := json.Unmarshal([]byte(req.body), &body); err != nil {
		t.Fatal(err)
	}
	opts := body["options"].(map[string]any)
	if body["adapter"] != "exec" || body["target"] != "upper" || body["node"] != "n1" || body["session_id"] != "s1" || body["input"] != "hello" ||
		opts["a"] != 1.0 || opts["b"] != "two" || opts["think"] != true || req.accept != "text/event-stream" {
		t.Fatalf("request %s", req.body)
	}
	if _, ok := body["background"]; ok {
		t.Fatalf("background sent: %s", req.body)
	}
}

func TestRunInputFromStdin(t *testing.T) {
	e := newFakeEdge(t)
	e.sse("POST /v1/runs", map[string]string{"X-IOP-Run-ID": "run_1"}, "complete", `{"type":"complete"}`)
	cli(t, context.Background(), e.URL, []cliOpt{withStdin("from stdin\n")}, "run", "--adapter", "exec", "-").want(t, 0, "")
	if !strings.Contains(e.last().body, `"input":"from stdin\n"`) {
		t.Fatalf("body %s", e.last().body)
	}
	// No argument and a piped stdin: stdin is the input too.
	cli(t, context.Background(), e.URL, []cliOpt{withStdin("piped")}, "run", "--adapter", "exec").want(t, 0, "")
	if !strings.Contains(e.last().body, `"input":"piped"`) {
		t.Fatalf("body %s", e.last().body)
	}
	// No argument and a terminal: no input, stdin untouched.
	cli(t, context.Background(), e.URL, []cliOpt{withStdin("unread"), withTTY(true, false, false)}, "run", "--adapter", "exec").want(t, 0, "")
	if !strings.Contains(e.last().body, `"input":""`) {
		t.Fatalf("body %s", e.last().body)
	}
	// Input that is not UTF-8 is refused, not sent with U+FFFD in place
	// of its bad bytes.
	e.mu.Lock()
	before := len(e.reqs)
	e.mu.Unlock()
	for _, args := range [][]string{{"-"}, {}} {
		r := cli(t, context.Background(), e.URL, []cliOpt{withStdin("a\xffb")}, append([]string{"run", "--adapter", "exec"}, args...)...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "iop: the input on stdin is not UTF-8 text") {
			t.Fatalf("iop run %q with a\\xffb on stdin: %+v", args, r)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.reqs) != before {
		t.Fatalf("input that is not UTF-8 reached the edge: %+v", e.reqs[before:])
	}
}

func TestRunEndings(t *testing.T) {
	tests := []struct {
		name       string
		events     []string
		args       []string
		opts       []cliOpt
		code       int
		stdout     string
		stderrHas  string
		stderrLack string
	}{
		{
			name:   "error event",
			events: []string{"delta", `{"type":"delta","text":"partial"}`, "error", `{"type":"error","error":{"code":"run_failed","message":"exit status 3: boom"}}`},
			code:   1, stdout: "partial", stderrHas: "iop: exit status 3: boom (run_failed)\n",
		},
		{
			name:   "a partial line ended on a terminal",
			events: []string{"delta", `{"type":"delta","text":"partial"}`, "error", `{"type":"error","error":{"code":"run_failed","message":"boom"}}`},
			opts:   []cliOpt{withTTY(false, true, false)},
			code:   1, stdout: "partial\n", stderrHas: "iop: boom (run_failed)\n",
		},
		{
			name:   "a complete run's last line ended on a terminal only",
			events: []string{"delta", `{"type":"delta","text":"no newline"}`, "complete", `{"type":"complete"}`},
			opts:   []cliOpt{withTTY(false, true, false)},
			code:   0, stdout: "no newline\n",
		},
		{
			name:   "piped output is byte-exact",
			events: []string{"delta", `{"type":"delta","text":"no newline"}`, "complete", `{"type":"complete"}`},
			code:   0, stdout: "no newline",
		},
		{
			name:   "cancelled",
			events: []string{"delta", `{"type":"delta","text":"x\n"}`, "cancelled", `{"run_id":"run_1","type":"cancelled"}`},
			code:   130, stdout: "x\n", stderrHas: "was cancelled",
		},
		{
			name:   "cancelled by the node's stop says so",
			events: []string{"cancelled", `{"run_id":"run_1","type":"cancelled","error":{"code":"cancelled","message":"node shutting down"}}`},
			code:   130, stderrHas: "iop: run run_1 was cancelled: node shutting down\n",
		},
		{
			name:   "stream cut before the terminal event",
			events: []string{"delta", `{"type":"delta","text":"x"}`},
			code:   1, stdout: "x", stderrHas: "the stream ended before the run did",
		},
		{
			name:   "json lines",
			events: []string{"delta", `{"type":"delta", "text":"x"}`, "complete", `{"type":"complete"}`},
			args:   []string{"--json"},
			code:   0, stdout: `{"type":"delta","text":"x"}` + "\n" + `{"type":"complete"}` + "\n",
		},
		{
			name:   "dim reasoning on a terminal",
			events: []string{"reasoning_delta", `{"type":"reasoning_delta","text":"hmm"}`, "delta", `{"type":"delta","text":"ok\n"}`, "complete", `{"type":"complete"}`},
			opts:   []cliOpt{withTTY(false, false, true)},
			code:   0, stdout: "ok\n", stderrHas: "\x1b[2mhmm\x1b[0m\n",
		},
		{
			name:   "no usage line without -v",
			events: []string{"complete", `{"type":"complete","usage":{"total_tokens":9}}`},
			code:   0, stdout: "", stderrLack: "tokens",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newFakeEdge(t)
			e.sse("POST /v1/runs", map[string]string{"X-IOP-Run-ID": "run_1", "X-IOP-Node": "n1"}, tt.events...)
			r := cli(t, context.Background(), e.URL, tt.opts, append([]string{"run", "--adapter", "exec", "in"}, tt.args...)...)
			r.want(t, tt.code, tt.stdout)
			if !strings.Contains(r.stderr, tt.stderrHas) || (tt.stderrLack != "" && strings.Contains(r.stderr, tt.stderrLack)) {
				t.Fatalf("stderr %q", r.stderr)
			}
		})
	}
}

func TestRunBackground(t *testing.T) {
	e := newFakeEdge(t)
	e.json("POST /v1/runs", 202, `{"run_id":"run_bg","node":"n2"}`)
	run(t, e.URL, "run", "--adapter", "exec", "--background", "x").want(t, 0, "run_bg started in the background on node n2\n")
	if !strings.Contains(e.last().body, `"background":true`) {
		t.Fatalf("body %s", e.last().body)
	}
	run(t, e.URL, "run", "--adapter", "exec", "--background", "--json", "x").want(t, 0, `{"node":"n2","run_id":"run_bg"}`+"\n")
}

func TestRunEdgeErrors(t *testing.T) {
	e := newFakeEdge(t)
	e.json("POST /v1/runs", 404, `{"error":{"code":"node_not_found","message":"node \"x\" is not connected"}}`)
	r := run(t, e.URL, "run", "--adapter", "exec", "--node", "x", "hi")
	r.want(t, 1, "")
	if r.stderr != "iop: node \"x\" is not connected (node_not_found)\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
}

// interruptRun starts a run on a fake edge that streams "working" and then
// waits for its caller to leave, interrupts iop once it printed "working",
// and returns what iop printed. The edge answers the run's cancel with
// status and body; streamOpen reports whether the run's stream was still
// open when the cancel came.
func interruptRun(t *testing.T, status int, body string) (result, bool) {
	t.Helper()
	e := newFakeEdge(t)
	gone := make(chan struct{})
	e.mux.HandleFunc("POST /v1/runs", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-IOP-Run-ID", "run_long")
		_, _ = io.WriteString(w, "event: delta\ndata: {\"type\":\"delta\",\"text\":\"working\"}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	})
	var cancels atomic.Int32
	var streamOpen atomic.Bool
	e.mux.HandleFunc("POST /v1/runs/run_long/cancel", func(w http.ResponseWriter, _ *http.Request) {
		cancels.Add(1)
		select {
		case <-gone:
		default:
			streamOpen.Store(true)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	printed := make(chan struct{})
	go func() {
		interruptWhen(printed)
		cancel() // Ctrl-C
	}()
	r := cli(t, ctx, e.URL, []cliOpt{withStdoutSeen("working", printed)}, "run", "--adapter", "exec", "x")
	select {
	case <-gone:
	case <-time.After(2 * time.Second):
		t.Fatal("the edge never saw the client leave")
	}
	if n := cancels.Load(); n != 1 {
		t.Fatalf("the edge got %d cancels of the run, want 1", n)
	}
	return r, streamOpen.Load()
}

// On Ctrl-C iop cancels the run with a request of its own while the stream
// is still open, and says "cancelled" only when the edge confirmed it: it
// used to close the stream and say so whatever became of the run.
func TestInterruptCancelsTheRun(t *testing.T) {
	for _, tc := range []struct {
		name         string
		status       int
		body, stderr string
	}{
		{"cancelled", 200, `{"run_id":"run_long","node":"n1"}`, "iop: interrupted; run run_long is cancelled\n"},
		{"already ended", 409, `{"error":{"code":"run_finished","message":"run run_long has already finished"}}`,
			"iop: interrupted; run run_long had already ended: see iop run-get run_long\n"},
		{"cancel failed", 404, `{"error":{"code":"node_not_found","message":"node n1 is not connected"}}`,
			"iop: interrupted; run run_long may still be running, its cancel failed: node n1 is not connected (node_not_found); see iop run-get run_long, or iop cancel run_long\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, open := interruptRun(t, tc.status, tc.body)
			r.want(t, 130, "working")
			if r.stderr != tc.stderr {
				t.Fatalf("stderr %q, want %q", r.stderr, tc.stderr)
			}
			if !open {
				t.Fatal("the run's stream was closed before its cancel was sent")
			}
		})
	}
}

// The edge answers a cancel by ending the run's stream with the run's last
// event, most often before iop has the cancel's own answer: iop then said
// "run … was cancelled: cancelled by request" (or, with the run ended
// meanwhile, exited 0 as if Ctrl-C had not been pressed), never the
// "interrupted; …" it documents. The stream's last event now tells what
// became of the run, as the cancel's answer does.
func TestInterruptEndedByTheStreamsLastEvent(t *testing.T) {
	for _, tc := range []struct {
		name, event, data string
		status            int
		body, stderr      string
	}{
		{"cancelled", "cancelled", `{"type":"cancelled","error":{"code":"cancelled","message":"cancelled by request"}}`,
			200, `{"run_id":"run_long","node":"n1"}`, "iop: interrupted; run run_long is cancelled\n"},
		{"completed meanwhile", "complete", `{"type":"complete"}`,
			409, `{"error":{"code":"run_finished","message":"run run_long has already finished"}}`,
			"iop: interrupted; run run_long had already ended: see iop run-get run_long\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEdge(t)
			last := make(chan struct{})
			sent := make(chan struct{})
			e.mux.HandleFunc("POST /v1/runs", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Header().Set("X-IOP-Run-ID", "run_long")
				_, _ = io.WriteString(w, "event: delta\ndata: {\"type\":\"delta\",\"text\":\"working\"}\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-last:
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, "event: "+tc.event+"\ndata: "+tc.data+"\n\n")
				w.(http.Flusher).Flush()
				close(sent)
			})
			e.mux.HandleFunc("POST /v1/runs/run_long/cancel", func(w http.ResponseWriter, _ *http.Request) {
				// As the real edge: the run's stream ends before the
				// cancel is answered.
				close(last)
				select {
				case <-sent:
				case <-time.After(5 * time.Second):
				}
				time.Sleep(50 * time.Millisecond) // for iop to read it
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			printed := make(chan struct{})
			go func() {
				interruptWhen(printed)
				cancel() // Ctrl-C
			}()
			r := cli(t, ctx, e.URL, []cliOpt{withStdoutSeen("working", printed)}, "run", "--adapter", "exec", "x")
			r.want(t, 130, "working")
			if r.stderr != tc.stderr {
				t.Fatalf("stderr %q, want %q", r.stderr, tc.stderr)
			}
		})
	}
}

func TestUnreachableEdge(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	r := run(t, url, "nodes")
	r.want(t, 1, "")
	if !strings.Contains(r.stderr, "cannot reach the edge at "+url) || !strings.Contains(r.stderr, "IOP_EDGE") {
		t.Fatalf("stderr %q", r.stderr)
	}
	// --edge wins over IOP_EDGE.
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[]}`)
	r = cli(t, context.Background(), url, nil, "--edge", e.URL, "nodes")
	r.want(t, 0, "")
}

// An edge URL may carry a password (an edge behind a proxy with basic
// auth); the "cannot reach" error names the edge without it.
func TestUnreachableEdgeHidesThePassword(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r := run(t, "http://ops:hunter2@"+addr, "nodes")
	r.want(t, 1, "")
	if strings.Contains(r.stderr, "hunter2") || !strings.Contains(r.stderr, "cannot reach the edge at http://ops:xxxxx@"+addr) {
		t.Fatalf("stderr %q", r.stderr)
	}
}

// A redirect is reported, never followed, on the default client and on the
// one --ca-file builds: Go's client keeps the Authorization header for the
// same host name, so the API key and a run's input would go to another port
// of the host, or from https down to plain http.
func TestRedirectsAreReportedNotFollowed(t *testing.T) {
	var mu sync.Mutex
	var followed []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		followed = append(followed, fmt.Sprintf("%s %s auth=%q body=%q", r.Method, r.URL.Path, r.Header.Get("Authorization"), b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"nodes":[]}`)
	}))
	defer other.Close()
	redirect := func(status int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			// No connection left idle in the client --ca-file builds.
			w.Header().Set("Connection", "close")
			http.Redirect(w, r, other.URL+r.URL.Path, status)
		}
	}
	plain := newFakeEdge(t)
	plain.mux.HandleFunc("/", redirect(http.StatusTemporaryRedirect))
	secure := httptest.NewTLSServer(redirect(http.StatusPermanentRedirect))
	defer secure.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: secure.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		edge   string
		args   []string
		path   string
		status int
	}{
		{plain.URL, []string{"nodes"}, "/v1/nodes", 307},
		{plain.URL, []string{"run", "--adapter", "exec", "secret input"}, "/v1/runs", 307},
		{secure.URL, []string{"--ca-file", ca, "nodes"}, "/v1/nodes", 308},
		{secure.URL, []string{"--ca-file", ca, "run", "--adapter", "exec", "secret input"}, "/v1/runs", 308},
	} {
		r := run(t, c.edge, append([]string{"--api-key", "sk-secret"}, c.args...)...)
		want := fmt.Sprintf("iop: the edge answered with a redirect to %s%s (HTTP %d); point --edge (or IOP_EDGE) at the final address\n", other.URL, c.path, c.status)
		if r.code != 1 || r.stderr != want {
			t.Errorf("iop %q: exit %d, stderr %q; want exit 1, %q", c.args, r.code, r.stderr, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(followed) > 0 {
		t.Fatalf("redirects were followed: %q", followed)
	}
}

// A call that does not stream and outlasts client.CallTimeout (no headers,
// or a body that stops halfway) ends with exit 1 and names the edge and the
// wait, not a bare "context deadline exceeded".
func TestSlowCallNamesTheEdgeAndTheWait(t *testing.T) {
	defer func(d time.Duration) { client.CallTimeout = d }(client.CallTimeout)
	client.CallTimeout = 200 * time.Millisecond
	e := newFakeEdge(t)
	silent := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	e.mux.HandleFunc("GET /v1/nodes", silent)
	e.mux.HandleFunc("POST /v1/nodes/n1/commands", silent)
	e.mux.HandleFunc("GET /v1/runs", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"runs":[`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, args := range [][]string{{"nodes"}, {"node", "caps", "n1"}, {"runs"}} {
		r := cli(t, ctx, e.URL, nil, args...)
		want := "iop: the edge at " + e.URL + " did not answer within 200ms\n"
		if r.code != 1 || r.stderr != want {
			t.Errorf("iop %q: exit %d, stderr %q; want exit 1, %q", args, r.code, r.stderr, want)
		}
	}
}

// silentEdge accepts connections and reads requests but never answers; it
// returns its URL.
func silentEdge(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(io.Discard, conn)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

// Streaming commands on an edge that takes the connection but never sends
// response headers end with exit 1 after client.HeaderTimeout, naming the
// edge and the wait: the stream's idle timer only starts with its body, and
// they hung until interrupted.
func TestStreamsEndWhenTheEdgeNeverAnswers(t *testing.T) {
	defer func(d time.Duration) { client.HeaderTimeout = d }(client.HeaderTimeout)
	client.HeaderTimeout = 200 * time.Millisecond
	url := silentEdge(t)
	for _, args := range [][]string{
		{"run", "--adapter", "exec", "x"},
		{"events"},
		{"node", "exec", "n1", "capabilities"},
		{"ollama", "pull", "m", "--node", "n1"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r := cli(t, ctx, url, nil, args...)
		cancel()
		want := "iop: the edge at " + url + " did not answer within 200ms\n"
		if r.code != 1 || r.stderr != want {
			t.Errorf("iop %q: exit %d, stderr %q; want exit 1, %q", args, r.code, r.stderr, want)
		}
	}
}

// The wait for headers ends with them: a stream that is slow after its
// headers is the idle timer's business, not cut at client.HeaderTimeout.
func TestHeaderWaitEndsWithTheHeaders(t *testing.T) {
	defer func(d time.Duration) { client.HeaderTimeout = d }(client.HeaderTimeout)
	// Long enough for the headers on a loaded machine (with 100 ms they
	// could miss it there); the body comes after it has run out, which it
	// has by then: the wait started before the request reached the edge.
	const wait = time.Second
	client.HeaderTimeout = wait
	e := newFakeEdge(t)
	e.mux.HandleFunc("POST /v1/runs", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-IOP-Run-ID", "run_slow")
		w.(http.Flusher).Flush()
		time.Sleep(wait + 100*time.Millisecond)
		_, _ = io.WriteString(w, "event: delta\ndata: {\"type\":\"delta\",\"text\":\"late\"}\n\n"+
			"event: complete\ndata: {\"type\":\"complete\"}\n\n")
	})
	run(t, e.URL, "run", "--adapter", "exec", "x").want(t, 0, "late")
}

func TestUsageErrors(t *testing.T) {
	e := newFakeEdge(t)
	for _, args := range [][]string{
		{"bogus"},
		{"run", "x"},
		{"run", "--adapter", "exec", "--bogus"},
		{"run", "--adapter", "exec", "--options", "[1]", "x"},
		{"run", "--adapter", "exec", "--option", "novalue", "x"},
		{"run", "--adapter", "exec", "a", "b"},
		{"run", "--adapter", "exec", "a\xffb"},
		{"cancel"},
		{"runs", "--limit", "x"},
		{"session", "end", "s1"},
		{"node", "exec", "n1"},
		{"node", "exec", "n1", "caps", "{bad"},
		{"--edge", "ftp://x", "nodes"},
		// A mistyped subcommand of a command that only groups others.
		{"node", "bogus"},
		{"ollama", "bogus"},
		{"session", "bogus"},
	} {
		r := run(t, e.URL, args...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "iop: ") {
			t.Errorf("%v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.reqs) != 0 {
		t.Fatalf("usage errors reached the edge: %v", e.reqs)
	}
}

// A filter given with an empty value ("--session \"$S\"" with S unset) is
// a usage error: it was dropped as if never given, and the command listed,
// summed or followed everything. An empty --cursor is the first page, as a
// paging loop starts, and goes through.
func TestEmptyFiltersAreUsageErrors(t *testing.T) {
	e := newFakeEdge(t)
	for _, args := range [][]string{
		{"runs", "--session", ""},
		{"runs", "--node", " "},
		{"runs", "--status", ""},
		{"runs", "--adapter", ""},
		{"runs", "--key", ""},
		{"runs", "--since", ""},
		{"runs", "--until", ""},
		{"usage", "--since", ""},
		{"usage", "--until", ""},
		{"events", "--type", ""},
		{"events", "--type", "node.*", "--type", ","},
		// The nodes' own listings alike: they asked every node for every
		// adapter's, or every status's, runs and sessions.
		{"node", "runs", "--adapter", ""},
		{"node", "runs", "n1", "--status", ""},
		{"node", "sessions", "--adapter", " "},
	} {
		r := run(t, e.URL, args...)
		want := "iop: " + args[len(args)-2] + " must not be empty (leave it out for no filter)\n"
		if r.code != 2 || !strings.HasPrefix(r.stderr, want) {
			t.Errorf("%q: exit %d, stderr %q; want 2, %q", args, r.code, r.stderr, want)
		}
	}
	e.mu.Lock()
	n := len(e.reqs)
	e.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d requests with an empty filter reached the edge", n)
	}
	// Flags that choose alike: "iop run --session \"$S\"" with S unset
	// ran without a session (the conversation silently lost), and
	// --node "$N" let the edge pick any node.
	for _, c := range []struct {
		args  []string
		unset string
	}{
		{[]string{"run", "--adapter", "exec", "--node", "", "x"}, "the default"},
		{[]string{"run", "--adapter", "exec", "--target", " ", "x"}, "the default"},
		{[]string{"run", "--adapter", "llm", "--session", "", "x"}, "a run without a session"},
		{[]string{"session", "end", "s1", "--adapter", "llm", "--node", ""}, "the default"},
		{[]string{"session", "end", "s1", "--adapter", "llm", "--target", ""}, "the default"},
		{[]string{"ollama", "list", "--node", ""}, "the default"},
		{[]string{"ollama", "--adapter", "", "pull", "m"}, "the default"},
	} {
		r := run(t, e.URL, c.args...)
		flag := c.args[slices.IndexFunc(c.args, func(a string) bool { return strings.TrimSpace(a) == "" })-1]
		want := "iop: " + flag + " must not be empty (leave it out for " + c.unset + ")\n"
		if r.code != 2 || !strings.HasPrefix(r.stderr, want) {
			t.Errorf("%q: exit %d, stderr %q; want 2, %q", c.args, r.code, r.stderr, want)
		}
	}
	e.mu.Lock()
	n = len(e.reqs)
	e.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d requests with an empty --node, --target, --session or --adapter reached the edge", n)
	}
	e.json("GET /v1/runs", 200, `{"runs":[]}`)
	if r := run(t, e.URL, "runs", "--cursor", "", "--limit", "5"); r.code != 0 || e.last().query != "limit=5" {
		t.Fatalf("runs --cursor '': exit %d, stderr %q, query %q", r.code, r.stderr, e.last().query)
	}
}

// A usage error points at the help of the command used; iop alone shows the
// help on stderr and exits 2; --version prints the version.
func TestUsageHelpAndVersion(t *testing.T) {
	e := newFakeEdge(t)
	for args, help := range map[string]string{
		"run --adapter exec --bogus": "Run 'iop run --help' for usage.",
		"node exec n1":               "Run 'iop node exec --help' for usage.",
		"bogus":                      "Run 'iop --help' for usage.",
		"node bogus":                 "Run 'iop node --help' for usage.",
		"ollama bogus":               "Run 'iop ollama --help' for usage.",
		"session bogus":              "Run 'iop session --help' for usage.",
	} {
		r := run(t, e.URL, strings.Fields(args)...)
		if r.code != 2 || !strings.HasSuffix(r.stderr, help+"\n") {
			t.Errorf("%s: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	if r := run(t, e.URL, "node", "bogus"); !strings.HasPrefix(r.stderr, `iop: unknown command "bogus" for "iop node"`+"\n") {
		t.Errorf("node bogus: stderr %q", r.stderr)
	}
	r := run(t, e.URL)
	if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "Available Commands:") {
		t.Fatalf("iop alone: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// A command that only groups others, alone, is the same: its help on
	// stderr, exit 2. Asked for, the help is on stdout with exit 0.
	for _, group := range []string{"node", "ollama", "session"} {
		r := run(t, e.URL, group)
		if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "Available Commands:") {
			t.Errorf("iop %s alone: exit %d, stdout %q, stderr %q", group, r.code, r.stdout, r.stderr)
		}
		r = run(t, e.URL, group, "--help")
		if r.code != 0 || !strings.Contains(r.stdout, "Available Commands:") {
			t.Errorf("iop %s --help: exit %d, stdout %q, stderr %q", group, r.code, r.stdout, r.stderr)
		}
	}
	r = run(t, e.URL, "--version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "iop ") {
		t.Fatalf("--version: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// An adapter that needs a target, run without one: "--target is required".
func TestRunWithoutTarget(t *testing.T) {
	e := newFakeEdge(t)
	e.json("POST /v1/runs", 404, `{"error":{"code":"target_not_found","message":"exec adapter \"exec\" needs a target (known: upper)"}}`)
	r := run(t, e.URL, "run", "--adapter", "exec", "--background")
	if r.code != 2 || !strings.HasPrefix(r.stderr, "iop: --target is required for adapter \"exec\": exec adapter \"exec\" needs a target (known: upper)\n") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestNodes(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[
		{"id":"n1","connected":true,"remote":"10.0.0.1:5555","connected_at":"2026-03-01T11:55:00Z","version":"v1.2.3","config_version":2,"runs_in_flight":1,
		 "adapters":[{"name":"exec","type":"exec","max_concurrency":4,"in_flight":1},{"name":"llm","type":"ollama","max_concurrency":2,"in_flight":0}],"providers":[]},
		{"id":"n2","remote":"10.0.0.2:5555","connected_at":"2026-02-27T12:00:00Z","version":"v1.2.4","adapters":[],"providers":[]},
		{"id":"n3","connected":false,"disconnected_at":"2026-03-01T11:50:00Z","disconnect_reason":"heartbeat timeout after 45s","adapters":[{"name":"exec","type":"exec","max_concurrency":4,"in_flight":0}],"providers":[]},
		{"id":"n4","connected":false,"adapters":[],"providers":[]},
		{"id":"n5","connected":true,"draining":true,"remote":"10.0.0.5:5555","connected_at":"2026-03-01T11:59:00Z","version":"v1.2.3","adapters":[],"providers":[]}]}`)
	// n2 comes from an edge that predates "connected": it is online. n5 is
	// stopping: the edge sends it no new run, which "online" would hide.
	run(t, e.URL, "nodes").want(t, 0, ""+
		"ID  STATUS    REMOTE         CONNECTED     ADAPTERS            VERSION\n"+
		"n1  online    10.0.0.1:5555  5m ago        exec(1/4) llm(0/2)  v1.2.3\n"+
		"n2  online    10.0.0.2:5555  2d ago        -                   v1.2.4\n"+
		"n3  offline   -              left 10m ago  exec(0/4)           -\n"+
		"n4  offline   -              -             -                   -\n"+
		"n5  draining  10.0.0.5:5555  1m ago        -                   v1.2.3\n"+
		"\n"+
		"n3 left: heartbeat timeout after 45s\n")
	r := run(t, e.URL, "nodes", "--json")
	var v map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil {
		t.Fatalf("json output %q", r.stdout)
	}
}

func TestRuns(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/runs", 200, `{"runs":[
		{"run_id":"run_2","node":"n1","adapter":"exec","target":"upper","status":"failed","background":false,"created_at":"2026-03-01T11:00:00Z",
		 "started_at":"2026-03-01T11:00:01Z","finished_at":"2026-03-01T11:00:03.5Z","error":{"code":"run_failed","message":"exit status 1"}},
		{"run_id":"run_1","node":"n2","adapter":"llm","status":"running","background":true,"created_at":"2026-03-01T11:59:00Z","started_at":"2026-03-01T11:59:00Z"}],
		"errors":[{"node":"n3","code":"timeout","message":"slow"}]}`)
	r := run(t, e.URL, "runs", "--node", "n1", "--status", "failed", "--limit", "5")
	r.want(t, 0, ""+
		"RUN    NODE  ADAPTER  TARGET  STATUS   CREATED              DURATION  ERROR\n"+
		"run_2  n1    exec     upper   failed   2026-03-01 11:00:00  2.5s      run_failed: exit status 1\n"+
		"run_1  n2    llm      -       running  2026-03-01 11:59:00  1m0s+     -\n")
	if r.stderr != "iop: warning: node n3 did not answer: slow (timeout)\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
	if q := e.last().query; q != "limit=5&node=n1&status=failed" {
		t.Fatalf("query %q", q)
	}
	run(t, e.URL, "runs", "--session", "chat 1")
	if q := e.last().query; q != "session=chat+1" {
		t.Fatalf("query %q", q)
	}
}

// iop node runs pages a node's own store: its flags are the runs
// command's arguments, and a page with more after it prints the command
// for the next one (same filters, the node's cursor) to stderr.
func TestNodeRuns(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"n1","connected":true,"adapters":[]},{"id":"n2","connected":true,"adapters":[]}]}`)
	var mu sync.Mutex
	var runsArgs []string
	e.mux.HandleFunc("POST /v1/nodes/{id}/commands", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Command string
			Args    json.RawMessage
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		id := r.PathValue("id")
		w.Header().Set("Content-Type", "application/json")
		if body.Command != "runs" {
			w.WriteHeader(400)
			_, _ = io.WriteString(w, `{"error":{"code":"unknown_command","message":"unknown command"}}`)
			return
		}
		mu.Lock()
		runsArgs = append(runsArgs, id+" "+string(body.Args))
		mu.Unlock()
		if strings.Contains(string(body.Args), "bad") {
			w.WriteHeader(400)
			_, _ = io.WriteString(w, `{"error":{"code":"invalid_request","message":"cursor \"bad\" is not one this node's runs listing returned"}}`)
			return
		}
		next := ""
		if !strings.Contains(string(body.Args), "cursor") {
			next = `,"next_cursor":"c-` + id + `"`
		}
		_, _ = io.WriteString(w, `{"runs":[{"run_id":"r-`+id+`","adapter":"exec","target":"upper","status":"failed","background":false,
			"created_at":"2026-03-01T11:00:00Z","started_at":"2026-03-01T11:00:01Z","finished_at":"2026-03-01T11:00:03.5Z",
			"error":{"code":"exit_1","message":"exit status 1"}}]`+next+`}`)
	})
	r := run(t, e.URL, "node", "runs", "n1", "--limit", "1", "--adapter", "exec", "--status", "failed")
	r.want(t, 0, ""+
		"NODE  RUN   ADAPTER  TARGET  STATUS  CREATED              DURATION  ERROR\n"+
		"n1    r-n1  exec     upper   failed  2026-03-01 11:00:00  2.5s      exit_1: exit status 1\n")
	if r.stderr != "more runs on node n1: iop node runs n1 --adapter exec --status failed --limit 1 --cursor c-n1\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
	if r = run(t, e.URL, "node", "runs", "n1", "--cursor", "c-n1"); r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "r-n1") {
		t.Fatalf("next page: %+v", r)
	}
	// Every node: a page each, and a hint for each node with more.
	if r = run(t, e.URL, "node", "runs"); r.code != 0 || !strings.Contains(r.stdout, "r-n1") || !strings.Contains(r.stdout, "r-n2") ||
		r.stderr != "more runs on node n1: iop node runs n1 --cursor c-n1\nmore runs on node n2: iop node runs n2 --cursor c-n2\n" {
		t.Fatalf("every node: %+v", r)
	}
	if r = run(t, e.URL, "node", "runs", "--cursor", "c-n1"); r.code != 2 || !strings.Contains(r.stderr, "name the NODE") {
		t.Fatalf("--cursor without NODE: %+v", r)
	}
	// A node that predates the filters answers runs that do not match
	// them (this fake ignores them too): they are not printed.
	if r = run(t, e.URL, "node", "runs", "n1", "--status", "succeeded"); r.code != 0 || strings.Contains(r.stdout, "r-n1") || !strings.Contains(r.stderr, "no runs") {
		t.Fatalf("another status's run printed: %+v", r)
	}
	if r = run(t, e.URL, "node", "runs", "n1", "--adapter", "llm"); r.code != 0 || strings.Contains(r.stdout, "r-n1") {
		t.Fatalf("another adapter's run printed: %+v", r)
	}
	if r = run(t, e.URL, "node", "runs", "n1", "--limit", "-1"); r.code != 2 || !strings.Contains(r.stderr, "--limit must not be negative") {
		t.Fatalf("--limit -1: %+v", r)
	}
	if r = run(t, e.URL, "node", "runs", "n1", "--cursor", "bad"); r.code != 1 || !strings.Contains(r.stderr, "is not one this node's runs listing returned") {
		t.Fatalf("a foreign cursor: %+v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{
		`n1 {"status":"failed","adapter":"exec","limit":1}`, `n1 {"limit":0,"cursor":"c-n1"}`,
		`n1 {"limit":0}`, `n2 {"limit":0}`, `n1 {"status":"succeeded","limit":0}`, `n1 {"adapter":"llm","limit":0}`,
		`n1 {"limit":0,"cursor":"bad"}`,
	}; !slices.Equal(runsArgs, want) {
		t.Errorf("runs args %q, want %q", runsArgs, want)
	}
}

// The edge's history sends created_at and finished_at (null while the run
// goes on), never started_at: the shape of adapters/http/history.go's
// runRecordJSON. Durations count from created_at then.
func TestRunsFromTheEdgeHistory(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/runs", 200, `{"runs":[
		{"run_id":"run_2","node":"n1","adapter":"llm","target":"","session_id":"","key":"ops","background":true,"status":"running",
		 "created_at":"2026-03-01T11:59:50Z","finished_at":null},
		{"run_id":"run_1","node":"n1","adapter":"exec","target":"upper","session_id":"s1","key":"anonymous","background":false,"status":"failed",
		 "created_at":"2026-03-01T11:00:00Z","finished_at":"2026-03-01T11:00:03.5Z","error":{"code":"run_failed","message":"exit status 1"},
		 "usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"cost_usd":0}}],
		"next_cursor":"c2"}`)
	r := run(t, e.URL, "runs")
	r.want(t, 0, ""+
		"RUN    NODE  ADAPTER  TARGET  STATUS   CREATED              DURATION  ERROR\n"+
		"run_2  n1    llm      -       running  2026-03-01 11:59:50  10s+      -\n"+
		"run_1  n1    exec     upper   failed   2026-03-01 11:00:00  3.5s      run_failed: exit status 1\n")
	if r.stderr != "more runs: iop runs --cursor c2\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
	// The next page's command keeps the filters and page size: the cursor
	// holds only the position, and "--cursor c2" alone listed every run
	// after it.
	r = run(t, e.URL, "runs", "--status", "failed", "--node", "n1", "--since", "2026-03-01", "--limit", "2")
	if r.code != 0 || r.stderr != "more runs: iop runs --node n1 --status failed --since 2026-03-01 --limit 2 --cursor c2\n" {
		t.Fatalf("a filtered page: %+v", r)
	}
	e.json("GET /v1/runs/run_1", 200, `{"run_id":"run_1","node":"n1","adapter":"exec","target":"upper","session_id":"s1","key":"anonymous",
		"background":false,"status":"succeeded","created_at":"2026-03-01T11:00:00Z","finished_at":"2026-03-01T11:00:01Z"}`)
	r = run(t, e.URL, "run-get", "run_1")
	if r.code != 0 || !strings.Contains(r.stdout, "duration:    1s\n") || strings.Contains(r.stdout, "started:") {
		t.Fatalf("%+v", r)
	}
}

func TestRunGet(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/runs/run_2", 200, `{"run_id":"run_2","node":"n1","adapter":"exec","status":"succeeded","background":true,"created_at":"2026-03-01T11:00:00Z",
		"started_at":"2026-03-01T11:00:01Z","finished_at":"2026-03-01T11:00:02Z","usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
	e.json("GET /v1/runs/run_x", 404, `{"error":{"code":"run_not_found","message":"no connected node knows run run_x"}}`)
	want := "" +
		"run:         run_2\n" +
		"node:        n1\n" +
		"adapter:     exec\n" +
		"target:      -\n" +
		"session:     -\n" +
		"background:  true\n" +
		"status:      succeeded\n" +
		"created:     2026-03-01 11:00:00\n" +
		"started:     2026-03-01 11:00:01\n" +
		"finished:    2026-03-01 11:00:02\n" +
		"duration:    1s\n" +
		"usage:       1 prompt + 2 completion = 3 tokens\n"
	run(t, e.URL, "run-get", "run_2").want(t, 0, want)
	run(t, e.URL, "runs", "get", "run_2").want(t, 0, want)
	r := run(t, e.URL, "runs", "get", "run_x")
	if r.code != 1 || r.stderr != "iop: no connected node knows run run_x (run_not_found)\n" {
		t.Fatalf("%+v", r)
	}
}

func TestCancelAndSession(t *testing.T) {
	e := newFakeEdge(t)
	e.json("POST /v1/runs/run_1/cancel", 200, `{"run_id":"run_1","node":"n1","status":"cancelling"}`)
	e.json("POST /v1/runs/run_2/cancel", 409, `{"error":{"code":"run_finished","message":"run run_2 has already finished"}}`)
	e.json("DELETE /v1/sessions/s1", 200, `{"session_id":"s1","node":"n1","adapter":"llm","terminated":true}`)
	e.json("DELETE /v1/sessions/s2", 501, `{"error":{"code":"session_unsupported","message":"adapter exec keeps no sessions"}}`)

	run(t, e.URL, "cancel", "run_1").want(t, 0, "cancelling run run_1 on node n1\n")
	r := run(t, e.URL, "cancel", "run_2")
	if r.code != 1 || r.stderr != "iop: run run_2 has already finished (run_finished)\n" {
		t.Fatalf("%+v", r)
	}
	run(t, e.URL, "session", "end", "s1", "--adapter", "llm", "--node", "n1", "--target", "qwen").want(t, 0, "session s1 of adapter llm ended on node n1\n")
	if q := e.last().query; q != "adapter=llm&node=n1&target=qwen" {
		t.Fatalf("query %q", q)
	}
	r = run(t, e.URL, "session", "end", "s2", "--adapter", "exec")
	if r.code != 1 || !strings.Contains(r.stderr, "(session_unsupported)") {
		t.Fatalf("%+v", r)
	}
}

// Ids with spaces, slashes, non-ASCII letters or percent signs reach the
// edge's path parameters exactly as typed, for every command that puts an
// id in the path (they were escaped twice: "my chat" arrived as "my%20chat").
func TestIDsInThePathReachTheEdgeUnchanged(t *testing.T) {
	e := newFakeEdge(t)
	var mu sync.Mutex
	var got []string
	record := func(param, answer string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = append(got, r.PathValue(param))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, answer)
		}
	}
	e.mux.HandleFunc("GET /v1/runs/{id}", record("id", `{"run_id":"r","status":"running","created_at":"2026-03-01T11:00:00Z"}`))
	e.mux.HandleFunc("POST /v1/runs/{id}/cancel", record("id", `{"run_id":"r","node":"n1","status":"cancelling"}`))
	e.mux.HandleFunc("DELETE /v1/sessions/{session_id}", record("session_id", `{"terminated":true}`))
	e.mux.HandleFunc("POST /v1/nodes/{id}/commands", record("id", `{}`))
	for _, id := range []string{"my chat", "team/alice", "café", "50%", "a+b"} {
		for _, args := range [][]string{
			{"run-get", id},
			{"cancel", id},
			{"session", "end", id, "--adapter", "llm"},
			{"node", "exec", id, "capabilities"},
			{"node", "caps", id},
			{"ollama", "version", "--node", id},
		} {
			mu.Lock()
			got = nil
			mu.Unlock()
			r := run(t, e.URL, args...)
			mu.Lock()
			seen := got
			mu.Unlock()
			if r.code != 0 || len(seen) != 1 || seen[0] != id {
				t.Errorf("iop %q: the edge saw %q (exit %d, stderr %q)", args, seen, r.code, r.stderr)
			}
		}
	}
}

func TestEvents(t *testing.T) {
	e := newFakeEdge(t)
	e.sse("GET /v1/events", nil,
		"node.registered", `{"type":"node.registered","time":"2026-03-01T12:00:01.5Z","node":"n1","remote":"1.2.3.4:5"}`,
		"run.event", `{"type":"run.event","time":"2026-03-01T12:00:02Z","node":"n1","run":{"run_id":"run_1","seq":3,"type":"delta","text":"hi\nthere"}}`,
		"run.event", `{"type":"run.event","time":"2026-03-01T12:00:03Z","node":"n1","run":{"run_id":"run_1","seq":4,"type":"error","error":{"code":"node_disconnected","message":"gone"}}}`,
		"node.rejected", `{"type":"node.rejected","time":"2026-03-01T12:00:04Z","remote":"5.6.7.8:9","reason":"unknown_token"}`,
		"tunnel.completed", `{"type":"tunnel.completed","time":"2026-03-01T12:00:05Z","node":"n1","tunnel":{"id":"t1","provider":"ol","status":200,"body_bytes":10,"duration_ms":15}}`,
	)
	r := run(t, e.URL, "events", "--type", "node.registered,run.event", "--type", "node.*")
	r.want(t, 1, ""+
		"12:00:01.500 node.registered node=n1 remote=1.2.3.4:5\n"+
		"12:00:02.000 run.event node=n1 run=run_1 #3 delta \"hi there\"\n"+
		"12:00:03.000 run.event node=n1 run=run_1 #4 error node_disconnected: \"gone\"\n"+
		"12:00:04.000 node.rejected remote=5.6.7.8:9 reason=\"unknown_token\"\n"+
		"12:00:05.000 tunnel.completed node=n1 tunnel=t1 provider=ol status=200 bytes=10 duration=15ms\n")
	if !strings.Contains(r.stderr, "the edge closed the event stream") {
		t.Fatalf("stderr %q", r.stderr)
	}
	if q := e.last().query; q != "type=node.registered%2Crun.event%2Cnode.%2A" {
		t.Fatalf("query %q", q)
	}
	r = run(t, e.URL, "events", "--json")
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 5 || lines[0] != `{"type":"node.registered","time":"2026-03-01T12:00:01.5Z","node":"n1","remote":"1.2.3.4:5"}` {
		t.Fatalf("json lines %q", r.stdout)
	}
}

// An error message with newlines and terminal escapes (a node's or an
// agent's text) stays on its event's one line, quoted and cut at 200
// characters; so does a tunnel's error, and a name with a control byte.
func TestEventsOneLineEach(t *testing.T) {
	e := newFakeEdge(t)
	long := strings.Repeat("x", 300)
	e.sse("GET /v1/events", nil,
		"run.event", `{"type":"run.event","time":"2026-03-01T12:00:01Z","node":"n1","run":{"run_id":"run_1","seq":4,"type":"error","error":{"code":"exec_failed","message":"line one\nline two \u001b[31mred\u001b[0m\r\n"}}}`,
		"run.event", `{"type":"run.event","time":"2026-03-01T12:00:02Z","node":"n1","run":{"run_id":"run_2","seq":2,"type":"error","error":{"code":"internal","message":"`+long+`"}}}`,
		"tunnel.completed", `{"type":"tunnel.completed","time":"2026-03-01T12:00:03Z","node":"n1","tunnel":{"id":"t1","provider":"ol","model":"m\u001b]0;x\u0007","status":502,"body_bytes":0,"duration_ms":5,"error":"upstream said:\n\u001b[2Jboom"}}`,
	)
	r := run(t, e.URL, "events")
	r.want(t, 1, ""+
		"12:00:01.000 run.event node=n1 run=run_1 #4 error exec_failed: \"line one line two \\x1b[31mred\\x1b[0m\"\n"+
		"12:00:02.000 run.event node=n1 run=run_2 #2 error internal: \""+strings.Repeat("x", 199)+"…\"\n"+
		"12:00:03.000 tunnel.completed node=n1 tunnel=t1 provider=ol model=\"m\\x1b]0;x\\a\" status=502 bytes=0 duration=5ms error=\"upstream said: \\x1b[2Jboom\"\n")
	if strings.ContainsRune(r.stdout, 0x1b) {
		t.Fatalf("a raw escape reached stdout: %q", r.stdout)
	}
}

func TestEventsInterrupted(t *testing.T) {
	e := newFakeEdge(t)
	e.mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: config.reloaded\ndata: {\"type\":\"config.reloaded\",\"time\":\"2026-03-01T12:00:00Z\"}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	printed := make(chan struct{})
	go func() {
		interruptWhen(printed)
		cancel()
	}()
	cli(t, ctx, e.URL, []cliOpt{withStdoutSeen("config.reloaded\n", printed)}, "events").want(t, 130, "12:00:00.000 config.reloaded\n")
}

func TestNodeReports(t *testing.T) {
	e := newFakeEdge(t)
	// n3 is in the edge's config but offline: reports never ask it.
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"n1","adapters":[]},{"id":"n2","connected":true,"adapters":[]},{"id":"n3","connected":false,"adapters":[]}]}`)
	var mu sync.Mutex
	var sessionArgs []string
	e.mux.HandleFunc("POST /v1/nodes/{id}/commands", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Command string
			Args    json.RawMessage
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		id := r.PathValue("id")
		w.Header().Set("Content-Type", "application/json")
		if id == "n3" {
			t.Errorf("%s sent to offline node n3", body.Command)
		}
		switch body.Command {
		case "capabilities":
			fmt.Fprintf(w, `{"node_id":%q,"config_version":3,"version":"v1","os":"linux","arch":"amd64","hostname":"box-%s",
				"adapters":[{"name":"exec","type":"exec","max_concurrency":4,"in_flight":1,"sessions":false},
				{"name":"llm","type":"ollama","max_concurrency":2,"in_flight":0,"sessions":true,"commands":["ollama.list","ollama.pull"]}]}`, id, id)
		case "usage_status":
			// The edge adds the provider tunnels it relayed for the node.
			_, _ = io.WriteString(w, `{"adapters":[{"adapter":"exec","runs_total":5,"succeeded":3,"failed":1,"cancelled":1,"running":0,"prompt_tokens":10,"completion_tokens":20,"total_tokens":30,"cost_usd":0.5}],
				"tunnels":[{"node":"`+id+`","key":"app","provider":"vllm","model":"qwen3","requests":4,"errors":1,"prompt_tokens":1200,"completion_tokens":300,"total_tokens":1500,"body_bytes":9000}]}`)
		case "transport_status":
			_, _ = io.WriteString(w, `{"connected":true,"connected_since":"2026-03-01T11:00:00Z","reconnects":2,"last_rtt_ms":1.25,"frames_in":10,"frames_out":12,"bytes_in":2048,"bytes_out":999,"runs_in_flight":1}`)
		case "session_list":
			mu.Lock()
			sessionArgs = append(sessionArgs, id+" "+string(body.Args))
			mu.Unlock()
			next := ""
			if !strings.Contains(string(body.Args), "cursor") {
				next = `,"next_cursor":"c-` + id + `"`
			}
			_, _ = io.WriteString(w, `{"sessions":[{"adapter":"llm","target":"qwen","session_id":"s1","turns":2,"last_used":"2026-03-01T11:58:00Z"}]`+next+`}`)
		default:
			w.WriteHeader(400)
			_, _ = io.WriteString(w, `{"error":{"code":"unknown_command","message":"unknown command"}}`)
		}
	})

	run(t, e.URL, "node", "caps", "n1").want(t, 0, ""+
		"NODE  VERSION  PLATFORM     HOSTNAME  CONFIG\n"+
		"n1    v1       linux/amd64  box-n1    v3\n"+
		"\n"+
		"NODE  ADAPTER  TYPE    RUNS  SESSIONS  COMMANDS\n"+
		"n1    exec     exec    1/4   no        -\n"+
		"n1    llm      ollama  0/2   yes       ollama.list,ollama.pull\n")
	r := run(t, e.URL, "node", "caps")
	if r.code != 0 || !strings.Contains(r.stdout, "box-n1") || !strings.Contains(r.stdout, "box-n2") {
		t.Fatalf("%+v", r)
	}
	run(t, e.URL, "node", "usage", "n1").want(t, 0, ""+
		"NODE  ADAPTER  RUNS  OK  FAILED  CANCELLED  RUNNING  PROMPT  COMPLETION  TOTAL  COST\n"+
		"n1    exec     5     3   1       1          0        10      20          30     $0.5000\n"+
		"\n"+
		"NODE  PROVIDER  MODEL  KEY  TUNNELS  ERRORS  PROMPT  COMPLETION  TOTAL  BYTES\n"+
		"n1    vllm      qwen3  app  4        1       1200    300         1500   9000\n")
	run(t, e.URL, "node", "transport", "n1").want(t, 0, ""+
		"NODE  CONNECTED  RECONNECTS  RTT    FRAMES IN/OUT  BYTES IN/OUT  RUNS\n"+
		"n1    1h ago     2           1.2ms  10/12          2.0 kB/999 B  1\n")
	r = run(t, e.URL, "node", "sessions", "n1", "--limit", "1", "--adapter", "llm")
	r.want(t, 0, ""+
		"NODE  ADAPTER  TARGET  SESSION  TURNS  LAST USED\n"+
		"n1    llm      qwen    s1       2      2m ago\n")
	if r.stderr != "more sessions on node n1: iop node sessions n1 --adapter llm --limit 1 --cursor c-n1\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
	r = run(t, e.URL, "node", "sessions", "n1", "--cursor", "c-n1")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("%+v", r)
	}
	// A node that predates the adapter filter lists every adapter's
	// sessions (this fake ignores it too): only the asked one's print.
	if r = run(t, e.URL, "node", "sessions", "n1", "--adapter", "exec"); r.code != 0 || strings.Contains(r.stdout, "s1") || !strings.Contains(r.stderr, "no sessions") {
		t.Fatalf("another adapter's session printed: %+v", r)
	}
	if r = run(t, e.URL, "node", "sessions", "--cursor", "c-n1"); r.code != 2 || !strings.Contains(r.stderr, "name the NODE") {
		t.Fatalf("--cursor without NODE: %+v", r)
	}
	mu.Lock()
	if want := []string{`n1 {"adapter":"llm","limit":1}`, `n1 {"cursor":"c-n1"}`, `n1 {"adapter":"exec"}`}; !slices.Equal(sessionArgs, want) {
		t.Errorf("session_list args %q, want %q", sessionArgs, want)
	}
	mu.Unlock()
	r = run(t, e.URL, "node", "caps", "n1", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"hostname": "box-n1"`) {
		t.Fatalf("%+v", r)
	}
	r = run(t, e.URL, "node", "usage", "--json")
	var all map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &all) != nil || all["n1"] == nil || all["n2"] == nil {
		t.Fatalf("%+v", r)
	}
}

func TestNodeExec(t *testing.T) {
	e := newFakeEdge(t)
	e.sse("POST /v1/nodes/n1/commands", nil,
		"progress", `{"step":1}`,
		"result", `{"ok":true}`)
	r := run(t, e.URL, "node", "exec", "n1", "anything", `{"x":1}`)
	r.want(t, 0, "{\n  \"ok\": true\n}\n")
	if r.stderr != `{"step":1}`+"\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
	if body := e.last().body; body != `{"args":{"x":1},"command":"anything"}` {
		t.Fatalf("body %s", body)
	}
	e2 := newFakeEdge(t)
	e2.json("POST /v1/nodes/n1/commands", 400, `{"error":{"code":"unknown_command","message":"unknown command \"x\""}}`)
	r = run(t, e2.URL, "node", "exec", "n1", "x")
	if r.code != 1 || r.stderr != "iop: unknown command \"x\" (unknown_command)\n" {
		t.Fatalf("%+v", r)
	}
}

// A key the edge refuses for node commands is refused for every node:
// iop node caps without NODE says so once and stops, not a warning per
// node and then "no node answered".
func TestNodeReportKeyRefused(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"n1","connected":true,"adapters":[]},{"id":"n2","connected":true,"adapters":[]}]}`)
	forbidden := `{"error":{"code":"forbidden","message":"API key \"rd\" lacks the \"admin\" scope"}}`
	e.json("POST /v1/nodes/n1/commands", 403, forbidden)
	e.json("POST /v1/nodes/n2/commands", 403, forbidden)
	r := run(t, e.URL, "node", "caps")
	r.want(t, 1, "")
	if r.stderr != "iop: the API key is not allowed to do this: API key \"rd\" lacks the \"admin\" scope (forbidden)\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
	if p := e.last().path; p != "/v1/nodes/n1/commands" {
		t.Fatalf("last request %s: asked on after the key was refused", p)
	}
}

func TestOllamaPull(t *testing.T) {
	e := newFakeEdge(t)
	// gpu2 is offline, so gpu is the only ollama node to ask.
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"gpu","adapters":[{"name":"llm","type":"ollama"}]},{"id":"cpu","adapters":[]},
		{"id":"gpu2","connected":false,"adapters":[{"name":"llm","type":"ollama"}]}]}`)
	e.sse("POST /v1/nodes/gpu/commands", nil,
		"progress", `{"status":"pulling manifest"}`,
		"progress", `{"status":"pulling abc","digest":"sha256:abc","total":1000,"completed":0}`,
		"progress", `{"status":"pulling abc","digest":"sha256:abc","total":1000,"completed":500}`,
		"progress", `{"status":"pulling abc","digest":"sha256:abc","total":1000,"completed":550}`,
		"progress", `{"status":"pulling abc","digest":"sha256:abc","total":1000,"completed":1000}`,
		"progress", `{"status":"pulling def","digest":"sha256:def","total":2000000,"completed":2000000}`,
		"progress", `{"status":"verifying sha256 digest"}`,
		"progress", `{"status":"success"}`,
		"result", `{"status":"success"}`)

	// Not a terminal: status lines and percentages.
	r := run(t, e.URL, "ollama", "pull", "qwen3")
	r.want(t, 0, ""+
		"pulling manifest\n"+
		"pulling abc: 0% (0 B/1.0 kB)\n"+
		"pulling abc: 50% (500 B/1.0 kB)\n"+
		"pulling abc: 100% (1.0 kB/1.0 kB)\n"+
		"pulling def: 100% (2.0 MB/2.0 MB)\n"+
		"verifying sha256 digest\n"+
		"success\n"+
		"pulled qwen3 on node gpu\n")
	req := e.last()
	if req.accept != "text/event-stream" || req.body != `{"args":{"model":"qwen3"},"command":"ollama.pull"}` {
		t.Fatalf("request %+v", req)
	}

	// A terminal: progress bars with bytes and percentage.
	r = cli(t, context.Background(), e.URL, []cliOpt{withTTY(false, true, false)}, "ollama", "pull", "qwen3", "--adapter", "llm")
	if r.code != 0 || !strings.Contains(r.stdout, "100%") || !strings.Contains(r.stdout, "pulling abc") || !strings.Contains(r.stdout, "MB") ||
		!strings.Contains(r.stdout, "pulled qwen3 on node gpu\n") {
		t.Fatalf("%+v", r)
	}
	if !strings.Contains(e.last().body, `"adapter":"llm"`) {
		t.Fatalf("body %s", e.last().body)
	}
}

// A node's counts past the layer's total, below zero, or of a total past
// 2^63/100 bytes are shown as 0–100%, piped as on a terminal: they printed
// "150%", "-5%" and, of 4.6 EB, "-2%".
func TestOllamaPullPercentBounds(t *testing.T) {
	e := newFakeEdge(t)
	e.sse("POST /v1/nodes/gpu/commands", nil,
		"progress", `{"status":"pulling neg","digest":"sha256:neg","total":1000,"completed":-50}`,
		"progress", `{"status":"pulling over","digest":"sha256:over","total":1000,"completed":500}`,
		"progress", `{"status":"pulling over","digest":"sha256:over","total":1000,"completed":1500}`,
		"progress", `{"status":"pulling over","digest":"sha256:over","total":1000,"completed":2000}`,
		"progress", `{"status":"pulling big","digest":"sha256:big","total":4611686018427387904,"completed":2305843009213693952}`,
		"progress", `{"status":"pulling big","digest":"sha256:big","total":4611686018427387904,"completed":4611686018427387904}`,
		"progress", `{"status":"success"}`,
		"result", `{"status":"success"}`)
	r := run(t, e.URL, "ollama", "pull", "m", "--node", "gpu")
	r.want(t, 0, ""+
		"pulling neg: 0% (0 B/1.0 kB)\n"+
		"pulling over: 50% (500 B/1.0 kB)\n"+
		"pulling over: 100% (1.0 kB/1.0 kB)\n"+
		"pulling big: 50% (2.3 EB/4.6 EB)\n"+
		"pulling big: 100% (4.6 EB/4.6 EB)\n"+
		"success\n"+
		"pulled m on node gpu\n")
}

func TestOllamaPullFails(t *testing.T) {
	e := newFakeEdge(t)
	e.sse("POST /v1/nodes/gpu/commands", nil,
		"progress", `{"status":"pulling manifest"}`,
		"error", `{"error":{"code":"provider_error","message":"pull model manifest: file does not exist"}}`)
	r := run(t, e.URL, "ollama", "pull", "nope", "--node", "gpu")
	r.want(t, 1, "pulling manifest\n")
	if r.stderr != "iop: pull model manifest: file does not exist (provider_error)\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
}

func TestOllamaNodeChoice(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"a","adapters":[{"name":"o","type":"ollama"}]},{"id":"b","adapters":[{"name":"o","type":"ollama"}]}]}`)
	r := run(t, e.URL, "ollama", "list")
	if r.code != 2 || !strings.Contains(r.stderr, "name one with --node") {
		t.Fatalf("%+v", r)
	}
}

func TestOllamaReports(t *testing.T) {
	e := newFakeEdge(t)
	e.mux.HandleFunc("POST /v1/nodes/n1/commands", func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Command string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		w.Header().Set("Content-Type", "application/json")
		switch body.Command {
		case "ollama.list":
			_, _ = io.WriteString(w, `{"models":[{"name":"qwen3:8b","size":5200000000,"modified_at":"2026-02-28T12:00:00Z"}]}`)
		case "ollama.ps":
			_, _ = io.WriteString(w, `{"models":[{"name":"qwen3:8b","size":6000000000,"size_vram":6000000000,"expires_at":"2026-03-01T12:05:00Z"}]}`)
		case "ollama.show":
			_, _ = io.WriteString(w, `{"details":{"format":"gguf","family":"qwen3","parameter_size":"8.2B","quantization_level":"Q4_K_M"},"capabilities":["completion","thinking"]}`)
		case "ollama.delete":
			_, _ = io.WriteString(w, `{}`)
		case "ollama.version":
			_, _ = io.WriteString(w, `{"version":"0.5.1"}`)
		}
	})
	run(t, e.URL, "ollama", "list", "--node", "n1").want(t, 0, ""+
		"NAME      SIZE    MODIFIED\n"+
		"qwen3:8b  5.2 GB  24h ago\n")
	run(t, e.URL, "ollama", "ps", "--node", "n1").want(t, 0, ""+
		"NAME      SIZE    VRAM    UNTIL\n"+
		"qwen3:8b  6.0 GB  6.0 GB  2026-03-01 12:05:00\n")
	run(t, e.URL, "ollama", "show", "qwen3:8b", "--node", "n1").want(t, 0, ""+
		"model:         qwen3:8b\n"+
		"family:        qwen3\n"+
		"parameters:    8.2B\n"+
		"quantization:  Q4_K_M\n"+
		"format:        gguf\n"+
		"capabilities:  completion, thinking\n")
	if body := e.last().body; body != `{"args":{"model":"qwen3:8b"},"command":"ollama.show"}` {
		t.Fatalf("body %s", body)
	}
	run(t, e.URL, "ollama", "delete", "qwen3:8b", "--node", "n1").want(t, 0, "deleted qwen3:8b on node n1\n")
	run(t, e.URL, "ollama", "version", "--node", "n1").want(t, 0, "ollama 0.5.1 on node n1\n")
}

func TestReload(t *testing.T) {
	e := newFakeEdge(t)
	e.json("POST /v1/admin/reload", 200, `{"nodes":2,"refreshed":["a"],"disconnected":[],"unchanged":["b"]}`)
	run(t, e.URL, "reload").want(t, 0, "config reloaded: 2 node(s) configured\n  refreshed: a\n  unchanged: b\n")
	// Changes outside nodes[] are named, and the nodes still applied (0).
	e3 := newFakeEdge(t)
	e3.json("POST /v1/admin/reload", 200, `{"nodes":1,"refreshed":[],"disconnected":[],"unchanged":["a"],"needs_restart":["http.api_keys","transport.max_frame_size"]}`)
	run(t, e3.URL, "reload").want(t, 0, "config reloaded: 1 node(s) configured\n  unchanged: a\n"+
		"note: these changes take effect after a restart of the edge: http.api_keys, transport.max_frame_size\n")
	e2 := newFakeEdge(t)
	e2.json("POST /v1/admin/reload", 422, `{"error":{"code":"config_error","message":"edge.yaml: line 4: field bogus not found"}}`)
	r := run(t, e2.URL, "reload")
	if r.code != 1 || r.stderr != "iop: edge.yaml: line 4: field bogus not found (config_error)\n" {
		t.Fatalf("%+v", r)
	}
	// A file with several problems: one line each, as iop-edge prints
	// them, not one line with "\n" in it; each line still escaped.
	e4 := newFakeEdge(t)
	e4.json("POST /v1/admin/reload", 422, `{"error":{"code":"config_error","message":"edge.yaml: line 2: nodes[0] (id \"a\"): token must be at least 8 characters\nedge.yaml: line 3: nodes[1] (id \"b\u001b[2J\"): adapter \"x\" has no type"}}`)
	r = run(t, e4.URL, "reload")
	if want := "iop: edge.yaml: line 2: nodes[0] (id \"a\"): token must be at least 8 characters\n" +
		"iop: edge.yaml: line 3: nodes[1] (id \"b\\x1b[2J\"): adapter \"x\" has no type (config_error)\n"; r.code != 1 || r.stderr != want || r.stdout != "" {
		t.Fatalf("reload of a file with two problems: %+v\nwant stderr:\n%s", r, want)
	}
}

func TestBuildOptions(t *testing.T) {
	got, err := buildOptions(`{"a":{"b":1}}`, []string{"n=5", "s=hello world", "j={\"x\":[1]}", "e="})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != `{"a":{"b":1},"e":"","j":{"x":[1]},"n":5,"s":"hello world"}` {
		t.Fatalf("options %s", got)
	}
	if got, err := buildOptions("", nil); err != nil || got != nil {
		t.Fatalf("empty: %s %v", got, err)
	}
}

// Ctrl-C during a report over every node is an interruption (130), not a
// success with a warning per node; and a report that no node could answer
// is an error (1).
func TestNodeReportsInterruptedOrAllFailed(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"n1","adapters":[]},{"id":"n2","adapters":[]}]}`)
	asked := make(chan struct{}, 4)
	e.mux.HandleFunc("POST /v1/nodes/{id}/commands", func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Command string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		if body.Command == "capabilities" {
			asked <- struct{}{}
			<-r.Context().Done() // a slow node: the user presses Ctrl-C
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(503)
		_, _ = io.WriteString(w, `{"error":{"code":"node_disconnected","message":"gone"}}`)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-asked
		cancel()
	}()
	done := make(chan result, 1)
	go func() { done <- cli(t, ctx, e.URL, nil, "node", "caps") }()
	select {
	case r := <-done:
		if r.code != 130 {
			t.Fatalf("interrupted report: exit %d, stdout %q, stderr %q; want 130", r.code, r.stdout, r.stderr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("interrupted report did not end")
	}

	r := run(t, e.URL, "node", "usage")
	if r.code != 1 || !strings.Contains(r.stderr, "gone") {
		t.Fatalf("every node failed: exit %d, stdout %q, stderr %q; want 1", r.code, r.stdout, r.stderr)
	}
}

// A run started in the background and a streamed node command (node exec,
// ollama pull) answered with a plain body that stalls after the headers, or
// drips a byte at a time, end with exit 1: the body may be silent for
// client.StreamIdleTimeout, and takes client.CallTimeout at most. Both hung
// until interrupted.
func TestStalledPlainAnswersToStreamsEnd(t *testing.T) {
	defer func(idle, call time.Duration) { client.StreamIdleTimeout, client.CallTimeout = idle, call }(client.StreamIdleTimeout, client.CallTimeout)
	client.StreamIdleTimeout, client.CallTimeout = 200*time.Millisecond, 600*time.Millisecond
	stall := func(status int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, `{"run_id":`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	}
	drip := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				_, _ = io.WriteString(w, " ")
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
		}
	}
	stalled := newFakeEdge(t)
	stalled.mux.HandleFunc("POST /v1/runs", stall(http.StatusAccepted))
	stalled.mux.HandleFunc("POST /v1/nodes/n1/commands", stall(http.StatusOK))
	dripping := newFakeEdge(t)
	dripping.mux.HandleFunc("POST /v1/runs", drip)
	dripping.mux.HandleFunc("POST /v1/nodes/n1/commands", drip)
	for _, c := range []struct {
		edge, want string
		args       []string
	}{
		{stalled.URL, "iop: read run answer: no data from the edge for 200ms", []string{"run", "--adapter", "exec", "--background", "x"}},
		{stalled.URL, "iop: read command result: no data from the edge for 200ms", []string{"node", "exec", "n1", "x"}},
		{stalled.URL, "iop: read command result: no data from the edge for 200ms", []string{"ollama", "pull", "m", "--node", "n1"}},
		{dripping.URL, "iop: the edge at " + dripping.URL + " did not answer within 600ms\n", []string{"run", "--adapter", "exec", "--background", "x"}},
		{dripping.URL, "iop: the edge at " + dripping.URL + " did not answer within 600ms\n", []string{"node", "exec", "n1", "x"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r := cli(t, ctx, c.edge, nil, c.args...)
		cancel()
		if r.code != 1 || !strings.HasPrefix(r.stderr, c.want) {
			t.Errorf("iop %q: exit %d, stderr %q; want exit 1, %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

// A success that is not the edge's answer (a proxy's or another server's)
// is an error, not a success with empty fields: a foreground run answered
// "200 {}" is not a background run, a 202 without a run id is not one
// either, and "200 {}" is neither a cancel nor a run.
func TestSuccessThatIsNotTheEdgesAnswer(t *testing.T) {
	e := newFakeEdge(t)
	e.json("POST /v1/runs", 200, `{}`)
	e.json("POST /v1/runs/run_1/cancel", 200, `{}`)
	e.json("GET /v1/runs/run_1", 200, `{"run_id":""}`)
	e2 := newFakeEdge(t)
	e2.json("POST /v1/runs", 202, `{"node":"n1"}`)
	for _, c := range []struct {
		edge, path, ct, body string
		status               int
		args                 []string
	}{
		{e.URL, "/v1/runs", "application/json", `: "{}"`, 200, []string{"run", "--adapter", "exec", "x"}},
		{e.URL, "/v1/runs", "application/json", `: "{}"`, 200, []string{"run", "--adapter", "exec", "--background", "x"}},
		{e2.URL, "/v1/runs", "application/json", `: "{\"node\":\"n1\"}"`, 202, []string{"run", "--adapter", "exec", "--background", "x"}},
		{e.URL, "/v1/runs/run_1/cancel", "application/json", `: "{}"`, 200, []string{"cancel", "run_1"}},
		{e.URL, "/v1/runs/run_1/cancel", "application/json", `: "{}"`, 200, []string{"cancel", "--json", "run_1"}},
		{e.URL, "/v1/runs/run_1", "application/json", `: "{\"run_id\":\"\"}"`, 200, []string{"run-get", "run_1"}},
	} {
		r := run(t, c.edge, c.args...)
		want := fmt.Sprintf("iop: HTTP %d from %s%s: not an iop edge answer (%s)%s\n", c.status, c.edge, c.path, c.ct, c.body)
		if r.code != 1 || r.stdout != "" || r.stderr != want {
			t.Errorf("iop %q: exit %d, stdout %q, stderr %q; want exit 1, %q", c.args, r.code, r.stdout, r.stderr, want)
		}
	}
}

// An API key that cannot go in an HTTP header (a pasted key with a line
// break, a control character) is a usage error that does not show the key;
// it read "cannot reach the edge", and nothing was sent.
func TestAPIKeyWithAControlCharacter(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[]}`)
	for _, key := range []string{"sk-sec\nret", "sk-sec\r\nret", "sk-secret\x00", "sk-\x1b[2Jsecret", "sk-secret\x7f"} {
		for _, viaEnv := range []bool{false, true} {
			args := []string{"--api-key", key, "nodes"}
			opts := []cliOpt(nil)
			if viaEnv {
				args = []string{"nodes"}
				opts = []cliOpt{func(a *app) {
					a.getenv = func(k string) string {
						switch k {
						case "IOP_EDGE":
							return e.URL
						case "IOP_API_KEY":
							return key
						}
						return ""
					}
				}}
			}
			r := cli(t, context.Background(), e.URL, opts, args...)
			if r.code != 2 || !strings.HasPrefix(r.stderr, "iop: the API key holds a character not allowed in an HTTP header\n") || strings.Contains(r.stderr, "secret") {
				t.Errorf("key %q (env %v): exit %d, stderr %q", key, viaEnv, r.code, r.stderr)
			}
		}
	}
	e.mu.Lock()
	sent := len(e.reqs)
	e.mu.Unlock()
	if sent != 0 {
		t.Fatalf("%d requests were sent", sent)
	}
	// A tab, or bytes past ASCII, may be in a header value; space around
	// the key (a line break after it in a file) is trimmed.
	for _, key := range []string{"sk-tab\tkey-é", "sk-key\n"} {
		if r := run(t, e.URL, "--api-key", key, "nodes"); r.code != 0 {
			t.Fatalf("key %q: %+v", key, r)
		}
	}
}

// An edge URL ending in more than one slash works: each request's path
// started with "//", which the edge's mux redirected.
func TestEdgeURLWithTrailingSlashes(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[]}`)
	for _, edge := range []string{e.URL + "/", e.URL + "//", e.URL + "///"} {
		r := cli(t, context.Background(), "", nil, "--edge", edge, "nodes")
		if r.code != 0 || e.last().path != "/v1/nodes" {
			t.Errorf("--edge %s: %+v, path %q", edge, r, e.last().path)
		}
	}
}

// A success whose body is not JSON at all (a proxy's "200 OK" login page)
// is not the edge's answer. A node command's result was printed as it
// came, escapes and all, with exit 0 ("iop ollama delete" said "deleted");
// the other calls failed with "decode answer from …: invalid character".
func TestSuccessThatIsNotJSON(t *testing.T) {
	e := newFakeEdge(t)
	page := "<html>\x1b]0;owned\x07Sign in</html>"
	for _, p := range []string{"GET /v1/runs", "GET /v1/usage", "POST /v1/admin/reload", "DELETE /v1/sessions/s1", "POST /v1/nodes/n1/commands"} {
		e.mux.HandleFunc(p, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, page)
		})
	}
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"n1","adapters":[]}]}`)
	quoted := `: "<html>\x1b]0;owned\aSign in</html>"`
	for _, c := range []struct {
		path string
		args []string
	}{
		{"/v1/runs", []string{"runs", "--json"}},
		{"/v1/usage?group_by=key", []string{"usage"}},
		{"/v1/admin/reload", []string{"reload", "--json"}},
		{"/v1/sessions/s1?adapter=a", []string{"session", "end", "s1", "--adapter", "a"}},
		{"/v1/nodes/n1/commands", []string{"node", "exec", "n1", "x"}},
		{"/v1/nodes/n1/commands", []string{"node", "caps", "n1", "--json"}},
		{"/v1/nodes/n1/commands", []string{"ollama", "list", "--json"}},
		{"/v1/nodes/n1/commands", []string{"ollama", "delete", "m"}},
	} {
		r := run(t, e.URL, c.args...)
		want := fmt.Sprintf("iop: HTTP 200 from %s%s: not an iop edge answer (text/html)%s\n", e.URL, c.path, quoted)
		if r.code != 1 || r.stdout != "" || r.stderr != want {
			t.Errorf("iop %q: exit %d, stdout %q, stderr %q; want exit 1, %q", c.args, r.code, r.stdout, r.stderr, want)
		}
	}
	// A streamed command whose result event is not JSON.
	e2 := newFakeEdge(t)
	e2.sse("POST /v1/nodes/n1/commands", nil, "result", "<b>\x1b[2Jdone</b>")
	r := run(t, e2.URL, "node", "exec", "n1", "x")
	want := "iop: the command's result is not JSON (not an iop edge's answer): \"<b>\\x1b[2Jdone</b>\"\n"
	if r.code != 1 || r.stdout != "" || r.stderr != want {
		t.Errorf("streamed result: exit %d, stdout %q, stderr %q; want exit 1, %q", r.code, r.stdout, r.stderr, want)
	}
}

// Another server's event stream (no X-IOP-Run-ID, which the edge sends
// with every run stream) is not taken for a run: it printed "run : decode
// message event: …".
func TestRunStreamThatIsNotTheEdges(t *testing.T) {
	e := newFakeEdge(t)
	e.sse("POST /v1/runs", nil, "message", `data: {"choices":[{"delta":{"content":"hi"}}]}`)
	r := run(t, e.URL, "run", "--adapter", "exec", "x")
	want := fmt.Sprintf("iop: HTTP 200 from %s/v1/runs: not an iop edge answer (text/event-stream): an event stream without the X-IOP-Run-ID header every run stream carries\n", e.URL)
	if r.code != 1 || r.stdout != "" || r.stderr != want {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 1, %q", r.code, r.stdout, r.stderr, want)
	}
}

// Of several nodes, one whose result does not decode (a node of another
// version) is a warning, as a node that does not answer is: it failed the
// whole report and the other nodes' rows were lost.
func TestNodeReportWithOneUnreadableResult(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"n1","adapters":[]},{"id":"n2","adapters":[]}]}`)
	e.json("POST /v1/nodes/n1/commands", 200, `{"version":"v1","os":"linux","arch":"amd64","hostname":"box-n1","config_version":3}`)
	e.json("POST /v1/nodes/n2/commands", 200, `{"version":2,"hostname":"box-n2"}`)
	r := run(t, e.URL, "node", "caps")
	r.want(t, 0, ""+
		"NODE  VERSION  PLATFORM     HOSTNAME  CONFIG\n"+
		"n1    v1       linux/amd64  box-n1    v3\n")
	if !strings.HasPrefix(r.stderr, "iop: warning: node n2: decode result: ") {
		t.Fatalf("stderr %q", r.stderr)
	}
	// Named alone, that node's result is the error.
	r = run(t, e.URL, "node", "caps", "n2")
	if r.code != 1 || r.stdout != "" || !strings.HasPrefix(r.stderr, "iop: node n2: decode result: ") {
		t.Fatalf("one node: %+v", r)
	}
	// Every node's unreadable: an error, not an empty table.
	e2 := newFakeEdge(t)
	e2.json("GET /v1/nodes", 200, `{"nodes":[{"id":"n1","adapters":[]},{"id":"n2","adapters":[]}]}`)
	e2.json("POST /v1/nodes/{id}/commands", 200, `{"adapters":"none"}`)
	r = run(t, e2.URL, "node", "usage")
	if r.code != 1 || r.stdout != "" || !strings.HasSuffix(r.stderr, "iop: no node's result could be read (2 answered)\n") {
		t.Fatalf("all unreadable: %+v", r)
	}
}

// A CA file that cannot be used is named as it was given: $IOP_CA_FILE's
// was reported as a --ca-file the command line did not hold.
func TestCAFileNamedAsGiven(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(v string) cliOpt {
		return func(a *app) {
			get := a.getenv
			a.getenv = func(k string) string {
				if k == "IOP_CA_FILE" {
					return v
				}
				return get(k)
			}
		}
	}
	for _, c := range []struct {
		opts []cliOpt
		args []string
		want string
	}{
		{[]cliOpt{env(missing)}, []string{"nodes"}, "iop: IOP_CA_FILE: open " + missing + ": no such file or directory\n"},
		{[]cliOpt{env(notPEM)}, []string{"nodes"}, "iop: IOP_CA_FILE " + notPEM + " holds no PEM certificate\n"},
		{nil, []string{"--ca-file", missing, "nodes"}, "iop: --ca-file: open " + missing + ": no such file or directory\n"},
		{[]cliOpt{env(missing)}, []string{"--ca-file", notPEM, "nodes"}, "iop: --ca-file " + notPEM + " holds no PEM certificate\n"},
	} {
		r := cli(t, context.Background(), "http://127.0.0.1:1", c.opts, c.args...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, c.want) {
			t.Errorf("iop %q: exit %d, stderr %q; want exit 2, %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

// An error object without a code is not the edge's (it always sends one):
// an OpenAI-shaped proxy's 401 read "the edge refused the API key: Invalid
// API key ()".
func TestErrorObjectWithoutACodeIsNotTheEdges(t *testing.T) {
	for _, body := range []string{
		`{"error":{"message":"Invalid API key","type":"invalid_request_error","code":null}}`,
		// Ollama's shape, which the edge writes only on its /api routes.
		`{"error":"Unauthorized"}`,
	} {
		e := newFakeEdge(t)
		e.json("GET /v1/nodes", 401, body)
		r := run(t, e.URL, "nodes")
		want := fmt.Sprintf("iop: HTTP 401 from %s/v1/nodes: not an iop edge answer (application/json): %q\n", e.URL, body)
		if r.code != 1 || r.stdout != "" || r.stderr != want {
			t.Errorf("%s: exit %d, stderr %q; want exit 1, %q", body, r.code, r.stderr, want)
		}
	}
}

// A command group's one-line help names its subcommands, as they are
// spelt: "iop node" offered "capabilities" and "raw", which were "caps"
// and "exec", and typing them was an unknown command.
func TestGroupHelpNamesItsSubcommands(t *testing.T) {
	a := &app{getenv: func(string) string { return "" }}
	var groups int
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		lp, rp := strings.LastIndex(c.Short, "("), strings.LastIndex(c.Short, ")")
		if c.HasAvailableSubCommands() && c.HasParent() && lp >= 0 && rp > lp {
			groups++
			listed := strings.Split(c.Short[lp+1:rp], ", ")
			var subs []string
			for _, sub := range c.Commands() {
				if sub.IsAvailableCommand() {
					subs = append(subs, sub.Name())
				}
			}
			slices.Sort(listed)
			if !slices.Equal(listed, subs) {
				t.Errorf("iop %s: its help lists %v, its subcommands are %v", c.Name(), listed, subs)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(a.rootCmd())
	if groups < 2 {
		t.Fatalf("found %d command groups listing their subcommands, want node and ollama at least", groups)
	}
}

// With no node connected, a report over every node has nothing to ask: it
// said "no nodes answered", as if nodes had been asked and failed, where
// "iop run" says no node is connected. The empty report is no error.
func TestNodeReportWithoutConnectedNodes(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[{"id":"n1","connected":false,"adapters":[],"providers":[]}]}`)
	for _, report := range []string{"caps", "transport", "usage", "sessions", "runs"} {
		r := run(t, e.URL, "node", report)
		r.want(t, 0, "")
		if r.stderr != "no node is connected\n" {
			t.Errorf("node %s: stderr %q", report, r.stderr)
		}
	}
	for _, rq := range e.reqs {
		if rq.path != "/v1/nodes" {
			t.Fatalf("a node command was sent: %+v", rq)
		}
	}
}

// A global flag given empty ("--api-key \"$APP_KEY\"" with APP_KEY unset)
// is a usage error, as an empty filter is: it fell back to $IOP_API_KEY
// (another key, an admin's), $IOP_EDGE or the local default edge, and the
// command went there without a word.
func TestEmptyGlobalFlagsAreUsageErrors(t *testing.T) {
	e := newFakeEdge(t)
	e.json("GET /v1/nodes", 200, `{"nodes":[]}`)
	for _, c := range []struct {
		args  []string
		unset string
	}{
		{[]string{"--edge", "", "nodes"}, "$IOP_EDGE, else http://127.0.0.1:7701"},
		{[]string{"nodes", "--api-key", ""}, "$IOP_API_KEY"},
		{[]string{"--api-key", " ", "run", "--adapter", "exec", "x"}, "$IOP_API_KEY"},
		{[]string{"node", "caps", "--ca-file", ""}, "$IOP_CA_FILE, else the system's CAs"},
	} {
		adminKey := func(a *app) {
			a.getenv = func(k string) string {
				return map[string]string{"IOP_EDGE": e.URL, "IOP_API_KEY": "admin-key"}[k]
			}
		}
		r := cli(t, context.Background(), e.URL, []cliOpt{adminKey}, c.args...)
		flag := c.args[slices.IndexFunc(c.args, func(a string) bool { return strings.TrimSpace(a) == "" })-1]
		want := "iop: " + flag + " must not be empty (leave it out for " + c.unset + ")\n"
		if r.code != 2 || !strings.HasPrefix(r.stderr, want) {
			t.Errorf("%q: exit %d, stderr %q; want 2, %q", c.args, r.code, r.stderr, want)
		}
	}
	e.mu.Lock()
	n := len(e.reqs)
	e.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d requests with an empty global flag reached the edge", n)
	}
	// Left out, each is its variable or default, as before.
	if r := run(t, e.URL, "nodes"); r.code != 0 {
		t.Fatalf("nodes: %+v", r)
	}
}
