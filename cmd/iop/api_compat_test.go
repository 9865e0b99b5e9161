package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/adapters/eventbus"
	httpapi "iop/adapters/http"
	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// These tests run the CLI against the real edge HTTP API (with a fake
// node behind it), so the two cannot drift apart.

// echoLink is a node whose runs upper-case their input, and whose runs
// with target "hang" wait to be cancelled.
type echoLink struct {
	mu   sync.Mutex
	runs map[string]chan domain.RunEvent
}

func (l *echoLink) StartRun(_ context.Context, req domain.RunRequest) (ports.RunStream, error) {
	ch := make(chan domain.RunEvent, 8)
	ch <- domain.RunEvent{RunID: req.RunID, Seq: 1, Type: domain.EventStart}
	ch <- domain.RunEvent{RunID: req.RunID, Seq: 2, Type: domain.EventReasoningDelta, Text: "thinking"}
	ch <- domain.RunEvent{RunID: req.RunID, Seq: 3, Type: domain.EventDelta, Text: strings.ToUpper(string(req.Input))}
	if req.Target != "hang" {
		ch <- domain.RunEvent{RunID: req.RunID, Seq: 4, Type: domain.EventComplete, Usage: &domain.Usage{PromptTokens: 1, CompletionTokens: 2}}
	}
	l.mu.Lock()
	l.runs[req.RunID] = ch
	l.mu.Unlock()
	return &echoStream{ch: ch}, nil
}

func (l *echoLink) CancelRun(_ context.Context, runID, _ string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.runs[runID]
	if !ok {
		return domain.Errorf(domain.CodeRunNotFound, "unknown run %s", runID)
	}
	select {
	case ch <- domain.RunEvent{RunID: runID, Seq: 4, Type: domain.EventCancelled}:
	default:
	}
	return nil
}

func (l *echoLink) TerminateSession(context.Context, string, string, string) error {
	return domain.Errorf(domain.CodeSessionUnsupported, "adapter exec keeps no sessions")
}

func (l *echoLink) Command(_ context.Context, name string, _ []byte) (ports.CommandStream, error) {
	if name == "ollama.pull" {
		return &echoCmd{replies: []ports.CommandReply{
			{Progress: []byte(`{"status":"pulling manifest"}`)},
			{Progress: []byte(`{"status":"pulling abc","digest":"sha256:abc","total":100,"completed":100}`)},
			{Final: true, Result: []byte(`{"status":"success"}`)},
		}}, nil
	}
	return &echoCmd{replies: []ports.CommandReply{{Final: true, Err: domain.Errorf(domain.CodeUnknownCommand, "unknown command %q", name)}}}, nil
}

func (l *echoLink) OpenTunnel(context.Context, domain.TunnelRequest, io.Reader) (ports.TunnelStream, error) {
	return nil, errors.New("no tunnels")
}
func (l *echoLink) PushConfig(context.Context, domain.NodeConfig) error { return nil }
func (l *echoLink) Close(string)                                        {}

type echoStream struct{ ch chan domain.RunEvent }

func (s *echoStream) Recv(ctx context.Context) (domain.RunEvent, error) {
	select {
	case ev := <-s.ch:
		return ev, nil
	case <-ctx.Done():
		return domain.RunEvent{}, ctx.Err()
	}
}
func (s *echoStream) Close() {}

type echoCmd struct {
	replies []ports.CommandReply
}

func (c *echoCmd) Recv(context.Context) (ports.CommandReply, error) {
	if len(c.replies) == 0 {
		return ports.CommandReply{}, io.EOF
	}
	r := c.replies[0]
	c.replies = c.replies[1:]
	return r, nil
}
func (c *echoCmd) Close() {}

func newRealEdge(t *testing.T) (string, *eventbus.Bus) {
	t.Helper()
	return newRealEdgeWith(t, nil)
}

