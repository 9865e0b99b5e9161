package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/adapters/eventbus"
	httpapi "iop/adapters/http"
	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

func TestListAndGetNodes(t *testing.T) {
	e := newEnv(t, testNode{"b", newFakeLink(domain.RunEvent{Type: domain.EventStart})}, testNode{"a", newFakeLink()})
	// One run in flight on b through this edge.
	resp := e.do("POST", "/v1/runs", `{"adapter":"llm","node":"b"}`)
	defer resp.Body.Close()

	b, err := io.ReadAll(e.do("GET", "/v1/nodes", "").Body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "SECRET_ENV") || strings.Contains(string(b), "token") {
		t.Fatalf("node listing leaks config secrets: %s", b)
	}
	var list struct {
		Nodes []struct {
			ID            string `json:"id"`
			Remote        string `json:"remote"`
			ConnectedAt   string `json:"connected_at"`
			Version       string `json:"version"`
			OS            string `json:"os"`
			Arch          string `json:"arch"`
			Hostname      string `json:"hostname"`
			ConfigVersion int    `json:"config_version"`
			RunsInFlight  int    `json:"runs_in_flight"`
			Adapters      []struct {
				Name           string `json:"name"`
				Type           string `json:"type"`
				MaxConcurrency int    `json:"max_concurrency"`
				InFlight       int    `json:"in_flight"`
			} `json:"adapters"`
			Providers []struct {
				Name   string   `json:"name"`
				Type   string   `json:"type"`
				Models []string `json:"models"`
			} `json:"providers"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Nodes) != 2 || list.Nodes[0].ID != "a" || list.Nodes[1].ID != "b" {
		t.Fatalf("nodes %s", b)
	}
	n := list.Nodes[1]
	if n.Remote != "10.0.0.1:5555" || n.ConnectedAt != "2026-01-02T03:04:05Z" || n.Version != "v1.2.3" || n.OS != "linux" ||
		n.Arch != "amd64" || n.Hostname != "box-b" || n.ConfigVersion != 3 || n.RunsInFlight != 1 {
		t.Fatalf("node %+v", n)
	}
	if len(n.Adapters) != 2 || n.Adapters[1].Name != "llm" || n.Adapters[1].InFlight != 1 || n.Adapters[1].MaxConcurrency != 1 || n.Adapters[0].InFlight != 0 {
		t.Fatalf("adapters %+v", n.Adapters)
	}
	if len(n.Providers) != 1 || n.Providers[0].Name != "ol" || n.Providers[0].Type != "ollama" || !slices.Equal(n.Providers[0].Models, []string{"qwen3"}) {
		t.Fatalf("providers %+v", n.Providers)
	}

	m := readJSON(t, e.do("GET", "/v1/nodes/a", ""), 200)
	if m["id"] != "a" || m["hostname"] != "box-a" {
		t.Fatalf("node %v", m)
	}
	wantError(t, e.do("GET", "/v1/nodes/zz", ""), 404, "node_not_found")
}

func TestNodesEmpty(t *testing.T) {
	e := newEnv(t)
	m := readJSON(t, e.do("GET", "/v1/nodes", ""), 200)
	if nodes, ok := m["nodes"].([]any); !ok || len(nodes) != 0 {
		t.Fatalf("nodes %v", m)
	}
	if m := readJSON(t, e.do("GET", "/healthz", ""), 200); m["status"] != "ok" || m["nodes"] != 0.0 {
		t.Fatalf("health %v", m)
	}
}

func TestHealthz(t *testing.T) {
	e := newEnv(t, testNode{"a", newFakeLink()}, testNode{"b", newFakeLink()})
	if m := readJSON(t, e.do("GET", "/healthz", ""), 200); m["status"] != "ok" || m["nodes"] != 2.0 {
		t.Fatalf("health %v", m)
	}
}

func commandLink(replies map[string][]ports.CommandReply, block map[string]bool) *fakeLink {
	l := newFakeLink()
	l.command = func(_ context.Context, name string, _ []byte) (ports.CommandStream, error) {
		r, ok := replies[name]
		if !ok {
			return &fakeCmdStream{replies: []ports.CommandReply{{Final: true, Err: domain.Errorf(domain.CodeUnknownCommand, "unknown command %q", name)}}}, nil
		}
		return &fakeCmdStream{replies: r, block: block[name]}, nil
	}
	return l
}

func TestNodeCommandJSON(t *testing.T) {
	link := commandLink(map[string][]ports.CommandReply{
		"capabilities": {{Final: true, Result: []byte(`{"node_id":"a","adapters":[]}`)}},
		"ollama.pull":  {{Final: true, Err: domain.Errorf(domain.CodeCommandUnsupported, "no adapter serves ollama.pull")}},
		"empty":        {{Final: true}},
		"slow":         {},
		"broken":       {{Progress: nil}},
	}, map[string]bool{"slow": true})
	e := newEnv(t, testNode{"a", link})
	// Only "slow" is to run out of it: the others must answer within it
	// on a loaded machine too (100 ms was near what a descheduled
	// goroutine can lose).
	e.commands.Timeout = time.Second

	m := readJSON(t, e.do("POST", "/v1/nodes/a/commands", `{"command":"capabilities"}`), 200)
	if m["node_id"] != "a" {
		t.Fatalf("result %v", m)
	}
	readJSON(t, e.do("POST", "/v1/nodes/a/commands", `{"command":"empty"}`), 200)

	tests := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"unknown command", "/v1/nodes/a/commands", `{"command":"bogus"}`, 400, "unknown_command"},
		{"unsupported command", "/v1/nodes/a/commands", `{"command":"ollama.pull","args":{"model":"x"}}`, 501, "command_unsupported"},
		{"missing command", "/v1/nodes/a/commands", `{"args":{}}`, 400, "invalid_request"},
		{"unknown field", "/v1/nodes/a/commands", `{"command":"capabilities","x":1}`, 400, "invalid_request"},
		{"node not connected", "/v1/nodes/zz/commands", `{"command":"capabilities"}`, 404, "node_not_found"},
		{"timeout", "/v1/nodes/a/commands", `{"command":"slow"}`, 504, "timeout"},
		{"stream ends without result", "/v1/nodes/a/commands", `{"command":"broken"}`, 503, "node_disconnected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, e.do("POST", tt.path, tt.body), tt.status, tt.code)
		})
	}
}

func TestNodeCommandSSE(t *testing.T) {
	link := commandLink(map[string][]ports.CommandReply{
		"capabilities": {{Final: true, Result: []byte("{\"a\":1,\n\"b\":2}")}},
		"ollama.pull": {
			{Progress: []byte(`{"status":"pulling manifest"}`)},
			{Progress: []byte(`{"status":"pulling abc","digest":"sha256:abc","total":100,"completed":50}`)},
			{Final: true, Result: []byte(`{"status":"success"}`)},
		},
		"ollama.fail": {
			{Progress: []byte(`{"status":"pulling manifest"}`)},
			{Final: true, Err: domain.Errorf(domain.CodeProviderError, "registry unreachable")},
		},
		"nope": {{Final: true, Err: domain.Errorf(domain.CodeUnknownCommand, "nope")}},
	}, nil)
	e := newEnv(t, testNode{"a", link})

	read := func(body string, accept bool) (*http.Response, []sseEvent) {
		t.Helper()
		var hdr []string
		if accept {
			hdr = []string{"Accept", "text/event-stream"}
		}
		resp := e.do("POST", "/v1/nodes/a/commands", body, hdr...)
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return resp, newSSE(resp.Body).readAll(t)
	}

	// Progress switches to SSE even without Accept.
	_, evs := read(`{"command":"ollama.pull","args":{"model":"qwen3"}}`, false)
	if len(evs) != 3 || evs[0].typ != "progress" || evs[1].typ != "progress" || evs[2].typ != "result" {
		t.Fatalf("events %v", evs)
	}
	if p := evs[1].json(t); p["digest"] != "sha256:abc" || p["completed"] != 50.0 {
		t.Fatalf("progress %v", p)
	}
	if r := evs[2].json(t); r["status"] != "success" {
		t.Fatalf("result %v", r)
	}

	// Accept asks for SSE even for a one-shot command; multi-line JSON survives.
	_, evs = read(`{"command":"capabilities"}`, true)
	if len(evs) != 1 || evs[0].typ != "result" || evs[0].json(t)["b"] != 2.0 {
		t.Fatalf("events %v", evs)
	}

	// Errors after the stream started are error events.
	_, evs = read(`{"command":"ollama.fail"}`, false)
	last := evs[len(evs)-1]
	if last.typ != "error" {
		t.Fatalf("events %v", evs)
	}
	if er := last.json(t)["error"].(map[string]any); er["code"] != "provider_error" || er["message"] != "registry unreachable" {
		t.Fatalf("error %v", er)
	}
	_, evs = read(`{"command":"nope"}`, true)
	if len(evs) != 1 || evs[0].typ != "error" {
		t.Fatalf("events %v", evs)
	}

	// Errors before anything streams keep their status even with Accept.
	wantError(t, e.do("POST", "/v1/nodes/zz/commands", `{"command":"x"}`, "Accept", "text/event-stream"), 404, "node_not_found")
}

func TestEventsStream(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := e.doCtx(ctx, "GET", "/v1/events?type=node.registered,run.event&type=tunnel.*", "")
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	at := time.Date(2026, 5, 1, 2, 3, 4, 0, time.UTC)
	e.bus.Publish(domain.BusEvent{Type: domain.BusNodeDisconnected, Node: "x", Reason: "filtered out"})
	e.bus.Publish(domain.BusEvent{Type: domain.BusNodeRegistered, Time: at, Node: "n1", Remote: "1.2.3.4:5"})
	e.bus.Publish(domain.BusEvent{Type: domain.BusRunEvent, Time: at, Node: "n1", Run: &domain.RunEvent{RunID: "run_1", Seq: 2, Type: domain.EventDelta, Text: "hi"}})
	e.bus.Publish(domain.BusEvent{Type: domain.BusTunnelCompleted, Time: at, Node: "n1", Tunnel: &domain.TunnelSummary{ID: "t1", Provider: "ol", Status: 200, BodyBytes: 10, Duration: 1500 * time.Millisecond}})

	sse := newSSE(resp.Body)
	var got []sseEvent
	for range 3 {
		ev, err := sse.next()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	if got[0].typ != "node.registered" || got[1].typ != "run.event" || got[2].typ != "tunnel.completed" {
		t.Fatalf("events %v", got)
	}
	reg := got[0].json(t)
	if reg["type"] != "node.registered" || reg["node"] != "n1" || reg["remote"] != "1.2.3.4:5" || reg["time"] != "2026-05-01T02:03:04Z" {
		t.Fatalf("registered %v", reg)
	}
	if _, ok := reg["run"]; ok {
		t.Fatalf("absent run present: %v", reg)
	}
	run := got[1].json(t)["run"].(map[string]any)
	if run["run_id"] != "run_1" || run["node"] != "n1" || run["seq"] != 2.0 || run["type"] != "delta" || run["text"] != "hi" {
		t.Fatalf("run %v", run)
	}
	tun := got[2].json(t)["tunnel"].(map[string]any)
	if tun["id"] != "t1" || tun["duration_ms"] != 1500.0 || tun["body_bytes"] != 10.0 {
		t.Fatalf("tunnel %v", tun)
	}

}

// A type entry with a control character or invalid UTF-8 names no event
// type: 400, where it used to subscribe to nothing.
func TestEventsTypeEntriesAreChecked(t *testing.T) {
	e := newEnv(t)
	for _, q := range []string{"type=%ff", "type=a%01", "type=node.*,run.event%00", "type=%1b[2J*"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp := e.doCtx(ctx, "GET", "/v1/events?"+q, "")
		m := readJSON(t, resp, 400)
		cancel()
		if msg, _ := m["error"].(map[string]any)["message"].(string); !strings.HasPrefix(msg, "type ") {
			t.Errorf("%s: %v", q, m)
		}
	}
}

// A type entry that names no event the bus carries — misspelt, a family
// without its "*", a "*" not at the end — is 400 naming the types, where
// it used to subscribe to nothing and the caller waited for good; every
// documented type and prefix is accepted.
func TestEventsTypeEntriesMustNameAnEventType(t *testing.T) {
	e := newEnv(t)
	for _, q := range []string{"node.registerd", "node", "*.completed", "run.event,tunnels.*", "Node.registered", "config.reloaded*x"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp := e.doCtx(ctx, "GET", "/v1/events?type="+url.QueryEscape(q), "")
		m := readJSON(t, resp, 400)
		cancel()
		e := m["error"].(map[string]any)
		if msg, _ := e["message"].(string); e["code"] != "invalid_request" || !strings.Contains(msg, "matches no event type") || !strings.Contains(msg, "tunnel.completed") {
			t.Errorf("%s: %v", q, m)
		}
	}
	for _, q := range []string{"node.registered,node.rejected,node.draining,node.disconnected,node.config_refreshed,config.reloaded,run.event,tunnel.completed",
		"node.*", "*", "config.*,tunnel.*", "run.event*", " node.* , "} {
		ctx, cancel := context.WithCancel(context.Background())
		resp := e.doCtx(ctx, "GET", "/v1/events?type="+url.QueryEscape(q), "")
		resp.Body.Close()
		cancel()
		if resp.StatusCode != 200 {
			t.Errorf("%s: status %d, want 200", q, resp.StatusCode)
		}
	}
}

// The type filter runs in the bus's Publish, for every event of the edge:
// a subscription may name at most 32 distinct types and prefixes (repeats
// count once); more is 400 before anything streams.
func TestEventsTypeFilterIsBounded(t *testing.T) {
	e := newEnv(t)
	// 33 distinct prefixes, each of some event type.
	var many []string
	for _, typ := range []string{"tunnel.completed", "node.config_refreshed"} {
		for i := range len(typ) {
			if len(many) < 33 {
				many = append(many, typ[:i+1]+"*")
			}
		}
	}
	refused := func(query string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp := e.doCtx(ctx, "GET", "/v1/events?"+query, "")
		if resp.StatusCode != 400 {
			resp.Body.Close()
			t.Fatalf("%.40s…: status %d, want 400", query, resp.StatusCode)
		}
		wantError(t, resp, 400, "invalid_request")
	}
	refused("type=" + strings.Join(many, ","))
	refused("type=" + strings.Join(many[:32], ",") + "&type=run.event")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	repeated := strings.Repeat("node.*,", 1000) + strings.Join(many[:31], ",") // 32 with node.*
	resp := e.doCtx(ctx, "GET", "/v1/events?type="+repeated, "")
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("32 distinct entries, repeated: status %d", resp.StatusCode)
	}
	e.bus.Publish(domain.BusEvent{Type: domain.BusNodeDisconnected, Node: "n1"})
	if ev, err := newSSE(resp.Body).next(); err != nil || ev.typ != "node.disconnected" {
		t.Fatalf("event %v, %v", ev, err)
	}
}

func TestEventsKeepAlive(t *testing.T) {
	e := newEnv(t)
	resp := e.do("GET", "/v1/events", "")
	defer resp.Body.Close()
	// The stream opens with a comment at once, then keeps alive.
	want := ": subscribed\n\n: keep-alive\n\n"
	buf := make([]byte, 64)
	n, err := io.ReadAtLeast(resp.Body, buf, len(want))
	if err != nil || string(buf[:n]) != want {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
}

func TestEventsAllTypes(t *testing.T) {
	e := newEnv(t)
	resp := e.do("GET", "/v1/events", "")
	defer resp.Body.Close()
	e.bus.Publish(domain.BusEvent{Type: domain.BusConfigReloaded})
	ev, err := newSSE(resp.Body).next()
	if err != nil || ev.typ != "config.reloaded" {
		t.Fatalf("event %v, %v", ev, err)
	}
}

func TestEventsStreamEndsWithTheBus(t *testing.T) {
	e := newEnv(t)
	resp := e.do("GET", "/v1/events", "")
	defer resp.Body.Close()
	e.bus.Close()
	if evs := newSSE(resp.Body).readAll(t); len(evs) != 0 {
		t.Fatalf("events %v", evs)
	}
}

func TestReload(t *testing.T) {
	e := newEnv(t)
	e.reload = func(context.Context) (edge.ReloadResult, error) {
		return edge.ReloadResult{Nodes: 2, Refreshed: []string{"a"}, Disconnected: []string{}, Unchanged: []string{"b"}}, nil
	}
	m := readJSON(t, e.do("POST", "/v1/admin/reload", ""), 200)
	if m["nodes"] != 2.0 || m["refreshed"].([]any)[0] != "a" {
		t.Fatalf("result %v", m)
	}
	e.reload = func(context.Context) (edge.ReloadResult, error) {
		return edge.ReloadResult{}, domain.Errorf(domain.CodeConfigError, "edge.yaml line 7: unknown field bogus")
	}
	resp := e.do("POST", "/v1/admin/reload", "")
	m = readJSON(t, resp, 422)
	if er := m["error"].(map[string]any); er["code"] != "config_error" || !strings.Contains(er["message"].(string), "line 7") {
		t.Fatalf("error %v", m)
	}
}

// A reload acts on every node and its answer names them all: an admin key
// limited to some nodes is refused, as /metrics refuses it, and the reload
// is not run.
func TestReloadRefusesANodeLimitedKey(t *testing.T) {
	e := newEnvWithKeys(t, []httpapi.APIKey{apiKey("n2-admin-key-0123456789", "n2-admin", []string{"n2"}, domain.ScopeAdmin)},
		testNode{"n1", newFakeLink()}, testNode{"n2", newFakeLink()})
	ran := false
	e.reload = func(context.Context) (edge.ReloadResult, error) {
		ran = true
		return edge.ReloadResult{Nodes: 2, Refreshed: []string{"n1"}, Unchanged: []string{"n2"}}, nil
	}
	m := readJSON(t, e.do("POST", "/v1/admin/reload", "", "X-Api-Key", "n2-admin-key-0123456789"), 403)
	if er := m["error"].(map[string]any); er["code"] != "forbidden" || strings.Contains(fmt.Sprint(m), "n1") || ran {
		t.Fatalf("reload by a key limited to n2: %v (reload ran: %v), want 403 naming no node", m, ran)
	}
}

func TestReloadUnavailable(t *testing.T) {
	deps := minimalDeps(edge.NewRegistry())
	defer deps.Submit.Stop()
	srv := httptest.NewServer(httpapi.New(deps, "", nil).Handler())
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL+"/v1/admin/reload", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, resp, 501, "not_implemented")
}

func TestUnroutedRequests(t *testing.T) {
	e := newEnv(t)
	wantError(t, e.do("GET", "/v2/nothing", ""), 404, "not_found")
	wantError(t, e.do("GET", "/v1/runs/x/y", ""), 404, "not_found")
	resp := e.do("DELETE", "/v1/nodes", "")
	if allow := resp.Header.Get("Allow"); !strings.Contains(allow, "GET") {
		t.Fatalf("Allow %q", allow)
	}
	wantError(t, resp, 405, "method_not_allowed")
	wantError(t, e.do("GET", "/v1/admin/reload", ""), 405, "method_not_allowed")
}

func TestStartBindsAndStopEndsStreams(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart})
	reg := edge.NewRegistry()
	deps := minimalDeps(reg)
	if err := reg.Admit(&edge.LiveNode{ID: "n1", Link: link, Config: domain.NodeConfig{Adapters: []domain.AdapterConfig{{Name: "exec", Type: "exec", MaxConcurrency: 1}}}}); err != nil {
		t.Fatal(err)
	}
	defer deps.Submit.Stop()
	api := httpapi.New(deps, "127.0.0.1:0", slog.New(slog.DiscardHandler))
	if api.Addr() != nil {
		t.Fatal("address before Start")
	}
	if err := api.Start(); err != nil {
		t.Fatal(err)
	}
	addr := api.Addr().String()

	// A second server on the same port fails to start, clearly.
	busy := httpapi.New(deps, addr, nil)
	err := busy.Start()
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("busy port: %v", err)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Fatalf("busy port error does not wrap the listen error: %v", err)
	}

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	events, err := client.Get("http://" + addr + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer events.Body.Close()
	run, err := client.Post("http://"+addr+"/v1/runs", "application/json", strings.NewReader(`{"adapter":"exec"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer run.Body.Close()
	runSSE := newSSE(run.Body)
	if ev, err := runSSE.next(); err != nil || ev.typ != "start" {
		t.Fatalf("first event %v %v", ev, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := api.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("stop took %v", d)
	}
	rest := runSSE.readAll(t)
	if len(rest) != 1 || rest[0].typ != "error" || rest[0].json(t)["error"].(map[string]any)["code"] != "shutting_down" {
		t.Fatalf("run stream after stop: %v", rest)
	}
	if evs := newSSE(events.Body).readAll(t); len(evs) != 0 {
		t.Fatalf("events after stop: %v", evs)
	}
	select {
	case <-link.cancelled:
	case <-time.After(2 * time.Second):
		t.Fatal("the run cut off by stop was not cancelled on its node")
	}
	if got := link.cancelReasons(); len(got) != 1 || got[0] != edge.CancelEdgeStopping {
		t.Fatalf("cancel reasons %q, want [%q]", got, edge.CancelEdgeStopping)
	}
	if err := api.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}
}

// minimalDeps wires real use cases without a reload hook.
func minimalDeps(reg *edge.Registry) httpapi.Deps {
	tracker := edge.NewRunTracker(0)
	cmds := edge.NewNodeCommandHandler(reg)
	return httpapi.Deps{
		Registry:  reg,
		Submit:    edge.NewSubmitRunHandler(reg, tracker, nopBus{}, nil),
		Cancel:    edge.NewCancelRunHandler(reg, tracker),
		Terminate: edge.NewTerminateSessionHandler(reg),
		Commands:  cmds,
		GetRun:    edge.NewGetRunHandler(reg, tracker, cmds),
		ListRuns:  edge.NewListRunsHandler(reg, cmds),
		Events:    eventbus.New(),
	}
}

type nopBus struct{}

func (nopBus) Publish(domain.BusEvent) {}

// A path the mux would clean (a base URL ending in "/" doubles the slash,
// "." or ".." segments) or a subtree's root without its slash is redirected with 308, which keeps
// a POST a POST, and a JSON body saying where; before, net/http answered
// with an HTML body (and 301 for a missing slash). The redirect
// comes after the key: a caller without one learns nothing about routes.
func TestUncleanPathsMoveInJSON(t *testing.T) {
	e := newEnv(t, testNode{"n1", newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})})
	// A subtree, as the passthrough's /api/ and the console's /ui/ are.
	e.api.Handle("/sub/", httpapi.Access{Public: true}, http.NotFoundHandler())
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct{ method, path, body, loc string }{
		{"GET", "//v1/nodes", "", "/v1/nodes"},
		{"GET", "/v1/./nodes?x=1", "", "/v1/nodes?x=1"},
		{"GET", "/v1//runs/r1/", "", "/v1/runs/r1/"},
		{"POST", "//v1/runs", `{"adapter":"exec"}`, "/v1/runs"},
		{"DELETE", "/v1/sessions/s1/../s2?adapter=exec", "", "/v1/sessions/s2?adapter=exec"},
		{"GET", "/sub", "", "/sub/"},
		{"GET", "/s%75b?q=1", "", "/sub/?q=1"},
		{"POST", "/sub", "x", "/sub/"},
	} {
		req, err := http.NewRequest(tc.method, e.srv.URL+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if loc := resp.Header.Get("Location"); loc != tc.loc {
			t.Errorf("%s %s: Location %q, want %q", tc.method, tc.path, loc, tc.loc)
		}
		wantError(t, resp, http.StatusPermanentRedirect, "moved")
	}

	// The message gives the cause the caller can fix: a doubled slash is a
	// base URL ending in "/", which /api (no slash) and /v1/./nodes are not.
	for _, tc := range []struct{ path, why string }{
		{"//v1/nodes", `a base URL ending in "/" doubles the slash`},
		{"/v1/./nodes", `"." and ".." segments are resolved first`},
		{"/v1/sessions/s1/../s2", `"." and ".." segments are resolved first`},
		{"/sub", `a subtree's path ends in "/"`},
		{"/s%75b", `a subtree's path ends in "/"`},
	} {
		resp, err := noFollow.Get(e.srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		m := readJSON(t, resp, http.StatusPermanentRedirect)
		msg, _ := m["error"].(map[string]any)["message"].(string)
		if !strings.HasSuffix(msg, "("+tc.why+")") {
			t.Errorf("GET %s: message %q, want it to end (%s)", tc.path, msg, tc.why)
		}
	}

	// A client that follows it keeps the method and the body.
	req, _ := http.NewRequest("POST", e.srv.URL+"//v1/runs", strings.NewReader(`{"adapter":"exec"}`))
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Request.Method != "POST" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("followed POST //v1/runs: %d %s %q", resp.StatusCode, resp.Request.Method, resp.Header.Get("Content-Type"))
	}

	keyed := newEnvWithKeys(t, []httpapi.APIKey{apiKey("reader-key-0123456789", "reader", nil, domain.ScopeRead)})
	req, _ = http.NewRequest("GET", keyed.srv.URL+"//v1/nodes", nil)
	resp, err = noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, resp, http.StatusUnauthorized, "unauthorized")
}
