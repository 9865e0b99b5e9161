package edge_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// qrLink is a node link whose commands answer from a map of run id → run
// JSON (the node's store); every other link method is inert.
type qrLink struct {
	id   string
	runs map[string]string // run id → JSON object as run_get returns it
	fail error             // when set, every command fails with it

	mu    sync.Mutex
	calls []string // "name args"
}

func (l *qrLink) Command(_ context.Context, name string, args []byte) (ports.CommandStream, error) {
	l.mu.Lock()
	l.calls = append(l.calls, name+" "+string(args))
	l.mu.Unlock()
	if l.fail != nil {
		return &qrStream{reply: ports.CommandReply{Final: true, Err: l.fail}}, nil
	}
	switch name {
	case "run_get":
		var a struct {
			RunID string `json:"run_id"`
		}
		_ = json.Unmarshal(args, &a)
		r, ok := l.runs[a.RunID]
		if !ok {
			return &qrStream{reply: ports.CommandReply{Final: true, Err: domain.Errorf(domain.CodeRunNotFound, "run %s is not known on this node", a.RunID)}}, nil
		}
		return &qrStream{reply: ports.CommandReply{Final: true, Result: []byte(r)}}, nil
	case "runs":
		var a struct {
			Status string `json:"status"`
			Limit  int    `json:"limit"`
		}
		_ = json.Unmarshal(args, &a)
		var list []json.RawMessage
		for _, r := range l.runs {
			var s struct {
				Status string `json:"status"`
			}
			_ = json.Unmarshal([]byte(r), &s)
			if a.Status == "" || a.Status == s.Status {
				list = append(list, json.RawMessage(r))
			}
		}
		b, _ := json.Marshal(map[string]any{"runs": list})
		return &qrStream{reply: ports.CommandReply{Final: true, Result: b}}, nil
	}
	return &qrStream{reply: ports.CommandReply{Final: true, Err: domain.Errorf(domain.CodeUnknownCommand, "unknown command %q", name)}}, nil
}

func (l *qrLink) StartRun(context.Context, domain.RunRequest) (ports.RunStream, error) {
	return &qrRunStream{}, nil
}
func (l *qrLink) CancelRun(context.Context, string, string) error { return nil }
func (l *qrLink) TerminateSession(context.Context, string, string, string) error {
	return nil
}
func (l *qrLink) OpenTunnel(context.Context, domain.TunnelRequest, io.Reader) (ports.TunnelStream, error) {
	return nil, errors.New("no tunnels")
}
func (l *qrLink) PushConfig(context.Context, domain.NodeConfig) error { return nil }
func (l *qrLink) Close(string)                                        {}

func (l *qrLink) commands() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

type qrStream struct {
	reply ports.CommandReply
	done  bool
}

func (s *qrStream) Recv(ctx context.Context) (ports.CommandReply, error) {
	if s.done {
		return ports.CommandReply{}, io.EOF
	}
	s.done = true
	return s.reply, ctx.Err()
}
func (s *qrStream) Close() {}

// qrRunStream starts and ends at once with complete.
type qrRunStream struct{ n int }

func (s *qrRunStream) Recv(context.Context) (domain.RunEvent, error) {
	s.n++
	switch s.n {
	case 1:
		return domain.RunEvent{Seq: 1, Type: domain.EventStart}, nil
	case 2:
		return domain.RunEvent{Seq: 2, Type: domain.EventComplete}, nil
	}
	return domain.RunEvent{}, io.EOF
}
func (s *qrRunStream) Close() {}

type qrBus struct{}

func (qrBus) Publish(domain.BusEvent) {}

func qrRegistry(t *testing.T, links ...*qrLink) *edge.Registry {
	t.Helper()
	reg := edge.NewRegistry()
	for _, l := range links {
		cfg := domain.NodeConfig{NodeID: l.id, Adapters: []domain.AdapterConfig{{Name: "exec", Type: "exec", MaxConcurrency: 2}}}
		if err := reg.Admit(&edge.LiveNode{ID: l.id, Link: l, Config: cfg}); err != nil {
			t.Fatal(err)
		}
	}
	return reg
}

func qrRun(id, status, created string) string {
	b, _ := json.Marshal(map[string]any{"run_id": id, "adapter": "exec", "status": status, "created_at": created, "background": false})
	return string(b)
}

func qrDecodeRun(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("run JSON %s: %v", raw, err)
	}
	return m
}

