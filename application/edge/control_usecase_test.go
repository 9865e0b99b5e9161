package edge_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

func TestCancelRunUseCase(t *testing.T) {
	tests := []struct {
		name string
		// run: "active" dispatches a run to node a first, "finished" also
		// ends it, "" leaves the run unknown to this edge.
		run        string
		removeNode bool             // node a disconnects before the cancel
		linkErrs   map[string]error // CancelRun answer per node
		wantCode   string
		wantNode   string
		wantAsked  []string // nodes asked, sorted
	}{
		{name: "active run is cancelled on its node", run: "active",
			wantNode: "a", wantAsked: []string{"a"}},
		{name: "active run the node already finished", run: "active",
			linkErrs: map[string]error{"a": domain.Errorf(domain.CodeRunFinished, "run has already finished")},
			wantCode: domain.CodeRunFinished, wantNode: "a", wantAsked: []string{"a"}},
		{name: "finished run answers without asking", run: "finished",
			wantCode: domain.CodeRunFinished, wantNode: "a"},
		{name: "active run whose node went away", run: "active", removeNode: true,
			wantCode: domain.CodeNodeNotFound, wantNode: "a"},
		{name: "unknown run nobody knows",
			linkErrs: map[string]error{"a": domain.ErrRunNotFound, "b": domain.Errorf(domain.CodeRunNotFound, "not here")},
			wantCode: domain.CodeRunNotFound, wantAsked: []string{"a", "b"}},
		{name: "unknown run found on another node",
			linkErrs: map[string]error{"a": domain.ErrRunNotFound},
			wantNode: "b", wantAsked: []string{"a", "b"}},
		{name: "unknown run a node reports finished",
			linkErrs: map[string]error{"a": domain.ErrRunNotFound, "b": domain.Errorf(domain.CodeRunFinished, "run has already finished (succeeded)")},
			wantCode: domain.CodeRunFinished, wantNode: "b", wantAsked: []string{"a", "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}}, ucNodeSpec{"b", []string{"exec"}})
			runID := "run_from_before_a_restart"
			if tc.run != "" {
				rh, err := e.submit.Handle(context.Background(), edge.SubmitRun{Node: "a", Adapter: "exec"})
				if err != nil {
					t.Fatal(err)
				}
				runID = rh.RunID
				if tc.run == "finished" {
					e.links["a"].stream(t, runID).push(ucEv(2, domain.EventComplete, ""))
					if ev, err := ucNext(t, rh); err != nil || ev.Type != domain.EventStart {
						t.Fatalf("first = %+v, %v", ev, err)
					}
					if ev, err := ucNext(t, rh); err != nil || ev.Type != domain.EventComplete {
						t.Fatalf("terminal = %+v, %v", ev, err)
					}
				}
			}
			if tc.removeNode {
				e.reg.Remove("a", e.links["a"])
			}
			for id, err := range tc.linkErrs {
				e.links[id].cancelErr = err
			}
			h := edge.NewCancelRunHandler(e.reg, e.runs)
			node, err := h.Handle(context.Background(), runID)
			if got := ucCode(err); got != tc.wantCode {
				t.Fatalf("Handle = %q, %v (code %q), want code %q", node, err, got, tc.wantCode)
			}
			if node != tc.wantNode {
				t.Fatalf("node = %q, want %q", node, tc.wantNode)
			}
			var asked []string
			for id, l := range e.links {
				calls := l.cancelCalls()
				if len(calls) > 1 || (len(calls) == 1 && calls[0] != runID) {
					t.Fatalf("node %s got cancels %v, want at most [%s]", id, calls, runID)
				}
				if len(calls) == 1 {
					asked = append(asked, id)
				}
			}
			slices.Sort(asked)
			if !slices.Equal(asked, tc.wantAsked) {
				t.Fatalf("nodes asked = %v, want %v", asked, tc.wantAsked)
			}
		})
	}
}

func TestCancelRunRequiresAnID(t *testing.T) {
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	if _, err := edge.NewCancelRunHandler(e.reg, e.runs).Handle(context.Background(), ""); !errors.Is(err, domain.ErrInvalidRequest) {
		t.Fatalf("err = %v, want invalid_request", err)
	}
	if c := e.links["a"].cancelCalls(); len(c) != 0 {
		t.Fatalf("asked the node anyway: %v", c)
	}
}

