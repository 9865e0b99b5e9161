package node_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/application/node"
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
		{name: "a build failure is reported and nothing applied",
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
			wantVersion := uint64(8)
			if tc.wantErr != nil {
				wantVersion = 7 // a refused config leaves the version in force
			}
			if _, v := n.rt.Version(); v != wantVersion {
				t.Fatalf("config version = %d, want %d", v, wantVersion)
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

// TestRuntimeApplyIsAllOrNothing: when one adapter of a pushed config
// fails to build, the node keeps every adapter, provider and the version it
// ran, and closes what it built for the refused config. The edge keeps its
// view of the node's config when the push fails, so that view stays true.
func TestRuntimeApplyIsAllOrNothing(t *testing.T) {
	ucNoLeaks(t)
	oldA := newUCAdapter("a#1", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{"": ucEmit(nil, ucDelta("old"))})
	b := newUCAdapter("b", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{"": ucEmit(nil)})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": oldA, "b": b})
	newA := newUCAdapter("a#2", domain.Capabilities{}, map[string]ucExecFunc{"": ucEmit(nil, ucDelta("new"))})
	n.adapters["a"] = newA
	n.adapters["d"] = newUCAdapter("d", domain.Capabilities{}, nil)
	n.factory.fail = map[string]error{"c": errors.New("base_url has no scheme")}

	err := n.rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 8,
		Adapters:  []domain.AdapterConfig{ucAdapterCfg("a", 2), ucAdapterCfg("c", 1), ucAdapterCfg("d", 1)},
		Providers: []domain.ProviderConfig{{Name: "p", Type: domain.ProviderOllama, BaseURL: "http://x"}}})
	if err == nil || !strings.Contains(err.Error(), `adapter "c"`) {
		t.Fatalf("Apply = %v, want c's build failure", err)
	}
	if _, v := n.rt.Version(); v != 7 {
		t.Fatalf("version = %d after a refused config, want 7", v)
	}
	var names []string
	for _, s := range n.rt.Statuses() {
		names = append(names, s.Name)
	}
	if !slices.Equal(names, []string{"a", "b"}) {
		t.Fatalf("adapters = %v after a refused config, want [a b]", names)
	}
	if _, ok := n.rt.Provider("p"); ok {
		t.Fatal("a refused config installed its provider")
	}
	if oldA.isClosed() || b.isClosed() {
		t.Fatal("a refused config retired an adapter in force")
	}
	if !newA.isClosed() {
		t.Fatal("the instance built for the refused config was not closed")
	}
	if evs := n.run(t, ucReq("r1", "a", "")); !slices.Contains(oldA.ranRuns(), "r1") {
		t.Fatalf("a run went elsewhere than the instance in force: %s", ucTypes(evs))
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

// A refresh that rebuilds an adapter (here only its timeout changed) leaves
// its runs on the retired instance; they still hold slots of the adapter's
// max_concurrency. Before, each rebuilt instance had slots of its own, so
// every refresh let one more max_concurrency of runs in, and the statuses
// (capabilities, node stats) counted only the newest instance.
func TestRefreshDoesNotResetAdapterCapacity(t *testing.T) {
	ucNoLeaks(t)
	gate := make(chan struct{})
	oldA := newUCAdapter("a#1", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
		"slow": ucGate(gate, nil, ucDelta("done")),
	})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": oldA})
	first := n.start(ucReq("r1", "a", "slow"))
	oldA.waitStarted(t, "r1")

	// Two refreshes, each rebuilding a (max_concurrency 1 all along).
	var newA *ucAdapter
	for i, timeout := range []time.Duration{time.Minute, 2 * time.Minute} {
		newA = newUCAdapter(fmt.Sprintf("a#%d", i+2), domain.Capabilities{}, map[string]ucExecFunc{"": ucEmit(nil, ucDelta("x"))})
		n.adapters["a"] = newA
		cfg := ucAdapterCfg("a", 1)
		cfg.Timeout = timeout
		if err := n.rt.Apply(domain.NodeConfig{NodeID: "n1", Version: uint64(8 + i), Adapters: []domain.AdapterConfig{cfg}}); err != nil {
			t.Fatal(err)
		}
		if got := len(n.factory.instances("a")); got != i+2 {
			t.Fatalf("a built %d times after refresh %d, want %d", got, i+1, i+2)
		}

		evs := n.run(t, ucReq(fmt.Sprintf("r-refused-%d", i), "a", ""))
		if term := ucCheckStream(t, fmt.Sprintf("r-refused-%d", i), evs); len(evs) != 1 || term.Error == nil || term.Error.Code != domain.CodeAtCapacity {
			t.Fatalf("run after refresh %d = %s, want a single at_capacity error: r1 still holds a's one slot", i+1, ucTypes(evs))
		}
		if got := n.runs.InFlight(); got != 1 {
			t.Fatalf("%d runs in flight on an adapter of max_concurrency 1", got)
		}
		if st := n.rt.Statuses(); len(st) != 1 || st[0].InFlight != 1 || st[0].MaxConcurrency != 1 {
			t.Fatalf("statuses = %+v, want a at 1 of 1", st)
		}
		if ns := node.NewStats(n.rt, node.NewProviderLatencies(), nil).NodeStats(); len(ns.Adapters) != 1 || ns.Adapters[0].InFlight != 1 || ns.ChildProcesses != 1 {
			t.Fatalf("node stats = %+v, want a at 1 of 1, one child process", ns)
		}
	}
	if len(newA.ranRuns()) != 0 {
		t.Fatalf("the new instance ran %v while the old one held the only slot", newA.ranRuns())
	}

	close(gate)
	if term := ucCheckStream(t, "r1", first.waitClosed(t)); term.Type != domain.EventComplete {
		t.Fatalf("the run on the retired instance ended %s", term.Type)
	}
	if !oldA.isClosed() {
		t.Fatal("the retired instance was not closed after its run")
	}
	// Its slot is free again, for the instance in force.
	evs := n.run(t, ucReq("r2", "a", ""))
	if term := ucCheckStream(t, "r2", evs); term.Type != domain.EventComplete || !slices.Contains(newA.ranRuns(), "r2") {
		t.Fatalf("run after the old one ended = %s on %v, want complete on the new instance", ucTypes(evs), newA.ranRuns())
	}
	if st := n.rt.Statuses(); st[0].InFlight != 0 {
		t.Fatalf("statuses = %+v after every run ended", st)
	}
}

// ucTargetAdapter serves only its targets (ports.RunAdmitter, as the exec
// adapter); its Admit can be held on gate once, to let a reload land
// between the admission and the run.
type ucTargetAdapter struct {
	*ucAdapter
	targets []string
	gate    chan struct{}
	held    chan struct{}
	once    sync.Once
}

func (a *ucTargetAdapter) Admit(req domain.RunRequest) error {
	if a.gate != nil {
		a.once.Do(func() { close(a.held); <-a.gate })
	}
	if !slices.Contains(a.targets, req.Target) {
		return domain.Errorf(domain.CodeTargetNotFound, "no target %q", req.Target)
	}
	return nil
}

// A run admitted by an adapter that a config refresh replaces before the
// run takes its slot is admitted again by the new instance, which runs it:
// a target the new config no longer has is refused (no start event, not
// a failed run), as it would be a moment later.
func TestRunAdmittedAcrossAReloadIsAdmittedByTheNewInstance(t *testing.T) {
	ucNoLeaks(t)
	old := &ucTargetAdapter{ucAdapter: newUCAdapter("a#1", domain.Capabilities{MaxConcurrency: 2}, map[string]ucExecFunc{"": ucEmit(nil, ucDelta("old"))}),
		targets: []string{"t1"}, gate: make(chan struct{}), held: make(chan struct{})}
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": old})
	out := n.start(ucReq("r1", "a", "t1"))
	<-old.held
	n.adapters["a"] = &ucTargetAdapter{ucAdapter: newUCAdapter("a#2", domain.Capabilities{MaxConcurrency: 2}, map[string]ucExecFunc{"": ucEmit(nil, ucDelta("new"))}),
		targets: []string{"t2"}}
	if err := n.rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 8, Adapters: []domain.AdapterConfig{ucAdapterCfg("a", 3)}}); err != nil {
		t.Fatal(err)
	}
	close(old.gate)
	evs := out.waitClosed(t)
	if len(evs) != 1 || evs[0].Type != domain.EventError || evs[0].Error.Code != domain.CodeTargetNotFound {
		t.Fatalf("events %s, want a target_not_found refusal alone", ucTypes(evs))
	}
}