func TestGetRun(t *testing.T) {
	a := &qrLink{id: "a", runs: map[string]string{"run_a1": qrRun("run_a1", "succeeded", "2026-01-01T00:00:00Z")}}
	b := &qrLink{id: "b", runs: map[string]string{"run_b1": qrRun("run_b1", "failed", "2026-01-02T00:00:00Z")}}
	broken := &qrLink{id: "c", fail: domain.Errorf(domain.CodeTimeout, "slow")}
	liar := &qrLink{id: "l", runs: map[string]string{"run_b1": qrRun("run_l9", "succeeded", "2026-01-03T00:00:00Z")}}
	garbage := &qrLink{id: "g", runs: map[string]string{"run_b1": `"not a record"`}}

	tests := []struct {
		name     string
		links    []*qrLink
		run      string
		wantNode string
		wantCode string
	}{
		{name: "found on the second node", links: []*qrLink{a, b}, run: "run_b1", wantNode: "b"},
		{name: "found on the first node", links: []*qrLink{a, b}, run: "run_a1", wantNode: "a"},
		{name: "nowhere", links: []*qrLink{a, b}, run: "run_zz", wantCode: domain.CodeRunNotFound},
		{name: "no nodes", run: "run_a1", wantCode: domain.CodeRunNotFound},
		{name: "one node fails, another has it", links: []*qrLink{broken, b}, run: "run_b1", wantNode: "b"},
		{name: "one node fails, nobody has it", links: []*qrLink{broken, a}, run: "run_zz", wantCode: domain.CodeRunNotFound},
		{name: "empty id", links: []*qrLink{a}, run: "", wantCode: domain.CodeInvalidRequest},
		// A node that answers for any run with the record of another (its
		// own) does not know the run asked for.
		{name: "another run's record", links: []*qrLink{liar}, run: "run_b1", wantCode: domain.CodeRunNotFound},
		{name: "another run's record, the run on another node", links: []*qrLink{liar, b}, run: "run_b1", wantNode: "b"},
		{name: "no record at all, the run on another node", links: []*qrLink{garbage, b}, run: "run_b1", wantNode: "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := qrRegistry(t, tt.links...)
			h := edge.NewGetRunHandler(reg, edge.NewRunTracker(0), edge.NewNodeCommandHandler(reg))
			raw, err := h.Handle(context.Background(), tt.run)
			if tt.wantCode != "" {
				if domain.CodeOf(err) != tt.wantCode {
					t.Fatalf("err = %v, want code %s", err, tt.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m := qrDecodeRun(t, raw)
			if m["node"] != tt.wantNode || m["run_id"] != tt.run {
				t.Fatalf("run = %v, want node %s", m, tt.wantNode)
			}
		})
	}
}

func TestGetRunAsksTheTrackedNodeOnly(t *testing.T) {
	a := &qrLink{id: "a", runs: map[string]string{}}
	b := &qrLink{id: "b", runs: map[string]string{}}
	reg := qrRegistry(t, a, b)
	tracker := edge.NewRunTracker(0)
	submit := edge.NewSubmitRunHandler(reg, tracker, qrBus{}, nil)
	defer submit.Stop()
	rh, err := submit.Handle(context.Background(), edge.SubmitRun{Node: "b", Adapter: "exec"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := rh.Next(context.Background()); err != nil {
			break
		}
	}
	rh.Close()
	b.runs[rh.RunID] = qrRun(rh.RunID, "succeeded", "2026-01-01T00:00:00Z")

	h := edge.NewGetRunHandler(reg, tracker, edge.NewNodeCommandHandler(reg))
	raw, err := h.Handle(context.Background(), rh.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if m := qrDecodeRun(t, raw); m["node"] != "b" || m["status"] != "succeeded" {
		t.Fatalf("run = %v", m)
	}
	if len(a.commands()) != 0 {
		t.Fatalf("node a was asked: %v", a.commands())
	}

	// The tracked node's answer with another run's record is run_not_found.
	b.runs[rh.RunID] = qrRun("run_other", "succeeded", "2026-01-01T00:00:00Z")
	if _, err := h.Handle(context.Background(), rh.RunID); !errors.Is(err, domain.ErrRunNotFound) {
		t.Fatalf("another run's record: err = %v, want run_not_found", err)
	}

	// The tracked node's own answer stands, even when it is run_not_found.
	delete(b.runs, rh.RunID)
	a.runs[rh.RunID] = qrRun(rh.RunID, "succeeded", "2026-01-01T00:00:00Z")
	if _, err := h.Handle(context.Background(), rh.RunID); !errors.Is(err, domain.ErrRunNotFound) {
		t.Fatalf("err = %v, want run_not_found", err)
	}
}

func TestListRuns(t *testing.T) {
	a := &qrLink{id: "a", runs: map[string]string{
		"run_a1": qrRun("run_a1", "succeeded", "2026-01-01T00:00:01Z"),
		"run_a2": qrRun("run_a2", "failed", "2026-01-01T00:00:04Z"),
	}}
	b := &qrLink{id: "b", runs: map[string]string{
		"run_b1": qrRun("run_b1", "succeeded", "2026-01-01T00:00:03Z"),
		"run_b2": qrRun("run_b2", "running", "2026-01-01T00:00:02Z"),
	}}
	broken := &qrLink{id: "c", fail: domain.Errorf(domain.CodeNodeDisconnected, "gone")}

	tests := []struct {
		name         string
		links        []*qrLink
		q            edge.ListRuns
		want         []string // run_id@node, in order
		wantFailures []string
		wantCode     string
	}{
		{name: "every node, newest first", links: []*qrLink{a, b}, want: []string{"run_a2@a", "run_b1@b", "run_b2@b", "run_a1@a"}},
		{name: "limit", links: []*qrLink{a, b}, q: edge.ListRuns{Limit: 2}, want: []string{"run_a2@a", "run_b1@b"}},
		{name: "status", links: []*qrLink{a, b}, q: edge.ListRuns{Status: "succeeded"}, want: []string{"run_b1@b", "run_a1@a"}},
		{name: "one node", links: []*qrLink{a, b}, q: edge.ListRuns{Node: "b"}, want: []string{"run_b1@b", "run_b2@b"}},
		{name: "unknown node", links: []*qrLink{a}, q: edge.ListRuns{Node: "zz"}, wantCode: domain.CodeNodeNotFound},
		{name: "no nodes", want: []string{}},
		{name: "bad status", links: []*qrLink{a}, q: edge.ListRuns{Status: "done"}, wantCode: domain.CodeInvalidRequest},
		{name: "negative limit", links: []*qrLink{a}, q: edge.ListRuns{Limit: -1}, wantCode: domain.CodeInvalidRequest},
		{name: "a failing node is reported", links: []*qrLink{a, broken}, q: edge.ListRuns{Limit: 1}, want: []string{"run_a2@a"}, wantFailures: []string{"c"}},
		{name: "every node failing is an error", links: []*qrLink{broken}, wantCode: domain.CodeNodeDisconnected},
		{name: "the named node failing is an error", links: []*qrLink{a, broken}, q: edge.ListRuns{Node: "c"}, wantCode: domain.CodeNodeDisconnected},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := qrRegistry(t, tt.links...)
			h := edge.NewListRunsHandler(reg, edge.NewNodeCommandHandler(reg))
			got, err := h.Handle(context.Background(), tt.q)
			if tt.wantCode != "" {
				if domain.CodeOf(err) != tt.wantCode {
					t.Fatalf("err = %v, want code %s", err, tt.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ids := []string{}
			for _, r := range got.Runs {
				m := qrDecodeRun(t, r)
				ids = append(ids, m["run_id"].(string)+"@"+m["node"].(string))
			}
			if !slices.Equal(ids, tt.want) {
				t.Fatalf("runs = %v, want %v", ids, tt.want)
			}
			var failed []string
			for _, f := range got.Failures {
				failed = append(failed, f.Node)
			}
			if !slices.Equal(failed, tt.wantFailures) {
				t.Fatalf("failures = %v, want %v", failed, tt.wantFailures)
			}
		})
	}
}

func TestListRunsSendsStatusAndLimit(t *testing.T) {
	a := &qrLink{id: "a", runs: map[string]string{}}
	reg := qrRegistry(t, a)
	h := edge.NewListRunsHandler(reg, edge.NewNodeCommandHandler(reg))
	if _, err := h.Handle(context.Background(), edge.ListRuns{Status: "running"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Handle(context.Background(), edge.ListRuns{Limit: 5000}); err != nil {
		t.Fatal(err)
	}
	want := []string{`runs {"status":"running","limit":50}`, `runs {"limit":1000}`}
	if got := a.commands(); !slices.Equal(got, want) {
		t.Fatalf("commands = %q, want %q", got, want)
	}
}

func TestListRunsHonoursContext(t *testing.T) {
	a := &qrLink{id: "a", runs: map[string]string{}}
	reg := qrRegistry(t, a)
	h := edge.NewListRunsHandler(reg, edge.NewNodeCommandHandler(reg))
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	if _, err := h.Handle(ctx, edge.ListRuns{Node: "a"}); err == nil {
		t.Fatal("want an error from a done context")
	}
}
