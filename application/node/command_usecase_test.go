package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"iop/application/node"
	"iop/domain"
	"iop/domain/nodecmd"
	"iop/ports"
)

// ucCommandNode is a node with three adapters: exec (plain, one run in
// flight), chat (sessions) and ollama (serves ollama.pull and ollama.list),
// and a store holding finished runs.
type ucCommandNode struct {
	*ucNode
	ollama *ucCommandAdapter
	cmds   *node.CommandHandler
}

func newUCCommandNode(t *testing.T) *ucCommandNode {
	t.Helper()
	exec := newUCAdapter("exec", domain.Capabilities{MaxConcurrency: 2}, map[string]ucExecFunc{"": ucBlock()})
	chat := &ucSessionAdapter{
		ucAdapter: newUCAdapter("chat", domain.Capabilities{MaxConcurrency: 1, Sessions: true}, nil),
		sessions:  []domain.SessionInfo{{Target: "llama3", SessionID: "s1", Turns: 3, LastUsed: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}},
	}
	ollama := &ucCommandAdapter{
		ucAdapter: newUCAdapter("ollama", domain.Capabilities{MaxConcurrency: 1, Commands: []string{"ollama.pull", "ollama.list"}}, nil),
		progress:  []string{`{"pct":50}`, `{"pct":100}`},
		result:    `{"status":"success"}`,
	}
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"exec": exec, "chat": chat, "ollama": ollama})

	ctx := context.Background()
	base := time.Date(2020, 3, 1, 12, 0, 0, 0, time.UTC)
	finished := []struct {
		id      string
		adapter string
		ev      domain.RunEvent
	}{
		{"done-1", "exec", ucComplete(&domain.Usage{PromptTokens: 3, CompletionTokens: 4})},
		{"done-2", "exec", ucComplete(&domain.Usage{PromptTokens: 1, CompletionTokens: 1, TotalTokens: 5, CostUSD: 0.25})},
		{"failed-1", "exec", domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "exit_2", Message: "exit status 2"}}},
		{"cancelled-1", "exec", domain.RunEvent{Type: domain.EventCancelled, Error: &domain.ErrorInfo{Code: domain.CodeCancelled}}},
		{"chat-1", "chat", ucComplete(&domain.Usage{TotalTokens: 10})},
	}
	for i, f := range finished {
		at := base.Add(time.Duration(i) * time.Minute)
		r, err := domain.NewRun(ucReq(f.id, f.adapter, "t"), at)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(at); err != nil {
			t.Fatal(err)
		}
		if err := r.Finish(f.ev, at.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := n.store.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	out := n.start(ucReq("live-1", "exec", "t"))
	exec.waitStarted(t, "live-1")
	out.wait(t, "live-1 to start", func(evs []domain.RunEvent) bool { return len(evs) == 1 })

	cmds := node.NewCommandHandler(n.rt, n.runs, node.NewSessionHandler(n.rt, n.runs), n.store, "v9.9.9")
	return &ucCommandNode{ucNode: n, ollama: ollama, cmds: cmds}
}

func ucDecode[T any](t *testing.T, raw []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return v
}

func TestNodeCommands(t *testing.T) {
	since := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	stats := ports.TransportStats{Connected: true, ConnectedSince: since.UnixNano(), Reconnects: 2, LastRTTNanos: 1_500_000,
		FramesIn: 10, FramesOut: 11, BytesIn: 1000, BytesOut: 1100, Edge: "127.0.0.1:7700"}
	tests := []struct {
		name      string
		command   string
		args      string
		transport ports.TransportStatus
		wantErr   error
		check     func(t *testing.T, c *ucCommandNode, res []byte, progress []string)
	}{
		{name: "capabilities lists adapters with in-flight runs", command: node.CmdCapabilities,
			check: func(t *testing.T, _ *ucCommandNode, res []byte, _ []string) {
				got := ucDecode[nodecmd.Capabilities](t, res)
				if got.NodeID != "n1" || got.ConfigVersion != 7 || got.Version != "v9.9.9" || got.OS == "" || got.Arch == "" {
					t.Fatalf("capabilities header = %+v", got)
				}
				want := []nodecmd.Adapter{
					{Name: "chat", Type: domain.AdapterExec, MaxConcurrency: 1, InFlight: 0, Sessions: true},
					{Name: "exec", Type: domain.AdapterExec, MaxConcurrency: 2, InFlight: 1},
					{Name: "ollama", Type: domain.AdapterExec, MaxConcurrency: 1, Commands: []string{"ollama.pull", "ollama.list"}},
				}
				if len(got.Adapters) != len(want) {
					t.Fatalf("adapters = %+v", got.Adapters)
				}
				for i := range want {
					g, w := got.Adapters[i], want[i]
					if g.Name != w.Name || g.Type != w.Type || g.MaxConcurrency != w.MaxConcurrency || g.InFlight != w.InFlight || g.Sessions != w.Sessions || !slices.Equal(g.Commands, w.Commands) {
						t.Fatalf("adapter %d = %+v, want %+v", i, g, w)
					}
				}
				for _, c := range append(slices.Clone(node.BuiltinCommands), "ollama.list", "ollama.pull") {
					if !slices.Contains(got.Commands, c) {
						t.Fatalf("commands %v lack %s", got.Commands, c)
					}
				}
			}},
		{name: "usage_status sums the store", command: node.CmdUsageStatus,
			check: func(t *testing.T, _ *ucCommandNode, res []byte, _ []string) {
				got := ucDecode[nodecmd.UsageStatus](t, res)
				want := []nodecmd.AdapterUsage{
					{Adapter: "chat", RunsTotal: 1, Succeeded: 1, TotalTokens: 10},
					{Adapter: "exec", RunsTotal: 5, Succeeded: 2, Failed: 1, Cancelled: 1, Running: 1, PromptTokens: 4, CompletionTokens: 5, TotalTokens: 12, CostUSD: 0.25},
				}
				if !slices.Equal(got.Adapters, want) {
					t.Fatalf("usage = %+v, want %+v", got.Adapters, want)
				}
			}},
		{name: "runs filtered by status", command: node.CmdRuns, args: `{"status":"failed"}`,
			check: func(t *testing.T, _ *ucCommandNode, res []byte, _ []string) {
				got := ucDecode[nodecmd.RunList](t, res)
				if len(got.Runs) != 1 || got.Runs[0].RunID != "failed-1" || got.Runs[0].Error == nil || got.Runs[0].Error.Code != "exit_2" {
					t.Fatalf("runs = %+v", got.Runs)
				}
			}},
		{name: "runs newest first with a limit", command: node.CmdRuns, args: `{"adapter":"exec","limit":2}`,
			check: func(t *testing.T, _ *ucCommandNode, res []byte, _ []string) {
				got := ucDecode[nodecmd.RunList](t, res)
				if len(got.Runs) != 2 || got.Runs[0].RunID != "live-1" || got.Runs[1].RunID != "cancelled-1" {
					t.Fatalf("runs = %+v", got.Runs)
				}
			}},
		{name: "runs with an unknown status", command: node.CmdRuns, args: `{"status":"exploded"}`, wantErr: domain.ErrInvalidRequest},
		{name: "run_get", command: node.CmdRunGet, args: `{"run_id":"done-2"}`,
			check: func(t *testing.T, _ *ucCommandNode, res []byte, _ []string) {
				got := ucDecode[nodecmd.Run](t, res)
				if got.RunID != "done-2" || got.Status != "succeeded" || got.Adapter != "exec" || got.StartedAt == nil || got.FinishedAt == nil ||
					got.Usage == nil || got.Usage.TotalTokens != 5 || got.Usage.CostUSD != 0.25 || got.Error != nil {
					t.Fatalf("run = %+v", got)
				}
			}},
		{name: "run_get of an unknown run", command: node.CmdRunGet, args: `{"run_id":"nope"}`, wantErr: domain.ErrRunNotFound},
		{name: "run_get without an id", command: node.CmdRunGet, args: `{}`, wantErr: domain.ErrInvalidRequest},
		{name: "run_get with bad arguments", command: node.CmdRunGet, args: `[1,2]`, wantErr: domain.ErrInvalidRequest},
		{name: "session_list", command: node.CmdSessionList,
			check: func(t *testing.T, _ *ucCommandNode, res []byte, _ []string) {
				got := ucDecode[nodecmd.SessionList](t, res)
				if len(got.Sessions) != 1 || got.Sessions[0].Adapter != "chat" || got.Sessions[0].SessionID != "s1" || got.Sessions[0].Turns != 3 {
					t.Fatalf("sessions = %+v", got.Sessions)
				}
			}},
		{name: "unknown command", command: "reboot", wantErr: domain.ErrUnknownCommand},
		{name: "dotted command nobody serves", command: "vllm.pull", wantErr: domain.ErrCommandUnsupported},
		{name: "command of a served family that is not offered", command: "ollama.rm", wantErr: domain.ErrCommandUnsupported},
		{name: "a served family's bare name", command: "ollama", wantErr: domain.ErrCommandUnsupported},
		{name: "adapter command with progress", command: "ollama.pull", args: `{"model":"llama3"}`,
			check: func(t *testing.T, c *ucCommandNode, res []byte, progress []string) {
				if string(res) != `{"status":"success"}` {
					t.Fatalf("result = %s", res)
				}
				if !slices.Equal(progress, []string{`{"pct":50}`, `{"pct":100}`}) {
					t.Fatalf("progress = %v", progress)
				}
				c.ollama.cmu.Lock()
				defer c.ollama.cmu.Unlock()
				if !slices.Equal(c.ollama.calls, []string{`ollama.pull {"model":"llama3"}`}) {
					t.Fatalf("adapter got %v", c.ollama.calls)
				}
			}},
		{name: "transport_status without a transport", command: node.CmdTransportStatus, wantErr: domain.ErrCommandUnsupported},
		{name: "transport_status", command: node.CmdTransportStatus, transport: ucTransport{stats: stats},
			check: func(t *testing.T, _ *ucCommandNode, res []byte, _ []string) {
				got := ucDecode[nodecmd.TransportStatus](t, res)
				if !got.Connected || got.ConnectedSince == nil || !got.ConnectedSince.Equal(since) || got.Reconnects != 2 || got.LastRTTMillis != 1.5 ||
					got.FramesIn != 10 || got.FramesOut != 11 || got.BytesIn != 1000 || got.BytesOut != 1100 || got.Edge != "127.0.0.1:7700" || got.RunsInFlight != 1 {
					t.Fatalf("transport status = %+v", got)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			c := newUCCommandNode(t)
			if tc.transport != nil {
				c.cmds.SetTransport(tc.transport)
			}
			var (
				mu       sync.Mutex
				progress []string
			)
			res, err := c.cmds.RunCommand(context.Background(), tc.command, []byte(tc.args), func(p []byte) error {
				mu.Lock()
				defer mu.Unlock()
				progress = append(progress, string(p))
				return nil
			})
			if (err == nil) != (tc.wantErr == nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("RunCommand = %s, %v; want error %v", res, err, tc.wantErr)
			}
			if tc.check != nil {
				mu.Lock()
				defer mu.Unlock()
				tc.check(t, c, res, progress)
			}
		})
	}
}

// Arguments of the wrong JSON shape are refused in JSON's terms, never Go's
// ("cannot unmarshal array into Go value of type nodecmd.RunsArgs").
func TestCommandArgumentsInJSONTerms(t *testing.T) {
	ucNoLeaks(t)
	c := newUCCommandNode(t)
	for _, tc := range []struct{ command, args, want string }{
		{node.CmdRuns, `[1]`, "command arguments must be a JSON object, not an array"},
		{node.CmdRunGet, `"run-1"`, "command arguments must be a JSON object, not a string"},
		{node.CmdRuns, `{"limit":"ten"}`, "command arguments: limit: expected a whole number, got a string"},
		{node.CmdRunGet, `{"run_id":5}`, "command arguments: run_id: expected a string, got a number"},
		{node.CmdRuns, `{"limit":`, "command arguments are not valid JSON (at byte 9)"},
	} {
		_, err := c.cmds.RunCommand(context.Background(), tc.command, []byte(tc.args), nil)
		if !errors.Is(err, domain.ErrInvalidRequest) || domain.MessageOf(err) != tc.want {
			t.Errorf("%s %s: %v, want %q", tc.command, tc.args, err, tc.want)
		}
	}
}

// session_list answers a page at a time, newest first across adapters,
// with a cursor to the next: 150,000 sessions in one answer were more than
// the edge accepts of a command result, and grouping them all held the
// store's one connection.
func TestSessionListPages(t *testing.T) {
	ucNoLeaks(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(n int, every time.Duration) []domain.SessionInfo {
		var out []domain.SessionInfo
		for i := range n {
			out = append(out, domain.SessionInfo{Target: "m", SessionID: fmt.Sprintf("s%04d", i), Turns: i, LastUsed: base.Add(time.Duration(i) * every)})
		}
		return out
	}
	chatA := &ucSessionAdapter{ucAdapter: newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1, Sessions: true}, nil), sessions: mk(700, 2*time.Second)}
	chatB := &ucSessionAdapter{ucAdapter: newUCAdapter("b", domain.Capabilities{MaxConcurrency: 1, Sessions: true}, nil), sessions: mk(600, 3*time.Second)}
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": chatA, "b": chatB, "plain": newUCAdapter("plain", domain.Capabilities{MaxConcurrency: 1}, nil)})
	cmds := node.NewCommandHandler(n.rt, n.runs, node.NewSessionHandler(n.rt, n.runs), n.store, "v")
	ctx := context.Background()
	list := func(args string) (nodecmd.SessionList, error) {
		raw, err := cmds.RunCommand(ctx, node.CmdSessionList, []byte(args), nil)
		if err != nil {
			return nodecmd.SessionList{}, err
		}
		return ucDecode[nodecmd.SessionList](t, raw), nil
	}
	// Everything, in pages of 250 (and by default 100), in listing order.
	for _, tc := range []struct {
		args   string
		filter string
		want   int
		page   int
	}{
		{``, "", 1300, 100},
		{`{"limit":250}`, "", 1300, 250},
		{`{"limit":250,"adapter":"b"}`, "b", 600, 250},
		{`{"limit":5000}`, "", 1300, 1000},
	} {
		var got []nodecmd.Session
		args := tc.args
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatalf("%s: no end after 20 pages", tc.args)
			}
			l, err := list(args)
			if err != nil {
				t.Fatalf("%s: %v", args, err)
			}
			if len(l.Sessions) > tc.page || (l.NextCursor != "" && len(l.Sessions) != tc.page) {
				t.Fatalf("%s: page of %d sessions, next %q; want pages of %d", args, len(l.Sessions), l.NextCursor, tc.page)
			}
			got = append(got, l.Sessions...)
			if l.NextCursor == "" {
				break
			}
			var a map[string]any
			if tc.args != "" {
				_ = json.Unmarshal([]byte(tc.args), &a)
			} else {
				a = map[string]any{}
			}
			a["cursor"] = l.NextCursor
			b, _ := json.Marshal(a)
			args = string(b)
		}
		if len(got) != tc.want {
			t.Fatalf("%s: %d sessions in all, want %d", tc.args, len(got), tc.want)
		}
		seen := map[string]bool{}
		for i, s := range got {
			k := s.Adapter + "/" + s.SessionID
			if seen[k] || (tc.filter != "" && s.Adapter != tc.filter) {
				t.Fatalf("%s: session %d %s again or of another adapter", tc.args, i, k)
			}
			seen[k] = true
			if i > 0 {
				prev := domain.SessionKey{LastUsed: got[i-1].LastUsed, Adapter: got[i-1].Adapter, SessionID: got[i-1].SessionID}
				if !prev.Before(domain.SessionKey{LastUsed: s.LastUsed, Adapter: s.Adapter, SessionID: s.SessionID}) {
					t.Fatalf("%s: session %d (%s) out of order after %+v", tc.args, i, k, got[i-1])
				}
			}
		}
		if got[0].Adapter != "b" || got[0].SessionID != "s0599" { // b's newest, 1797 s after base
			t.Fatalf("%s: first session %+v, want b/s0599", tc.args, got[0])
		}
	}
	for _, args := range []string{`{"limit":-1}`, `{"cursor":"nope"}`, `{"cursor":"WzEsImEiXQ"}`, `{"limit":"ten"}`} {
		if _, err := list(args); !errors.Is(err, domain.ErrInvalidRequest) {
			t.Errorf("%s: %v, want invalid_request", args, err)
		}
	}
	if _, err := list(`{"adapter":"typo"}`); !errors.Is(err, domain.ErrAdapterNotFound) {
		t.Errorf("unknown adapter: %v, want adapter_not_found", err)
	}
	if l, err := list(`{"adapter":"plain"}`); err != nil || len(l.Sessions) != 0 || l.NextCursor != "" {
		t.Errorf("an adapter without sessions: %+v, %v; want none", l, err)
	}
}