// A child process still running on an instance a refresh removed, or whose
// adapter's type changed, is still counted as one; and a run of an adapter
// type that starts none is not counted, whatever the adapter's name had.
func TestChildProcessesCountedByTheirOwnInstance(t *testing.T) {
	ucNoLeaks(t)
	gate := make(chan struct{})
	a := newUCAdapter("a#1", domain.Capabilities{MaxConcurrency: 2}, map[string]ucExecFunc{"slow": ucGate(gate, nil, ucDelta("done"))})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	first := n.start(ucReq("r1", "a", "slow"))
	a.waitStarted(t, "r1")
	stats := func() domain.NodeStats { return node.NewStats(n.rt, node.NewProviderLatencies(), nil).NodeStats() }
	if ns := stats(); ns.ChildProcesses != 1 {
		t.Fatalf("before: %+v", ns)
	}
	// a becomes an openai adapter: r1 is still an exec child.
	llm := newUCAdapter("a#2", domain.Capabilities{MaxConcurrency: 2}, map[string]ucExecFunc{"": ucEmit(nil, ucDelta("x"))})
	n.adapters["a"] = llm
	cfg := ucAdapterCfg("a", 2)
	cfg.Type, cfg.BaseURL = domain.AdapterOpenAI, "http://llm"
	if err := n.rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 8, Adapters: []domain.AdapterConfig{cfg}}); err != nil {
		t.Fatal(err)
	}
	if ns := stats(); ns.ChildProcesses != 1 {
		t.Fatalf("after the type changed: %+v, want r1 still counted", ns)
	}
	// Removed altogether: still one.
	if err := n.rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 9}); err != nil {
		t.Fatal(err)
	}
	if ns := stats(); ns.ChildProcesses != 1 {
		t.Fatalf("after the adapter was removed: %+v, want r1 still counted", ns)
	}
	close(gate)
	first.waitClosed(t)
	if ns := stats(); ns.ChildProcesses != 0 {
		t.Fatalf("after r1 ended: %+v", ns)
	}
}

