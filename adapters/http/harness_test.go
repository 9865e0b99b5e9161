package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/adapters/eventbus"
	httpapi "iop/adapters/http"
	"iop/application/edge"
	"iop/domain"
	"iop/ports"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeLink is a node: every run it starts replays script (with the run id
// and sequence numbers filled in), then ends with endErr if set, or waits
// for a cancel when the script has no terminal event.
type fakeLink struct {
	script       []domain.RunEvent
	endErr       error
	startErr     error
	terminateErr error
	// kept, if set, are the "adapter/session"s the node keeps: ending one
	// forgets it, ending any other is session_not_found.
	kept    map[string]bool
	command func(ctx context.Context, name string, args []byte) (ports.CommandStream, error)

	mu         sync.Mutex
	runs       map[string]*fakeRunStream
	reqs       []domain.RunRequest
	cancels    []string
	reasons    []string // each cancel's reason, as cancels
	terminated []string
	cancelled  chan string
}

func newFakeLink(script ...domain.RunEvent) *fakeLink {
	return &fakeLink{script: script, runs: map[string]*fakeRunStream{}, cancelled: make(chan string, 16)}
}

type runItem struct {
	ev  domain.RunEvent
	err error
}

type fakeRunStream struct {
	ch     chan runItem
	closed chan struct{}
	once   sync.Once
	seq    uint64 // guarded by fakeLink.mu
	ended  bool   // a terminal event is queued; guarded by fakeLink.mu
	failed error  // the failure Recv returned (its consumer's only)
}

// Recv behaves like the transport's run streams (see ports.RunStream):
// what is queued comes first, even for a done ctx, and a failure is not
// used up by a Recv with a done ctx (here: it is returned from then on).
func (s *fakeRunStream) Recv(ctx context.Context) (domain.RunEvent, error) {
	if s.failed != nil {
		return domain.RunEvent{}, s.failed
	}
	select {
	case it := <-s.ch:
		s.failed = it.err
		return it.ev, it.err
	default:
	}
	select {
	case it := <-s.ch:
		s.failed = it.err
		return it.ev, it.err
	case <-ctx.Done():
		return domain.RunEvent{}, ctx.Err()
	case <-s.closed:
		return domain.RunEvent{}, domain.Errorf(domain.CodeStreamReset, "closed")
	}
}

func (s *fakeRunStream) Close() { s.once.Do(func() { close(s.closed) }) }

func (l *fakeLink) StartRun(_ context.Context, req domain.RunRequest) (ports.RunStream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.startErr != nil {
		return nil, l.startErr
	}
	s := &fakeRunStream{ch: make(chan runItem, 64), closed: make(chan struct{})}
	for _, ev := range l.script {
		s.seq++
		ev.RunID, ev.Seq = req.RunID, s.seq
		s.ch <- runItem{ev: ev}
		s.ended = s.ended || ev.Type.Terminal()
	}
	if l.endErr != nil {
		s.ch <- runItem{err: l.endErr}
		s.ended = true
	}
	l.runs[req.RunID] = s
	l.reqs = append(l.reqs, req)
	return s, nil
}

func (l *fakeLink) CancelRun(_ context.Context, runID, reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancels = append(l.cancels, runID)
	l.reasons = append(l.reasons, reason)
	s, ok := l.runs[runID]
	switch {
	case !ok:
		return domain.Errorf(domain.CodeRunNotFound, "unknown run %s", runID)
	case s.ended:
		return domain.Errorf(domain.CodeRunFinished, "run %s has finished", runID)
	}
	s.seq++
	s.ended = true
	s.ch <- runItem{ev: domain.RunEvent{RunID: runID, Seq: s.seq, Type: domain.EventCancelled}}
	l.cancelled <- runID
	return nil
}

// push queues ev on a run the link started, as its node would send it
// later (with the run id and the next sequence number).
func (l *fakeLink) push(runID string, ev domain.RunEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.runs[runID]
	s.seq++
	ev.RunID, ev.Seq = runID, s.seq
	s.ended = s.ended || ev.Type.Terminal()
	s.ch <- runItem{ev: ev}
}

func (l *fakeLink) TerminateSession(_ context.Context, adapter, target, sessionID string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.terminated = append(l.terminated, adapter+"/"+target+"/"+sessionID)
	if l.kept != nil {
		if !l.kept[adapter+"/"+sessionID] {
			return domain.Errorf(domain.CodeSessionNotFound, "adapter %q has no session %q", adapter, sessionID)
		}
		delete(l.kept, adapter+"/"+sessionID)
	}
	return l.terminateErr
}

func (l *fakeLink) Command(ctx context.Context, name string, args []byte) (ports.CommandStream, error) {
	if l.command == nil {
		return &fakeCmdStream{replies: []ports.CommandReply{{Final: true, Err: domain.Errorf(domain.CodeUnknownCommand, "unknown command %q", name)}}}, nil
	}
	return l.command(ctx, name, args)
}

func (l *fakeLink) OpenTunnel(context.Context, domain.TunnelRequest, io.Reader) (ports.TunnelStream, error) {
	return nil, errors.New("no tunnels here")
}
func (l *fakeLink) PushConfig(context.Context, domain.NodeConfig) error { return nil }
func (l *fakeLink) Close(string)                                        {}

func (l *fakeLink) requests() []domain.RunRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

func (l *fakeLink) cancelCalls() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.cancels)
}