func TestTerminateSessionUseCase(t *testing.T) {
	tests := []struct {
		name      string
		nodes     []ucNodeSpec
		linkErr   error
		cmd       edge.TerminateSession
		wantErr   error
		wantCalls []string // on node a
	}{
		{name: "sent to the named node",
			nodes:     []ucNodeSpec{{"a", []string{"chat"}}, {"b", []string{"chat"}}},
			cmd:       edge.TerminateSession{Node: "a", Adapter: "chat", Target: "llama3", SessionID: "s1"},
			wantCalls: []string{"chat/llama3/s1"}},
		{name: "the only node when none is named",
			nodes:     []ucNodeSpec{{"a", []string{"chat"}}},
			cmd:       edge.TerminateSession{Adapter: "chat", SessionID: "s1"},
			wantCalls: []string{"chat//s1"}},
		{name: "adapter without sessions",
			nodes:     []ucNodeSpec{{"a", []string{"exec"}}},
			linkErr:   domain.Errorf(domain.CodeSessionUnsupported, "adapter %q (exec) does not keep sessions", "exec"),
			cmd:       edge.TerminateSession{Node: "a", Adapter: "exec", SessionID: "s1"},
			wantErr:   domain.ErrSessionUnsupported,
			wantCalls: []string{"exec//s1"}},
		{name: "adapter missing",
			nodes:   []ucNodeSpec{{"a", []string{"chat"}}},
			cmd:     edge.TerminateSession{Node: "a", SessionID: "s1"},
			wantErr: domain.ErrInvalidRequest},
		{name: "session missing",
			nodes:   []ucNodeSpec{{"a", []string{"chat"}}},
			cmd:     edge.TerminateSession{Node: "a", Adapter: "chat"},
			wantErr: domain.ErrInvalidRequest},
		{name: "unknown node",
			nodes:   []ucNodeSpec{{"a", []string{"chat"}}},
			cmd:     edge.TerminateSession{Node: "zz", Adapter: "chat", SessionID: "s1"},
			wantErr: domain.ErrNodeNotFound},
		{name: "several nodes and none named",
			nodes:   []ucNodeSpec{{"a", []string{"chat"}}, {"b", []string{"chat"}}},
			cmd:     edge.TerminateSession{Adapter: "chat", SessionID: "s1"},
			wantErr: domain.ErrInvalidRequest},
		{name: "no node connected",
			cmd:     edge.TerminateSession{Adapter: "chat", SessionID: "s1"},
			wantErr: domain.ErrNoNodeAvailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newUCEdge(t, tc.nodes...)
			for _, l := range e.links {
				l.termErr = tc.linkErr
			}
			err := edge.NewTerminateSessionHandler(e.reg).Handle(context.Background(), tc.cmd)
			if (err == nil) != (tc.wantErr == nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("Handle = %v, want %v", err, tc.wantErr)
			}
			for id, l := range e.links {
				_, _, calls, _, _, _ := l.snapshot()
				want := []string(nil)
				if id == "a" {
					want = tc.wantCalls
				}
				if !slices.Equal(calls, want) {
					t.Fatalf("node %s TerminateSession calls = %v, want %v", id, calls, want)
				}
			}
		})
	}
}

// TestTerminateSessionNotFound: a node that does not keep the session
// answers session_not_found, which names the node the edge knows the
// session runs on; the edge unbinds the session only from the node that
// said so, and remembers nothing of a session it did not know (so that
// its next run still recalls its node from the history).
func TestTerminateSessionNotFound(t *testing.T) {
	e := newUCEdge(t, ucNodeSpec{"a", []string{"chat"}}, ucNodeSpec{"b", []string{"chat"}})
	for _, l := range e.links {
		l.termErr = domain.Errorf(domain.CodeSessionNotFound, "no such session")
	}
	e.reg.RememberSession("chat", "s1", "a")
	h := edge.NewTerminateSessionHandler(e.reg)
	ctx := context.Background()

	err := h.Handle(ctx, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "s1"})
	if !errors.Is(err, domain.ErrSessionNotFound) || !strings.Contains(err.Error(), `node "b"`) || !strings.Contains(err.Error(), `runs on node "a"`) {
		t.Fatalf("ending s1 on b = %v, want session_not_found naming b and a", err)
	}
	if n, ok := e.reg.SessionNode("chat", "s1"); !ok || n != "a" {
		t.Fatalf("s1 bound to %q, %v after b's not found; want a", n, ok)
	}

	err = h.Handle(ctx, edge.TerminateSession{Node: "b", Adapter: "chat", SessionID: "typo"})
	if !errors.Is(err, domain.ErrSessionNotFound) || strings.Contains(err.Error(), "runs on") {
		t.Fatalf("ending typo = %v, want session_not_found naming no other node", err)
	}
	if edge.SessionKnown(e.reg, "chat", "typo") {
		t.Fatal("the edge remembers a session no node keeps")
	}

	err = h.Handle(ctx, edge.TerminateSession{Node: "a", Adapter: "chat", SessionID: "s1"})
	if !errors.Is(err, domain.ErrSessionNotFound) || strings.Contains(err.Error(), "runs on") {
		t.Fatalf("ending s1 on a that lost it = %v, want session_not_found", err)
	}
	if n, ok := e.reg.SessionNode("chat", "s1"); ok {
		t.Fatalf("s1 still bound to %q after its node said it keeps no such session", n)
	}
}