// A run in flight on an adapter a refresh removes (here: renames) still
// holds its slot in the node's stats — iop_node_adapter_slots_in_use —
// under the old name with no slots of its own, until it ends.
func TestStatsKeepARemovedAdaptersRunsUntilTheyEnd(t *testing.T) {
	ucNoLeaks(t)
	gate := make(chan struct{})
	a := newUCAdapter("a#1", domain.Capabilities{MaxConcurrency: 2}, map[string]ucExecFunc{"slow": ucGate(gate, nil, ucDelta("done"))})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	first := n.start(ucReq("r1", "a", "slow"))
	a.waitStarted(t, "r1")
	slots := func() string {
		return fmt.Sprint(node.NewStats(n.rt, node.NewProviderLatencies(), nil).NodeStats().Adapters)
	}
	n.adapters["b"] = newUCAdapter("b#1", domain.Capabilities{MaxConcurrency: 3}, map[string]ucExecFunc{"": ucEmit(nil, ucDelta("x"))})
	if err := n.rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 8, Adapters: []domain.AdapterConfig{ucAdapterCfg("b", 3)}}); err != nil {
		t.Fatal(err)
	}
	if got, want := slots(), "[{a 0 1} {b 3 0}]"; got != want {
		t.Fatalf("slots after a was renamed b: %s, want %s (r1 still on a)", got, want)
	}
	close(gate)
	first.waitClosed(t)
	if got, want := slots(), "[{b 3 0}]"; got != want {
		t.Fatalf("slots after r1 ended: %s, want %s", got, want)
	}
}