// A store written by an older node may hold error messages of megabytes
// (newer nodes cut them before storing): runs and run_get answer them cut
// as a new run's, so a page of such runs still fits the edge's limit.
func TestStoredLongErrorMessagesAnsweredCut(t *testing.T) {
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"exec": newUCAdapter("exec", domain.Capabilities{MaxConcurrency: 1}, nil)})
	ctx := context.Background()
	long := strings.Repeat("é", 3<<20/2) + "\xff" // 3 MiB, and not valid UTF-8
	at := time.Date(2020, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range 6 {
		r, err := domain.NewRun(ucReq(fmt.Sprintf("old-%d", i), "exec", "t"), at)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(at); err != nil {
			t.Fatal(err)
		}
		if err := r.Finish(domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "provider_error", Message: long}}, at); err != nil {
			t.Fatal(err)
		}
		if err := n.store.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	cmds := node.NewCommandHandler(n.rt, n.runs, node.NewSessionHandler(n.rt, n.runs), n.store, "v")
	raw, err := cmds.RunCommand(ctx, "runs", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > 6*(node.MaxErrorMessage+1024) {
		t.Fatalf("runs answered %d bytes for 6 runs", len(raw))
	}
	one, err := cmds.RunCommand(ctx, "run_get", []byte(`{"run_id":"old-0"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := ucDecode[nodecmd.Run](t, one)
	if rec.Error == nil || len(rec.Error.Message) > node.MaxErrorMessage || !utf8.ValidString(rec.Error.Message) ||
		!strings.HasSuffix(rec.Error.Message, fmt.Sprintf("(%d bytes in all)", len(long)+2)) {
		t.Fatalf("run_get error message: %d bytes, valid %v", len(rec.Error.Message), rec.Error != nil && utf8.ValidString(rec.Error.Message))
	}
}