func (l *fakeLink) cancelReasons() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reasons)
}

func (l *fakeLink) terminateCalls() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.terminated)
}

// fakeCmdStream replays replies; with block set it then waits for ctx.
type fakeCmdStream struct {
	replies []ports.CommandReply
	block   bool
	i       int
}

func (s *fakeCmdStream) Recv(ctx context.Context) (ports.CommandReply, error) {
	if err := ctx.Err(); err != nil {
		return ports.CommandReply{}, err
	}
	if s.i < len(s.replies) {
		s.i++
		return s.replies[s.i-1], nil
	}
	if s.block {
		<-ctx.Done()
		return ports.CommandReply{}, ctx.Err()
	}
	return ports.CommandReply{}, io.EOF
}
func (s *fakeCmdStream) Close() {}

// env is an API server wired to real use cases, a real bus and fake nodes.
type env struct {
	t        *testing.T
	reg      *edge.Registry
	bus      *eventbus.Bus
	commands *edge.NodeCommandHandler
	api      *httpapi.Server
	srv      *httptest.Server
	reload   func(context.Context) (edge.ReloadResult, error)
	// dir is the edge's node directory (edge.yaml nodes[]); empty unless a
	// test configures nodes.
	dir *staticDir
	// Set by newEnvWithDeps' extra, before the server is built: listen is
	// the address the server takes itself to listen on (its Host checks
	// follow it; "127.0.0.1:0" if unset), log its logger, accessLog whether
	// it logs a line per request.
	listen    string
	log       *slog.Logger
	accessLog bool
}

// staticDir is a node directory holding records a test sets.
type staticDir struct {
	mu      sync.Mutex
	records []domain.NodeRecord
}

func (d *staticDir) set(recs ...domain.NodeRecord) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.records = recs
}

func (d *staticDir) Authenticate(string) (domain.NodeRecord, error) {
	return domain.NodeRecord{}, domain.ErrUnknownToken
}

func (d *staticDir) Records() []domain.NodeRecord {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.records)
}

type testNode struct {
	id   string
	link *fakeLink
}

func newEnv(t *testing.T, nodes ...testNode) *env {
	t.Helper()
	return newEnvWithKeys(t, nil, nodes...)
}

// newEnvWithKeys is newEnv on an edge with API keys.
func newEnvWithKeys(t *testing.T, keys []httpapi.APIKey, nodes ...testNode) *env {
	t.Helper()
	return newEnvWithDeps(t, keys, nil, nodes...)
}

// newEnvWithDeps is newEnvWithKeys with more dependencies: extra, if set,
// fills them in (from the env's registry) before the server is built.
func newEnvWithDeps(t *testing.T, keys []httpapi.APIKey, extra func(*env, *httpapi.Deps), nodes ...testNode) *env {
	t.Helper()
	e := &env{t: t, reg: edge.NewRegistry(), bus: eventbus.New(), dir: &staticDir{}}
	for _, n := range nodes {
		e.admit(n.id, n.link)
	}
	tracker := edge.NewRunTracker(0)
	submit := edge.NewSubmitRunHandler(e.reg, tracker, e.bus, nil)
	e.commands = edge.NewNodeCommandHandler(e.reg)
	deps := httpapi.Deps{
		Registry:  e.reg,
		Nodes:     edge.NewListNodesHandler(e.dir, e.reg),
		Submit:    submit,
		Cancel:    edge.NewCancelRunHandler(e.reg, tracker),
		Terminate: edge.NewTerminateSessionHandler(e.reg),
		Commands:  e.commands,
		GetRun:    edge.NewGetRunHandler(e.reg, tracker, e.commands),
		ListRuns:  edge.NewListRunsHandler(e.reg, e.commands),
		Events:    e.bus,
		APIKeys:   keys,
		Reload: func(ctx context.Context) (edge.ReloadResult, error) {
			if e.reload == nil {
				return edge.ReloadResult{}, errors.New("no reload scripted")
			}
			return e.reload(ctx)
		},
	}
	if extra != nil {
		extra(e, &deps)
	}
	if e.listen == "" {
		e.listen = "127.0.0.1:0"
	}
	e.api = httpapi.New(deps, e.listen, e.log)
	e.api.AccessLog = e.accessLog
	e.api.KeepAlive = 50 * time.Millisecond
	e.srv = httptest.NewServer(e.api.Handler())
	t.Cleanup(func() {
		e.srv.Close()
		submit.Stop()
		e.bus.Close()
	})
	return e
}

