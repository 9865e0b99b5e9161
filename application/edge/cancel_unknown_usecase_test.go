package edge_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// ucSlowCancelLink is a ucLink whose CancelRun does not answer until its
// ctx ends (a node that is slow or gone quiet).
type ucSlowCancelLink struct{ *ucLink }

func (l ucSlowCancelLink) CancelRun(ctx context.Context, runID, _ string) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestCancelUnknownRunAsksEveryNodeAtOnce: a run the edge does not know is
// asked of every visible node in parallel; the node running it answers,
// whatever the others (lower ids) say or how long they take.
func TestCancelUnknownRunAsksEveryNodeAtOnce(t *testing.T) {
	notFound := domain.Errorf(domain.CodeRunNotFound, "no such run")
	tests := []struct {
		name     string
		errs     map[string]error // node → its CancelRun answer
		slowA    bool
		wantNode string
		wantErr  error
	}{
		{name: "an earlier node failing does not hide the one running it",
			errs:     map[string]error{"a": domain.Errorf(domain.CodeTimeout, "no answer"), "b": nil, "c": notFound},
			wantNode: "b"},
		{name: "an earlier slow node does not delay the one running it", slowA: true,
			errs:     map[string]error{"b": notFound, "c": nil},
			wantNode: "c"},
		{name: "run_finished wins over another error",
			errs:     map[string]error{"a": domain.Errorf(domain.CodeTimeout, "no answer"), "b": notFound, "c": domain.Errorf(domain.CodeRunFinished, "done")},
			wantNode: "c", wantErr: domain.ErrRunFinished},
		{name: "run_not_found only when every node says so",
			errs:    map[string]error{"a": notFound, "b": notFound, "c": notFound},
			wantErr: domain.ErrRunNotFound},
		{name: "otherwise the error",
			errs:     map[string]error{"a": notFound, "b": domain.Errorf(domain.CodeTimeout, "no answer"), "c": notFound},
			wantNode: "b", wantErr: domain.ErrTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			reg, runs := edge.NewRegistry(), edge.NewRunTracker(0)
			for _, id := range []string{"a", "b", "c"} {
				l := &ucLink{id: id, cancelErr: tc.errs[id]}
				var link ports.NodeLink = l
				if id == "a" && tc.slowA {
					link = ucSlowCancelLink{l}
				}
				n := &edge.LiveNode{ID: id, Link: link, Config: domain.NodeConfig{NodeID: id}, ConnectedAt: time.Now()}
				if err := reg.Admit(n); err != nil {
					t.Fatal(err)
				}
			}
			var node string
			var err error
			ucWithin(t, "cancel", func() { node, err = edge.NewCancelRunHandler(reg, runs).Handle(context.Background(), "run_x") })
			if (err == nil) != (tc.wantErr == nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("Handle = %q, %v; want %v", node, err, tc.wantErr)
			}
			if node != tc.wantNode {
				t.Fatalf("Handle names node %q, want %q", node, tc.wantNode)
			}
		})
	}
}
