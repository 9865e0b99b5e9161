package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

func TestCreateRunStreamsEvents(t *testing.T) {
	link := newFakeLink(
		domain.RunEvent{Type: domain.EventStart},
		domain.RunEvent{Type: domain.EventReasoningDelta, Text: "hmm"},
		domain.RunEvent{Type: domain.EventDelta, Text: "HEL"},
		domain.RunEvent{Type: domain.EventDelta, Text: "LO\nworld"},
		domain.RunEvent{Type: domain.EventMetadata, Metadata: []byte(`{"tool":"ls"}`)},
		domain.RunEvent{Type: domain.EventComplete, Usage: &domain.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7, StopReason: "stop", Model: "m"}},
	)
	e := newEnv(t, testNode{"n1", link})
	resp := e.do("POST", "/v1/runs", `{"adapter":"exec","target":"upper","input":"hello","session_id":"s1","options":{"think":true}}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	runID := resp.Header.Get("X-IOP-Run-ID")
	if !strings.HasPrefix(runID, "run_") || resp.Header.Get("X-IOP-Node") != "n1" {
		t.Fatalf("headers %v", resp.Header)
	}
	events := newSSE(resp.Body).readAll(t)
	var types []string
	for _, ev := range events {
		types = append(types, ev.typ)
		m := ev.json(t)
		if m["type"] != ev.typ || m["run_id"] != runID || m["node"] != "n1" {
			t.Fatalf("event %s data %v", ev.typ, m)
		}
	}
	want := []string{"start", "reasoning_delta", "delta", "delta", "metadata", "complete"}
	if !slices.Equal(types, want) {
		t.Fatalf("types %v, want %v", types, want)
	}
	if d := events[3].json(t); d["text"] != "LO\nworld" || d["seq"] != 4.0 {
		t.Fatalf("delta %v", d)
	}
	if _, ok := events[0].json(t)["text"]; ok {
		t.Fatalf("start carries an empty text field: %s", events[0].data)
	}
	for _, k := range []string{"usage", "error", "metadata"} {
		if strings.Contains(events[2].data, `"`+k+`"`) {
			t.Fatalf("delta carries absent field %s: %s", k, events[2].data)
		}
	}
	if md := events[4].json(t)["metadata"].(map[string]any); md["tool"] != "ls" {
		t.Fatalf("metadata %v", md)
	}
	u := events[5].json(t)["usage"].(map[string]any)
	if u["prompt_tokens"] != 3.0 || u["total_tokens"] != 7.0 || u["stop_reason"] != "stop" || u["model"] != "m" {
		t.Fatalf("usage %v", u)
	}
	if _, ok := u["cost_usd"]; ok {
		t.Fatalf("zero cost is not omitted: %v", u)
	}

	reqs := link.requests()
	if len(reqs) != 1 {
		t.Fatalf("requests %v", reqs)
	}
	r := reqs[0]
	if r.RunID != runID || r.Adapter != "exec" || r.Target != "upper" || string(r.Input) != "hello" || r.SessionID != "s1" || string(r.Options) != `{"think":true}` || r.Background {
		t.Fatalf("run request %+v", r)
	}
}

func TestCreateRunErrors(t *testing.T) {
	tests := []struct {
		name   string
		nodes  int
		link   func(*fakeLink)
		body   string
		status int
		code   string
	}{
		{name: "bad JSON", nodes: 1, body: `{"adapter":`, status: 400, code: "invalid_request"},
		{name: "empty body", nodes: 1, body: ``, status: 400, code: "invalid_request"},
		{name: "unknown field", nodes: 1, body: `{"adapter":"exec","bogus":1}`, status: 400, code: "invalid_request"},
		{name: "trailing data", nodes: 1, body: `{"adapter":"exec"} {}`, status: 400, code: "invalid_request"},
		{name: "a trailing brace", nodes: 1, body: `{"adapter":"exec"}}`, status: 400, code: "invalid_request"},
		{name: "trailing brackets and garbage", nodes: 1, body: `{"adapter":"exec"}]]]garbage`, status: 400, code: "invalid_request"},
		{name: "missing adapter", nodes: 1, body: `{"target":"x"}`, status: 400, code: "invalid_request"},
		{name: "input a number", nodes: 1, body: `{"adapter":"exec","input":5}`, status: 400, code: "invalid_request"},
		{name: "options not an object", nodes: 1, body: `{"adapter":"exec","options":[1]}`, status: 400, code: "invalid_request"},
		{name: "unknown node", nodes: 1, body: `{"adapter":"exec","node":"nope"}`, status: 404, code: "node_not_found"},
		{name: "no node", nodes: 0, body: `{"adapter":"exec"}`, status: 503, code: "no_node_available"},
		{name: "no node offers the adapter", nodes: 2, body: `{"adapter":"nope"}`, status: 503, code: "no_node_available"},
		{name: "node refuses", nodes: 1, link: func(l *fakeLink) { l.startErr = domain.Errorf(domain.CodeNodeDisconnected, "gone") }, body: `{"adapter":"exec"}`, status: 503, code: "node_disconnected"},
		{name: "input an array", nodes: 1, body: `{"adapter":"exec","input":[1]}`, status: 400, code: "invalid_request"},
		{name: "refused at capacity", nodes: 1, link: refuseWith(domain.CodeAtCapacity), body: `{"adapter":"exec"}`, status: 429, code: "at_capacity"},
		{name: "refused at capacity in the background", nodes: 1, link: refuseWith(domain.CodeAtCapacity), body: `{"adapter":"exec","background":true}`, status: 429, code: "at_capacity"},
		{name: "refused: session busy", nodes: 1, link: refuseWith(domain.CodeSessionBusy), body: `{"adapter":"exec","session_id":"s"}`, status: 409, code: "session_busy"},
		{name: "refused: unknown target", nodes: 1, link: refuseWith(domain.CodeTargetNotFound), body: `{"adapter":"exec","target":"nope","background":true}`, status: 404, code: "target_not_found"},
		{name: "refused: unknown adapter", nodes: 1, link: refuseWith(domain.CodeAdapterNotFound), body: `{"adapter":"nope"}`, status: 404, code: "adapter_not_found"},
		{name: "node gone before admitting", nodes: 1, link: func(l *fakeLink) { l.endErr = domain.Errorf(domain.CodeStreamReset, "gone") }, body: `{"adapter":"exec","background":true}`, status: 503, code: "node_disconnected"},
		// The link itself broke before the node's answer: the edge cannot
		// know the node got the run, so no 504 timeout and no run id.
		{name: "link lost before admitting", nodes: 1, link: func(l *fakeLink) { l.endErr = domain.Errorf(domain.CodeNodeDisconnected, "connection lost") }, body: `{"adapter":"exec","background":true}`, status: 503, code: "node_disconnected"},
		{name: "body too large", nodes: 1, body: `{"adapter":"exec","input":"` + strings.Repeat("x", 8<<20) + `"}`, status: 400, code: "invalid_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var nodes []testNode
			for i := range tt.nodes {
				l := newFakeLink()
				if tt.link != nil {
					tt.link(l)
				}
				nodes = append(nodes, testNode{string(rune('a' + i)), l})
			}
			e := newEnv(t, nodes...)
			resp := e.do("POST", "/v1/runs", tt.body)
			// A refusal for a passing reason (every slot busy, no node up,
			// a node stopping) says when to try again; others do not.
			if got, want := resp.Header.Get("Retry-After"), map[bool]string{true: "1"}[domain.RetrySoon(tt.code)]; got != want {
				t.Errorf("Retry-After %q, want %q", got, want)
			}
			wantError(t, resp, tt.status, tt.code)
		})
	}
}

func TestCreateRunErrorEvent(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventDelta, Text: "x"})
	link.endErr = domain.Errorf(domain.CodeNodeDisconnected, "link lost")
	e := newEnv(t, testNode{"n1", link})
	resp := e.do("POST", "/v1/runs", `{"adapter":"exec"}`)
	defer resp.Body.Close()
	events := newSSE(resp.Body).readAll(t)
	last := events[len(events)-1]
	d := last.json(t)
	if last.typ != "error" || d["seq"] != 3.0 {
		t.Fatalf("last event %s %v", last.typ, d)
	}
	if er := d["error"].(map[string]any); er["code"] != "node_disconnected" || er["message"] != "link lost" {
		t.Fatalf("error %v", er)
	}
}

func TestCreateRunBackground(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})
	e := newEnv(t, testNode{"n1", link})
	sub := e.bus.Subscribe(64, nil)
	defer sub.Close()
	m := readJSON(t, e.do("POST", "/v1/runs", `{"adapter":"exec","background":true,"input":"x"}`), http.StatusAccepted)
	runID, _ := m["run_id"].(string)
	if !strings.HasPrefix(runID, "run_") || m["node"] != "n1" {
		t.Fatalf("answer %v", m)
	}
	if reqs := link.requests(); len(reqs) != 1 || !reqs[0].Background {
		t.Fatalf("requests %+v", reqs)
	}
	// The edge drains the run itself: its events reach the bus.
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev := <-sub.C():
			if ev.Run != nil && ev.Run.RunID == runID && ev.Run.Type == domain.EventComplete {
				return
			}
		case <-timeout:
			t.Fatal("the background run's complete event never reached the bus")
		}
	}
}

func TestClientDisconnectCancelsRun(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventDelta, Text: "a"})
	e := newEnv(t, testNode{"n1", link})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := e.doCtx(ctx, "POST", "/v1/runs", `{"adapter":"exec"}`)
	runID := resp.Header.Get("X-IOP-Run-ID")
	sse := newSSE(resp.Body)
	for range 2 {
		if _, err := sse.next(); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	resp.Body.Close()
	select {
	case got := <-link.cancelled:
		if got != runID {
			t.Fatalf("cancelled %s, want %s", got, runID)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("the run was not cancelled after the client left (cancel calls %v)", link.cancelCalls())
	}
	// The node is told why: its record (and the edge's history, which
	// takes the node's cancelled event) says the caller left, not that
	// someone asked for the cancel.
	if got := link.cancelReasons(); len(got) != 1 || got[0] != edge.CancelCallerLeft {
		t.Fatalf("cancel reasons %q, want [%q]", got, edge.CancelCallerLeft)
	}
	// The run's slot is freed once its cancelled event has been drained.
	waitFor(t, "the run slot to be released", func() bool {
		n, _ := e.reg.Get("n1")
		return n.RunsInFlight == 0
	})
}

// TestRunEventsReachTheCallerWhileTheRunPauses: the edge writes the events
// it has together, but never holds one back for a next one: each event
// reaches the caller while the node sends nothing more, and the terminal
// one (left to the server to send with the response's end) arrives with
// the stream's end.
func TestRunEventsReachTheCallerWhileTheRunPauses(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart})
	e := newEnv(t, testNode{"n1", link})
	e.api.KeepAlive = time.Hour // no keep-alive comment flushes a held-back event
	resp := e.do("POST", "/v1/runs", `{"adapter":"exec"}`)
	defer resp.Body.Close()
	runID := resp.Header.Get("X-IOP-Run-ID")
	sse := newSSE(resp.Body)
	next := func(want string) {
		t.Helper()
		got := make(chan sseEvent, 1)
		go func() {
			ev, _ := sse.next()
			got <- ev
		}()
		select {
		case ev := <-got:
			if ev.typ != want {
				t.Fatalf("event %q, want %q", ev.typ, want)
			}
		case <-time.After(10 * time.Second): // the run pauses for good: the event was held back
			t.Fatalf("%s never reached the caller while the run paused", want)
		}
	}
	next("start")
	link.push(runID, domain.RunEvent{Type: domain.EventDelta, Text: "a"})
	next("delta")
	link.push(runID, domain.RunEvent{Type: domain.EventDelta, Text: "b"})
	link.push(runID, domain.RunEvent{Type: domain.EventDelta, Text: "c"})
	next("delta")
	next("delta")
	link.push(runID, domain.RunEvent{Type: domain.EventComplete})
	next("complete")
	if rest := sse.readAll(t); len(rest) != 0 {
		t.Fatalf("events after the terminal one: %v", rest)
	}
}

func TestRunStreamKeepAlive(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart})
	e := newEnv(t, testNode{"n1", link})
	resp := e.do("POST", "/v1/runs", `{"adapter":"exec"}`)
	runID := resp.Header.Get("X-IOP-Run-ID")
	sse := newSSE(resp.Body)
	if _, err := sse.next(); err != nil {
		t.Fatal(err)
	}
	// Cancel through the API while the stream idles: a keep-alive comes
	// first, then the cancelled terminal event ends the stream.
	if err := sse.awaitComment("keep-alive"); err != nil {
		t.Fatal(err)
	}
	readJSON(t, e.do("POST", "/v1/runs/"+runID+"/cancel", ""), 200)
	events := sse.readAll(t)
	resp.Body.Close()
	if len(events) != 1 || events[0].typ != "cancelled" {
		t.Fatalf("events %v", events)
	}
	if !slices.Contains(sse.comments, "keep-alive") {
		t.Fatalf("no keep-alive comment; comments %v", sse.comments)
	}
}

func TestCancelRun(t *testing.T) {
	live := newFakeLink(domain.RunEvent{Type: domain.EventStart})
	done := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})
	e := newEnv(t, testNode{"a", live}, testNode{"b", done})

	resp := e.do("POST", "/v1/runs", `{"adapter":"exec","node":"a"}`)
	defer resp.Body.Close()
	liveID := resp.Header.Get("X-IOP-Run-ID")

	fin := e.do("POST", "/v1/runs", `{"adapter":"exec","node":"b"}`)
	finID := fin.Header.Get("X-IOP-Run-ID")
	newSSE(fin.Body).readAll(t)
	fin.Body.Close()

	m := readJSON(t, e.do("POST", "/v1/runs/"+liveID+"/cancel", ""), 200)
	if m["run_id"] != liveID || m["node"] != "a" || m["status"] != "cancelling" {
		t.Fatalf("answer %v", m)
	}
	wantError(t, e.do("POST", "/v1/runs/"+finID+"/cancel", ""), 409, "run_finished")
	wantError(t, e.do("POST", "/v1/runs/run_nope/cancel", ""), 404, "run_not_found")
}

func TestGetAndListRuns(t *testing.T) {
	store := map[string]string{
		"run_1": `{"run_id":"run_1","adapter":"exec","status":"succeeded","background":true,"created_at":"2026-01-01T00:00:01Z"}`,
		"run_2": `{"run_id":"run_2","adapter":"exec","status":"failed","background":false,"created_at":"2026-01-01T00:00:02Z","error":{"code":"run_failed","message":"exit 1"}}`,
	}
	link := newFakeLink()
	var mu sync.Mutex
	var gotArgs []string
	lastArgs := func() string {
		mu.Lock()
		defer mu.Unlock()
		return gotArgs[len(gotArgs)-1]
	}
	link.command = func(_ context.Context, name string, args []byte) (ports.CommandStream, error) {
		mu.Lock()
		gotArgs = append(gotArgs, name+" "+string(args))
		mu.Unlock()
		switch name {
		case "run_get":
			var a struct {
				RunID string `json:"run_id"`
			}
			_ = json.Unmarshal(args, &a)
			if r, ok := store[a.RunID]; ok {
				return &fakeCmdStream{replies: []ports.CommandReply{{Final: true, Result: []byte(r)}}}, nil
			}
			return &fakeCmdStream{replies: []ports.CommandReply{{Final: true, Err: domain.Errorf(domain.CodeRunNotFound, "nope")}}}, nil
		case "runs":
			b := `{"runs":[` + store["run_1"] + `,` + store["run_2"] + `]}`
			return &fakeCmdStream{replies: []ports.CommandReply{{Final: true, Result: []byte(b)}}}, nil
		}
		return nil, domain.Errorf(domain.CodeUnknownCommand, "x")
	}
	e := newEnv(t, testNode{"n1", link})

	m := readJSON(t, e.do("GET", "/v1/runs/run_2", ""), 200)
	if m["run_id"] != "run_2" || m["node"] != "n1" || m["status"] != "failed" {
		t.Fatalf("run %v", m)
	}
	wantError(t, e.do("GET", "/v1/runs/run_zz", ""), 404, "run_not_found")

	m = readJSON(t, e.do("GET", "/v1/runs?status=failed&limit=1&node=n1", ""), 200)
	runs := m["runs"].([]any)
	if len(runs) != 1 || runs[0].(map[string]any)["run_id"] != "run_2" || runs[0].(map[string]any)["node"] != "n1" {
		t.Fatalf("runs %v", m)
	}
	if last := lastArgs(); last != `runs {"status":"failed","limit":1}` {
		t.Fatalf("command %s", last)
	}
	m = readJSON(t, e.do("GET", "/v1/runs", ""), 200)
	if runs := m["runs"].([]any); len(runs) != 2 || runs[0].(map[string]any)["run_id"] != "run_2" {
		t.Fatalf("runs %v", m)
	}
	wantError(t, e.do("GET", "/v1/runs?limit=x", ""), 400, "invalid_request")
	wantError(t, e.do("GET", "/v1/runs?status=bogus", ""), 400, "invalid_request")
	wantError(t, e.do("GET", "/v1/runs?node=zz", ""), 404, "node_not_found")
}

func TestEndSession(t *testing.T) {
	ok := newFakeLink()
	unsupported := newFakeLink()
	unsupported.terminateErr = domain.Errorf(domain.CodeSessionUnsupported, "adapter exec keeps no sessions")
	e := newEnv(t, testNode{"a", ok}, testNode{"b", unsupported})

	m := readJSON(t, e.do("DELETE", "/v1/sessions/s1?node=a&adapter=llm&target=qwen", ""), 200)
	if m["session_id"] != "s1" || m["node"] != "a" || m["adapter"] != "llm" || m["terminated"] != true {
		t.Fatalf("answer %v", m)
	}
	if got := ok.terminateCalls(); len(got) != 1 || got[0] != "llm/qwen/s1" {
		t.Fatalf("terminated %v", got)
	}
	wantError(t, e.do("DELETE", "/v1/sessions/s1?node=a", ""), 400, "invalid_request")
	wantError(t, e.do("DELETE", "/v1/sessions/s1?node=b&adapter=exec", ""), 501, "session_unsupported")
	wantError(t, e.do("DELETE", "/v1/sessions/s1?node=zz&adapter=exec", ""), 404, "node_not_found")
	wantError(t, e.do("DELETE", "/v1/sessions/s1?adapter=exec", ""), 400, "invalid_request") // two nodes: name one
}

// TestEndUnknownSession: a session the named node does not keep (a typo,
// one ended already, or one on another node) is 404 session_not_found,
// not "terminated"; when the edge knows the node the session runs on, the
// message names it.
func TestEndUnknownSession(t *testing.T) {
	a := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})
	a.kept = map[string]bool{"llm/s1": true}
	b := newFakeLink()
	b.kept = map[string]bool{}
	e := newEnv(t, testNode{"a", a}, testNode{"b", b})
	// A run of s1 on a binds the session to a.
	resp := e.do("POST", "/v1/runs", `{"node":"a","adapter":"llm","input":"hi","session_id":"s1"}`)
	newSSE(resp.Body).readAll(t)
	resp.Body.Close()

	notFound := func(path string, want ...string) {
		t.Helper()
		m := readJSON(t, e.do("DELETE", path, ""), 404)
		er, _ := m["error"].(map[string]any)
		msg, _ := er["message"].(string)
		if er["code"] != "session_not_found" {
			t.Fatalf("DELETE %s = %v, want session_not_found", path, m)
		}
		for _, w := range want {
			if !strings.Contains(msg, w) {
				t.Fatalf("DELETE %s message %q, want it to mention %s", path, msg, w)
			}
		}
	}
	notFound("/v1/sessions/typo?node=a&adapter=llm", `node "a"`, `"typo"`)
	notFound("/v1/sessions/s1?node=b&adapter=llm", `node "b"`, `"s1"`, `runs on node "a"`)
	notFound("/v1/sessions/s1?node=a&adapter=other", `node "a"`)
	m := readJSON(t, e.do("DELETE", "/v1/sessions/s1?node=a&adapter=llm", ""), 200)
	if m["terminated"] != true || m["node"] != "a" {
		t.Fatalf("answer %v", m)
	}
	notFound("/v1/sessions/s1?node=a&adapter=llm", `node "a"`, `"s1"`)
}

func TestEndSessionSingleNodeNamesIt(t *testing.T) {
	e := newEnv(t, testNode{"only", newFakeLink()})
	m := readJSON(t, e.do("DELETE", "/v1/sessions/s9?adapter=llm", ""), 200)
	if m["node"] != "only" {
		t.Fatalf("answer %v", m)
	}
}

// refuseWith makes a node refuse every run at admission with code.
func refuseWith(code string) func(*fakeLink) {
	return func(l *fakeLink) {
		l.script = []domain.RunEvent{{Type: domain.EventError, Error: &domain.ErrorInfo{Code: code, Message: "refused by the node"}}}
	}
}

// input is text or a JSON object; the node gets the text, or the object as JSON.
func TestRunInputStringOrObject(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})
	e := newEnv(t, testNode{"n1", link})
	for _, body := range []string{`{"adapter":"exec","input":"hi \"there\""}`, `{"adapter":"exec","input": {"messages":[{"role":"user","content":"hi"}]} }`} {
		resp := e.do("POST", "/v1/runs", body)
		newSSE(resp.Body).readAll(t)
		resp.Body.Close()
	}
	link.mu.Lock()
	defer link.mu.Unlock()
	if len(link.reqs) != 2 || string(link.reqs[0].Input) != `hi "there"` || string(link.reqs[1].Input) != `{"messages":[{"role":"user","content":"hi"}]}` {
		t.Fatalf("inputs %+v", link.reqs)
	}
}

// Ids with control characters or too long are refused at the edge with 400
// invalid_request naming the field, before any node sees them.
func TestIDsAreValidated(t *testing.T) {
	link := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})
	e := newEnv(t, testNode{"n1", link})
	long := strings.Repeat("x", domain.MaxIDLength+1)
	for _, tc := range []struct{ method, path, body, field string }{
		{"POST", "/v1/runs", `{"adapter":"exec","session_id":"s\u0000x"}`, "session_id"},
		{"POST", "/v1/runs", `{"adapter":"exec","target":"a\u001bb"}`, "target"},
		{"POST", "/v1/runs", `{"adapter":"exec","node":"` + long + `"}`, "node"},
		{"POST", "/v1/runs", `{"adapter":"ex\u0007ec"}`, "adapter"},
		{"GET", "/v1/runs/run%00x", "", "run id"},
		{"POST", "/v1/runs/run%0Ax/cancel", "", "run id"},
		{"GET", "/v1/runs/" + long, "", "run id"},
		{"GET", "/v1/runs?node=a%01", "", "node"},
		{"DELETE", "/v1/sessions/s%00?adapter=exec", "", "session id"},
		{"POST", "/v1/nodes/n%001/commands", `{"command":"capabilities"}`, "node id"},
		// "." and ".." name no run, session or node: a path cannot hold
		// them (the mux would clean them away), so no body may either.
		{"POST", "/v1/runs", `{"adapter":"exec","session_id":".."}`, "session_id"},
		{"POST", "/v1/runs", `{"adapter":"exec","node":"."}`, "node"},
		{"GET", "/v1/runs/.", "", "run id"},
		{"GET", "/v1/runs/..", "", "run id"},
		{"GET", "/v1/runs/%2E", "", "run id"},
		{"POST", "/v1/runs/./cancel", "", "run id"},
		{"POST", "/v1/runs/%2e%2E/cancel", "", "run id"},
		{"DELETE", "/v1/sessions/..?adapter=exec", "", "session id"},
		{"DELETE", "/v1/sessions/.?adapter=exec", "", "session id"},
		{"DELETE", "/v1/sessions/s1?adapter=exec&node=..", "", "node"},
		{"POST", "/v1/nodes/../commands", `{"command":"capabilities"}`, "node id"},
		{"GET", "/v1/nodes/n%1B%5B2J", "", "node id"},
		{"GET", "/v1/nodes/n%FF", "", "node id"},
		{"GET", "/v1/nodes/" + long, "", "node id"},
		{"GET", "/v1/nodes/.", "", "node id"},
	} {
		resp := e.do(tc.method, tc.path, tc.body)
		m := readJSON(t, resp, 400)
		errObj, _ := m["error"].(map[string]any)
		if errObj["code"] != "invalid_request" || !strings.HasPrefix(errObj["message"].(string), tc.field+" ") {
			t.Fatalf("%s %s: %v, want invalid_request naming %s", tc.method, tc.path, m, tc.field)
		}
	}
	link.mu.Lock()
	defer link.mu.Unlock()
	if len(link.reqs) != 0 {
		t.Fatalf("a node was asked to run %+v", link.reqs)
	}
}

// Body errors speak JSON, not Go: no Go type names, the field and the type.
func TestBodyErrorsInTheCallersTerms(t *testing.T) {
	e := newEnv(t, testNode{"n1", newFakeLink()})
	for body, want := range map[string]string{
		`[1,2]`:                                 "request body: expected a JSON object, got an array",
		`{"adapter":5}`:                         "request body: adapter: expected a string, got a number",
		`{"adapter":"exec","background":"yes"}`: "request body: background: expected true or false, got a string",
		`{"adapter":"exec","bogus":1}`:          `request body: unknown field "bogus"`,
		`{"adapter":`:                           "request body: the JSON ends too early",
		`{"adapter" "x"}`:                       "request body: invalid JSON at byte",
	} {
		m := readJSON(t, e.do("POST", "/v1/runs", body), 400)
		msg, _ := m["error"].(map[string]any)["message"].(string)
		if !strings.HasPrefix(msg, want) || strings.Contains(msg, "Go ") || strings.Contains(msg, "httpapi") {
			t.Errorf("%s: message %q, want %q", body, msg, want)
		}
	}
}

// A body's keys are read as spelt: encoding/json alone matched them
// case-insensitively and kept the last of a key named twice, so
// {"node":"n1","NODE":"n2"} ran on n2 while a proxy rule or audit log
// reading the JSON saw n1. Such bodies, and null, are refused before any
// node sees them; keys spelt with JSON escapes are the same keys.
func TestBodyKeysAreExact(t *testing.T) {
	link1 := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})
	link2 := newFakeLink(domain.RunEvent{Type: domain.EventStart}, domain.RunEvent{Type: domain.EventComplete})
	e := newEnv(t, testNode{"n1", link1}, testNode{"n2", link2})
	for body, want := range map[string]string{
		`{"adapter":"exec","node":"n1","NODE":"n2"}`:                  `request body: unknown field "NODE" (did you mean "node"? field names are case-sensitive)`,
		`{"Adapter":"exec","node":"n1"}`:                              `request body: unknown field "Adapter" (did you mean "adapter"?`,
		`{"adapter":"exec","node":"n1","node":"n2"}`:                  `request body: field "node" is given twice`,
		`{"adapter":"exec","node":"n1","input":"a","inp\u0075t":"b"}`: `request body: field "input" is given twice`,
		`null`: "request body: expected a JSON object, got null",
	} {
		m := readJSON(t, e.do("POST", "/v1/runs", body), 400)
		if msg, _ := m["error"].(map[string]any)["message"].(string); !strings.HasPrefix(msg, want) {
			t.Errorf("%s: message %q, want %q", body, msg, want)
		}
	}
	m := readJSON(t, e.do("POST", "/v1/nodes/n1/commands", `{"command":"capabilities","COMMAND":"runs"}`), 400)
	if msg, _ := m["error"].(map[string]any)["message"].(string); !strings.Contains(msg, `unknown field "COMMAND"`) {
		t.Errorf("node command: message %q", msg)
	}
	if n1, n2 := len(link1.requests()), len(link2.requests()); n1+n2 != 0 {
		t.Fatalf("nodes were sent %d and %d runs", n1, n2)
	}

	// An escaped spelling of a field is that field.
	resp := e.do("POST", "/v1/runs", `{"adapter":"exec","n\u006fde":"n2","input":"x"}`)
	newSSE(resp.Body).readAll(t)
	resp.Body.Close()
	if reqs := link2.requests(); len(reqs) != 1 || string(reqs[0].Input) != "x" {
		t.Fatalf("n2 was sent %+v", reqs)
	}
}
