package edge_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// stallingLink is a node that answers every command with one progress
// report and then nothing: a broken or hostile node.
type stallingLink struct{ *qrLink }

func (l *stallingLink) Command(context.Context, string, []byte) (ports.CommandStream, error) {
	return &stallingStream{}, nil
}

type stallingStream struct{ sent bool }

func (s *stallingStream) Recv(ctx context.Context) (ports.CommandReply, error) {
	if !s.sent {
		s.sent = true
		return ports.CommandReply{Progress: json.RawMessage(`{}`)}, nil
	}
	<-ctx.Done()
	return ports.CommandReply{}, ctx.Err()
}
func (s *stallingStream) Close() {}

// within runs f and fails the test if it has not returned after limit.
func within[T any](t *testing.T, limit time.Duration, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(limit):
		t.Fatalf("%s: still waiting after %v", what, limit)
		panic("unreachable")
	}
}

// The edge's own questions to nodes (run_get for a run the history lacks,
// asked of every node; runs) answer at once. A progress report lifted a
// command's 30 s bound to the 2 h of a streaming one (a model download),
// so one node that sent a progress report and then nothing held every
// GET /v1/runs/{id} of a run unknown to the edge, and every merged run
// listing, for two hours: the other nodes' answers waited on it.
func TestEdgeQueriesAreNotLengthenedByANodesProgress(t *testing.T) {
	ucNoLeaks(t)
	good := &qrLink{id: "a", runs: map[string]string{"run_a1": qrRun("run_a1", "succeeded", "2026-01-01T00:00:01Z")}}
	bad := &stallingLink{&qrLink{id: "z"}}
	reg := edge.NewRegistry()
	for _, l := range []ports.NodeLink{good, bad} {
		id := map[ports.NodeLink]string{good: "a", bad: "z"}[l]
		cfg := domain.NodeConfig{NodeID: id, Adapters: []domain.AdapterConfig{{Name: "exec", Type: "exec", MaxConcurrency: 2}}}
		if err := reg.Admit(&edge.LiveNode{ID: id, Link: l, Config: cfg}); err != nil {
			t.Fatal(err)
		}
	}
	cmds := edge.NewNodeCommandHandler(reg)
	cmds.Timeout, cmds.LongTimeout = 50*time.Millisecond, time.Hour

	get := edge.NewGetRunHandler(reg, edge.NewRunTracker(0), cmds)
	err := within(t, 10*time.Second, "GET of a run no node knows", func() error {
		_, err := get.Handle(context.Background(), "run_unknown")
		return err
	})
	if !errors.Is(err, domain.ErrRunNotFound) {
		t.Fatalf("err = %v, want run_not_found", err)
	}

	list := edge.NewListRunsHandler(reg, cmds)
	type result struct {
		l   edge.RunList
		err error
	}
	r := within(t, 10*time.Second, "merged run listing", func() result {
		l, err := list.Handle(context.Background(), edge.ListRuns{})
		return result{l, err}
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.l.Failures) != 1 || r.l.Failures[0].Node != "z" || domain.CodeOf(r.l.Failures[0].Err) != domain.CodeTimeout {
		t.Fatalf("failures = %+v, want node z timed out", r.l.Failures)
	}
}