func TestNodeCommandCall(t *testing.T) {
	tests := []struct {
		name       string
		node       string
		command    string
		replies    map[string][]ports.CommandReply
		block      bool
		commandErr error
		wantResult string
		wantErr    error
	}{
		{name: "final result", node: "a", command: "capabilities",
			replies:    map[string][]ports.CommandReply{"capabilities": {{Final: true, Result: []byte(`{"node_id":"a"}`)}}},
			wantResult: `{"node_id":"a"}`},
		{name: "progress is skipped", node: "a", command: "ollama.pull",
			replies: map[string][]ports.CommandReply{"ollama.pull": {
				{Progress: []byte(`{"pct":10}`)}, {Progress: []byte(`{"pct":90}`)}, {Final: true, Result: []byte(`{"status":"success"}`)},
			}},
			wantResult: `{"status":"success"}`},
		{name: "the node's error", node: "a", command: "bogus", wantErr: domain.ErrUnknownCommand},
		{name: "the link refuses", node: "a", command: "capabilities",
			commandErr: domain.Errorf(domain.CodeNodeDisconnected, "link down"), wantErr: domain.ErrNodeDisconnected},
		{name: "no answer before the deadline", node: "a", command: "capabilities", block: true, wantErr: domain.ErrTimeout},
		{name: "unknown node", node: "zz", command: "capabilities", wantErr: domain.ErrNodeNotFound},
		{name: "empty command", node: "a", command: "  ", wantErr: domain.ErrInvalidRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
			l := e.links["a"]
			l.commands, l.blockCmds, l.commandErr = tc.replies, tc.block, tc.commandErr
			h := edge.NewNodeCommandHandler(e.reg)
			h.Timeout = 30 * time.Millisecond
			var (
				res []byte
				err error
			)
			ucWithin(t, "Call", func() { res, err = h.Call(context.Background(), tc.node, tc.command, []byte(`{"x":1}`)) })
			if (err == nil) != (tc.wantErr == nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("Call = %s, %v; want error %v", res, err, tc.wantErr)
			}
			if string(res) != tc.wantResult {
				t.Fatalf("result = %s, want %s", res, tc.wantResult)
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, s := range l.cmdStreams {
				select {
				case <-s.closed:
				default:
					t.Fatal("Call left the command stream open")
				}
			}
			if tc.node == "a" && tc.wantErr != domain.ErrInvalidRequest && (len(l.cmdCalls) != 1 || l.cmdCalls[0] != tc.command+` {"x":1}`) {
				t.Fatalf("commands sent = %q", l.cmdCalls)
			}
		})
	}
}

func TestNodeCommandHandleStreamsProgress(t *testing.T) {
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	e.links["a"].commands = map[string][]ports.CommandReply{"ollama.pull": {
		{Progress: []byte(`1`)}, {Progress: []byte(`2`)}, {Final: true, Result: []byte(`"ok"`)},
	}}
	cs, ctx, cancel, err := edge.NewNodeCommandHandler(e.reg).Handle(context.Background(), "", "ollama.pull", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	defer cs.Close()
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) < time.Hour {
		t.Fatalf("long command deadline = %v, %v; want the long timeout", dl, ok)
	}
	var progress []string
	for {
		r, err := cs.Recv(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if r.Final {
			if string(r.Result) != `"ok"` {
				t.Fatalf("final = %s", r.Result)
			}
			break
		}
		progress = append(progress, string(r.Progress))
	}
	if !slices.Equal(progress, []string{"1", "2"}) {
		t.Fatalf("progress = %v", progress)
	}
}

// A node's command result or progress report that is not JSON is never
// passed on as the edge's JSON: the result fails the command with
// bad_result, the progress report is dropped.
func TestNodeCommandResultThatIsNotJSON(t *testing.T) {
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
	e.links["a"].commands = map[string][]ports.CommandReply{
		"capabilities": {{Final: true, Result: []byte("<html>\x1b[2J</html>")}},
		"ollama.pull":  {{Progress: []byte("\x1b]0;x\x07")}, {Progress: []byte(`{"pct":1}`)}, {Final: true, Result: []byte(`{"status":"success"}`)}},
		"empty":        {{Final: true}},
	}
	h := edge.NewNodeCommandHandler(e.reg)
	res, err := h.Call(context.Background(), "a", "capabilities", nil)
	if domain.CodeOf(err) != domain.CodeBadResult || res != nil || !strings.Contains(err.Error(), "not JSON") {
		t.Fatalf("Call = %q, %v; want bad_result", res, err)
	}
	if res, err := h.Call(context.Background(), "a", "empty", nil); err != nil || len(res) != 0 {
		t.Fatalf("an empty result = %q, %v; want it passed on (the HTTP API answers {})", res, err)
	}
	cs, ctx, cancel, err := h.Handle(context.Background(), "a", "ollama.pull", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	defer cs.Close()
	var got []string
	for {
		r, err := cs.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if r.Final {
			got = append(got, "final "+string(r.Result))
			break
		}
		got = append(got, string(r.Progress))
	}
	if want := []string{`{"pct":1}`, `final {"status":"success"}`}; !slices.Equal(got, want) {
		t.Fatalf("replies %q, want %q", got, want)
	}
}
