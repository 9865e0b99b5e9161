package node_test

import (
	"errors"
	"slices"
	"testing"

	"iop/domain"
	"iop/ports"
)

func TestRuntimeApply(t *testing.T) {
	errBuild := errors.New("ollama is not installed")
	tests := []struct {
		name string
		next []domain.AdapterConfig // replaces the initial a (max 1) and b (max 1)
		fail map[string]error
		// busy: a run is in flight on a's first instance during Apply.
		busy              bool
		wantRebuilt       bool // a got a new instance
		wantClosedAtApply bool // a's first instance closed by Apply itself
		wantClosedAtEnd   bool // ... once its run has ended
		wantNames         []string
		wantErr           error
	}{
		{name: "unchanged idle adapter keeps its instance",
			next: []domain.AdapterConfig{ucAdapterCfg("a", 1), ucAdapterCfg("b", 1)}, wantNames: []string{"a", "b"}},
		{name: "unchanged busy adapter keeps its instance and run", busy: true,
			next: []domain.AdapterConfig{ucAdapterCfg("a", 1), ucAdapterCfg("b", 1)}, wantNames: []string{"a", "b"}},
		{name: "changed idle adapter is rebuilt and the old one closed",
			next:        []domain.AdapterConfig{ucAdapterCfg("a", 2), ucAdapterCfg("b", 1)},
			wantRebuilt: true, wantClosedAtApply: true, wantClosedAtEnd: true, wantNames: []string{"a", "b"}},
		{name: "changed busy adapter is closed only after its run", busy: true,
			next:        []domain.AdapterConfig{ucAdapterCfg("a", 2), ucAdapterCfg("b", 1)},
			wantRebuilt: true, wantClosedAtEnd: true, wantNames: []string{"a", "b"}},
		{name: "removed idle adapter is closed",
			next:              []domain.AdapterConfig{ucAdapterCfg("b", 1)},
			wantClosedAtApply: true, wantClosedAtEnd: true, wantNames: []string{"b"}},
		{name: "removed busy adapter is closed only after its run", busy: true,
			next:            []domain.AdapterConfig{ucAdapterCfg("b", 1)},
			wantClosedAtEnd: true, wantNames: []string{"b"}},
		{name: "a build failure is reported and the others applied",
			next:      []domain.AdapterConfig{ucAdapterCfg("a", 1), ucAdapterCfg("b", 1), ucAdapterCfg("c", 1)},
			fail:      map[string]error{"c": errBuild},
			wantNames: []string{"a", "b"}, wantErr: errBuild},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			gate := make(chan struct{})
			oldA := newUCAdapter("a#1", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
				"slow": ucGate(gate, []domain.RunEvent{ucDelta("before")}, ucDelta("after")),
				"":     ucEmit(nil, ucDelta("x")),
			})
			b := newUCAdapter("b", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{"": ucEmit(nil)})
			n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": oldA, "b": b})
			newA := newUCAdapter("a#2", domain.Capabilities{}, map[string]ucExecFunc{"": ucEmit(nil, ucDelta("new"))})
			n.adapters["a"] = newA
			n.adapters["c"] = newUCAdapter("c", domain.Capabilities{}, nil)
			n.factory.fail = tc.fail

			var busyOut *ucOutput
			if tc.busy {
				busyOut = n.start(ucReq("r-busy", "a", "slow"))
				oldA.waitStarted(t, "r-busy")
			}
			err := n.rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 8, Adapters: tc.next})
			if (err == nil) != (tc.wantErr == nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("Apply = %v, want %v", err, tc.wantErr)
			}
			if _, v := n.rt.Version(); v != 8 {
				t.Fatalf("config version = %d, want 8", v)
			}
			var names []string
			for _, s := range n.rt.Statuses() {
				names = append(names, s.Name)
			}
			if !slices.Equal(names, tc.wantNames) {
				t.Fatalf("adapters = %v, want %v", names, tc.wantNames)
			}
			if got := len(n.factory.instances("a")); (got == 2) != tc.wantRebuilt || got > 2 {
				t.Fatalf("a built %d times, rebuilt wanted %v", got, tc.wantRebuilt)
			}
			if got := len(n.factory.instances("b")); got != 1 {
				t.Fatalf("unchanged b built %d times, want once", got)
			}
			if oldA.isClosed() != tc.wantClosedAtApply {
				t.Fatalf("a's first instance closed at Apply = %v, want %v", oldA.isClosed(), tc.wantClosedAtApply)
			}
			if b.isClosed() {
				t.Fatal("unchanged b was closed")
			}

			if tc.busy {
				close(gate)
				evs := busyOut.waitClosed(t)
				if term := ucCheckStream(t, "r-busy", evs); term.Type != domain.EventComplete {
					t.Fatalf("run on the old instance ended %s, want complete", ucTypes(evs))
				}
				if texts := ucTexts(evs); !slices.Equal(texts, []string{"before", "after"}) {
					t.Fatalf("run on the old instance was disturbed: %v", texts)
				}
			}
			if oldA.isClosed() != tc.wantClosedAtEnd {
				t.Fatalf("a's first instance closed = %v at the end, want %v", oldA.isClosed(), tc.wantClosedAtEnd)
			}
			if oldA.closeCount() > 1 {
				t.Fatalf("a's first instance closed %d times", oldA.closeCount())
			}

			// A new run goes to the instance now in force.
			evs := n.run(t, ucReq("r-new", "a", ""))
			term := ucCheckStream(t, "r-new", evs)
			switch {
			case !slices.Contains(tc.wantNames, "a"):
				if term.Type != domain.EventError || term.Error.Code != domain.CodeAdapterNotFound {
					t.Fatalf("run on a removed adapter = %s, want adapter_not_found", ucTypes(evs))
				}
			case tc.wantRebuilt:
				if !slices.Contains(newA.ranRuns(), "r-new") || slices.Contains(oldA.ranRuns(), "r-new") {
					t.Fatalf("new run went to the old instance: old %v new %v", oldA.ranRuns(), newA.ranRuns())
				}
			default:
				if !slices.Contains(oldA.ranRuns(), "r-new") {
					t.Fatalf("new run did not go to the kept instance: %v", oldA.ranRuns())
				}
			}
			if newA.isClosed() {
				t.Fatal("the instance in force was closed")
			}
		})
	}
}

func ucTexts(evs []domain.RunEvent) []string {
	var out []string
	for _, ev := range evs {
		if ev.Type == domain.EventDelta {
			out = append(out, ev.Text)
		}
	}
	return out
}