// newRealEdgeWith is newRealEdge with deps adjusted by adjust (nil: none).
func newRealEdgeWith(t *testing.T, adjust func(*httpapi.Deps)) (string, *eventbus.Bus) {
	t.Helper()
	reg := edge.NewRegistry()
	link := &echoLink{runs: map[string]chan domain.RunEvent{}}
	cfg := domain.NodeConfig{Adapters: []domain.AdapterConfig{{Name: "exec", Type: "exec", MaxConcurrency: 2}, {Name: "llm", Type: "ollama", MaxConcurrency: 1}}}
	if err := reg.Admit(&edge.LiveNode{ID: "n1", Link: link, Remote: "127.0.0.1:1", ConnectedAt: testNow.Add(-time.Minute), Config: cfg, Info: domain.NodeInfo{Version: "v9"}}); err != nil {
		t.Fatal(err)
	}
	bus := eventbus.New()
	tracker := edge.NewRunTracker(0)
	submit := edge.NewSubmitRunHandler(reg, tracker, bus, nil)
	cmds := edge.NewNodeCommandHandler(reg)
	deps := httpapi.Deps{
		Registry: reg, Submit: submit, Cancel: edge.NewCancelRunHandler(reg, tracker),
		Terminate: edge.NewTerminateSessionHandler(reg), Commands: cmds,
		GetRun: edge.NewGetRunHandler(reg, tracker, cmds), ListRuns: edge.NewListRunsHandler(reg, cmds), Events: bus,
	}
	if adjust != nil {
		adjust(&deps)
	}
	api := httpapi.New(deps, "", nil)
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(func() {
		srv.Close()
		submit.Stop()
		bus.Close()
	})
	return srv.URL, bus
}

