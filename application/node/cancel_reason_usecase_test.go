package node_test

import (
	"context"
	"errors"
	"testing"

	"iop/domain"
	"iop/ports"
)

// A cancel's reason (the edge's: the caller left, the edge is shutting
// down, ...) is the cancelled run's message, on its terminal event and in
// the node's store; a cancel without one (a user's, or an old edge's) says
// "cancelled by request". Before, every cancel said "cancelled by request",
// so an operator could not tell a user's cancel from a caller that left.
func TestCancelReasonIsTheRunsMessage(t *testing.T) {
	tests := []struct {
		name   string
		reason string
		early  bool // the cancel reaches the node before its run
		want   string
	}{
		{name: "a cancel by request", want: "cancelled by request"},
		{name: "the caller left", reason: "caller left before the run ended", want: "caller left before the run ended"},
		{name: "the edge stops", reason: "edge shutting down", want: "edge shutting down"},
		{name: "a cancel by request before its run", early: true, want: "cancelled by request before it started"},
		{name: "the caller left before admission", early: true, reason: "caller left before the run was admitted",
			want: "caller left before the run was admitted (before it started)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{"": ucBlock(ucDelta("working"))})
			n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
			out := newUCOutput()
			if tc.early {
				if err := n.runs.CancelRun(context.Background(), "r1", tc.reason); !errors.Is(err, domain.ErrRunNotFound) {
					t.Fatalf("CancelRun before the run = %v, want run_not_found", err)
				}
				go n.runs.ExecuteRun(ucReq("r1", "a", ""), out)
			} else {
				go n.runs.ExecuteRun(ucReq("r1", "a", ""), out)
				a.waitStarted(t, "r1")
				if err := n.runs.CancelRun(context.Background(), "r1", tc.reason); err != nil {
					t.Fatalf("CancelRun = %v", err)
				}
			}
			term := ucCheckStream(t, "r1", out.waitClosed(t))
			if term.Type != domain.EventCancelled || term.Error == nil || term.Error.Code != domain.CodeCancelled {
				t.Fatalf("run ended %+v, want cancelled", term)
			}
			if term.Error.Message != tc.want {
				t.Fatalf("cancelled event says %q, want %q", term.Error.Message, tc.want)
			}
			s := n.stored(t, "r1")
			if s.Status != domain.RunCancelled || s.ErrorMessage != tc.want {
				t.Fatalf("stored %s %q, want cancelled %q", s.Status, s.ErrorMessage, tc.want)
			}
		})
	}
}