func (e *env) admit(id string, link *fakeLink) {
	e.t.Helper()
	cfg := domain.NodeConfig{NodeID: id, Version: 3, Adapters: []domain.AdapterConfig{
		{Name: "exec", Type: domain.AdapterExec, MaxConcurrency: 2},
		{Name: "llm", Type: domain.AdapterOllama, MaxConcurrency: 1, BaseURL: "http://x"},
	}, Providers: []domain.ProviderConfig{{Name: "ol", Type: domain.ProviderOllama, BaseURL: "http://x", APIKeyEnv: "SECRET_ENV", Models: []string{"qwen3"}}}}
	err := e.reg.Admit(&edge.LiveNode{
		ID: id, Link: link, Remote: "10.0.0.1:5555", ConnectedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Config: cfg,
		Info: domain.NodeInfo{Version: "v1.2.3", Hostname: "box-" + id, OS: "linux", Arch: "amd64"},
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) do(method, path, body string, header ...string) *http.Response {
	e.t.Helper()
	return e.doCtx(context.Background(), method, path, body, header...)
}

func (e *env) doCtx(ctx context.Context, method, path, body string, header ...string) *http.Response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// call sends a request and returns the answer's status and body.
func (e *env) call(method, path, body string, header ...string) (int, string) {
	e.t.Helper()
	resp := e.do(method, path, body, header...)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// readJSON decodes the body and checks the status.
func readJSON(t *testing.T, resp *http.Response, wantStatus int) map[string]any {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != wantStatus {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, wantStatus, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q; body %s", ct, b)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("body %s: %v", b, err)
	}
	return m
}

// wantError checks an error answer's status and code.
func wantError(t *testing.T, resp *http.Response, status int, code string) {
	t.Helper()
	m := readJSON(t, resp, status)
	e, _ := m["error"].(map[string]any)
	if e == nil || e["code"] != code || e["message"] == "" {
		t.Fatalf("error body %v, want code %s", m, code)
	}
}

// sseEvent is one parsed server-sent event.
type sseEvent struct {
	typ  string
	data string
}

func (ev sseEvent) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(ev.data), &m); err != nil {
		t.Fatalf("event %s data %q: %v", ev.typ, ev.data, err)
	}
	return m
}

// sseReader parses an event stream, remembering the comments it skips.
type sseReader struct {
	r        *bufio.Reader
	comments []string
}

func newSSE(body io.Reader) *sseReader { return &sseReader{r: bufio.NewReader(body)} }

func (s *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	var data []string
	seen := false
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if seen {
				ev.data = strings.Join(data, "\n")
				return ev, nil
			}
		case strings.HasPrefix(line, ":"):
			s.comments = append(s.comments, strings.TrimSpace(line[1:]))
		case strings.HasPrefix(line, "event: "):
			ev.typ, seen = line[len("event: "):], true
		case strings.HasPrefix(line, "data: "):
			data, seen = append(data, line[len("data: "):]), true
		default:
			return ev, errors.New("unexpected SSE line " + line)
		}
	}
}

// awaitComment reads the stream until the comment want arrives (a
// keep-alive, say), so a test acts once the server has sent it rather
// than after a guess at how long that takes. An event first is an error.
func (s *sseReader) awaitComment(want string) error {
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
		case strings.HasPrefix(line, ":"):
			c := strings.TrimSpace(line[1:])
			s.comments = append(s.comments, c)
			if c == want {
				return nil
			}
		default:
			return errors.New("unexpected SSE line before the comment: " + line)
		}
	}
}

// readAll reads events until the stream ends.
func (s *sseReader) readAll(t *testing.T) []sseEvent {
	t.Helper()
	var out []sseEvent
	for {
		ev, err := s.next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