func TestAgainstTheRealAPI(t *testing.T) {
	url, bus := newRealEdge(t)

	r := run(t, url, "run", "--adapter", "exec", "--target", "upper", "-v", "hello")
	r.want(t, 0, "HELLO")
	if !strings.Contains(r.stderr, "thinking") || !strings.Contains(r.stderr, "1 prompt + 2 completion = 3 tokens") {
		t.Fatalf("stderr %q", r.stderr)
	}

	// The foreground run has released its slot by the time its CLI exits.
	run(t, url, "nodes").want(t, 0, ""+
		"ID  STATUS  REMOTE       CONNECTED  ADAPTERS            VERSION\n"+
		"n1  online  127.0.0.1:1  1m ago     exec(0/2) llm(0/1)  v9\n")

	r = run(t, url, "run", "--adapter", "exec", "--background", "x")
	if r.code != 0 || !strings.HasSuffix(r.stdout, " started in the background on node n1\n") {
		t.Fatalf("%+v", r)
	}

	r = run(t, url, "session", "end", "s1", "--adapter", "exec")
	if r.code != 1 || !strings.Contains(r.stderr, "(session_unsupported)") {
		t.Fatalf("%+v", r)
	}
	r = run(t, url, "cancel", "run_nope")
	if r.code != 1 || !strings.Contains(r.stderr, "(run_not_found)") {
		t.Fatalf("%+v", r)
	}
	r = run(t, url, "node", "exec", "n1", "bogus")
	if r.code != 1 || !strings.Contains(r.stderr, "(unknown_command)") {
		t.Fatalf("%+v", r)
	}
	run(t, url, "ollama", "pull", "m").want(t, 0, "pulling manifest\npulling abc: 100% (100 B/100 B)\nsuccess\npulled m on node n1\n")

	// A run cancelled from a second CLI ends the first with exit 130, and
	// the event feed sees it.
	sub := bus.Subscribe(64, nil)
	defer sub.Close()
	done := make(chan result, 1)
	go func() { done <- run(t, url, "run", "--adapter", "exec", "--target", "hang", "x") }()
	var runID string
	for runID == "" {
		select {
		case ev := <-sub.C():
			if ev.Run != nil && ev.Run.Type == domain.EventStart {
				runID = ev.Run.RunID
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no run started")
		}
	}
	run(t, url, "cancel", runID).want(t, 0, "cancelling run "+runID+" on node n1\n")
	select {
	case r := <-done:
		r.want(t, 130, "X")
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled run's CLI did not exit")
	}
}

func TestEventsAgainstTheRealAPI(t *testing.T) {
	url, bus := newRealEdge(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	printed := make(chan struct{})
	go func() {
		done <- cli(t, ctx, url, []cliOpt{withStdoutSeen("node.registered", printed)}, "events", "--type", "node.*")
	}()
	// Publish until the CLI has printed one: the subscriber attaches at
	// some point.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	go func() {
		for {
			select {
			case <-tick.C:
				bus.Publish(domain.BusEvent{Type: domain.BusRunEvent, Node: "n1", Run: &domain.RunEvent{RunID: "r", Type: domain.EventDelta}})
				bus.Publish(domain.BusEvent{Type: domain.BusNodeRegistered, Time: testNow, Node: "n7", Remote: "1.1.1.1:1"})
			case <-ctx.Done():
				return
			}
		}
	}()
	interruptWhen(printed)
	cancel()
	r := <-done
	if r.code != 130 || !strings.HasPrefix(r.stdout, "12:00:00.000 node.registered node=n7 remote=1.1.1.1:1\n") || strings.Contains(r.stdout, "run.event") {
		t.Fatalf("%+v", r)
	}
}

// fixedHistory is an edge history holding runs.
type fixedHistory struct{ runs []domain.RunRecord }

func (h fixedHistory) GetRun(_ context.Context, id string) (domain.RunRecord, error) {
	for _, r := range h.runs {
		if r.ID == id {
			return r, nil
		}
	}
	return domain.RunRecord{}, domain.ErrRunNotFound
}

func (h fixedHistory) ListRuns(context.Context, domain.RunQuery) (domain.RunPage, error) {
	return domain.RunPage{Runs: h.runs}, nil
}

func (h fixedHistory) Usage(context.Context, domain.UsageQuery) ([]domain.UsageTotal, error) {
	return nil, nil
}

// The edge's history knows when a run was created and finished, not when
// it started: iop runs and run-get time runs from their creation (the
// fixtures of the other tests carry a started_at the history never sends).
func TestRunDurationsFromTheRealHistory(t *testing.T) {
	created := testNow.Add(-time.Hour)
	history := fixedHistory{runs: []domain.RunRecord{
		{ID: "run_2", Node: "n1", Adapter: "llm", Key: "ops", Status: domain.RunRunning, CreatedAt: testNow.Add(-90 * time.Second)},
		{ID: "run_1", Node: "n1", Adapter: "exec", Target: "upper", Key: "ops", Status: domain.RunSucceeded,
			CreatedAt: created, FinishedAt: created.Add(2500 * time.Millisecond)},
	}}
	url, _ := newRealEdgeWith(t, func(d *httpapi.Deps) { d.History = edge.NewRunHistoryHandler(history) })

	run(t, url, "runs").want(t, 0, ""+
		"RUN    NODE  ADAPTER  TARGET  STATUS     CREATED              DURATION  ERROR\n"+
		"run_2  n1    llm      -       running    2026-03-01 11:58:30  1m30s+    -\n"+
		"run_1  n1    exec     upper   succeeded  2026-03-01 11:00:00  2.5s      -\n")
	r := run(t, url, "run-get", "run_1")
	if r.code != 0 || !strings.Contains(r.stdout, "duration:    2.5s\n") || strings.Contains(r.stdout, "started:") {
		t.Fatalf("%+v", r)
	}
}

// An edge URL with a user and password (a proxy's basic auth in front of
// the edge) and an API key: the password goes in Authorization, the key in
// X-Api-Key, which the real API accepts. The key took Authorization and the
// password was never sent.
func TestBasicAuthAndAPIKeyTogether(t *testing.T) {
	key := "sk-ops-0123456789"
	url, _ := newRealEdgeWith(t, func(d *httpapi.Deps) {
		d.APIKeys = []httpapi.APIKey{{SHA256: sha256.Sum256([]byte(key)), Principal: domain.Principal{Name: "ops", Scopes: []string{domain.ScopeAdmin}}}}
	})
	var mu sync.Mutex
	var seen []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		mu.Lock()
		seen = append(seen, fmt.Sprintf("basic=%v %s:%s x-api-key=%q", ok, user, pass, r.Header.Get("X-Api-Key")))
		mu.Unlock()
		if !ok || user != "proxy" || pass != "hunter2" {
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		r.Header.Del("Authorization")
		target, _ := neturl.Parse(url)
		httputil.NewSingleHostReverseProxy(target).ServeHTTP(w, r)
	}))
	defer proxy.Close()
	withUser := strings.Replace(proxy.URL, "http://", "http://proxy:hunter2@", 1)

	run(t, withUser, "--api-key", key, "nodes").want(t, 0, ""+
		"ID  STATUS  REMOTE       CONNECTED  ADAPTERS            VERSION\n"+
		"n1  online  127.0.0.1:1  1m ago     exec(0/2) llm(0/1)  v9\n")
	run(t, withUser, "--api-key", key, "run", "--adapter", "exec", "--target", "upper", "hi").want(t, 0, "HI")
	mu.Lock()
	defer mu.Unlock()
	for _, s := range seen {
		if s != `basic=true proxy:hunter2 x-api-key="`+key+`"` {
			t.Fatalf("the proxy saw %q", seen)
		}
	}
	// Without a user in the URL the key is a bearer token, as before.
	run(t, url, "--api-key", key, "nodes").want(t, 0, ""+
		"ID  STATUS  REMOTE       CONNECTED  ADAPTERS            VERSION\n"+
		"n1  online  127.0.0.1:1  1m ago     exec(0/2) llm(0/1)  v9\n")
}
