package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/adapters/store/memory"
	"iop/application/node"
	"iop/domain"
	"iop/domain/nodecmd"
	"iop/internal/lockedbuf"
	"iop/ports"
)

// fullStore is the in-memory store on a full disk: its next failCreates
// inserts and failUpdates updates fail.
type fullStore struct {
	*memory.RunStore
	mu                       sync.Mutex
	failCreates, failUpdates int
}

var errDiskFull = errors.New("database or disk is full")

func (s *fullStore) fail(n *int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *n > 0 {
		*n--
		return true
	}
	return false
}

func (s *fullStore) CreateRun(ctx context.Context, r *domain.Run) error {
	if s.fail(&s.failCreates) {
		return fmt.Errorf("insert run %s: %w", r.ID(), errDiskFull)
	}
	return s.RunStore.CreateRun(ctx, r)
}

func (s *fullStore) UpdateRun(ctx context.Context, id string, fn func(*domain.Run) error) error {
	if s.fail(&s.failUpdates) {
		return fmt.Errorf("update run %s: %w", id, errDiskFull)
	}
	return s.RunStore.UpdateRun(ctx, id, fn)
}

// storeFullNode is a node whose run manager writes to store and logs to
// the returned buffer.
func storeFullNode(t *testing.T, store ports.RunStore) (*node.RunManager, *ucNode, *lockedbuf.Buffer) {
	t.Helper()
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 4}, map[string]ucExecFunc{"": ucEmit(nil, ucDelta("x"))})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	buf := &lockedbuf.Buffer{}
	rm := node.NewRunManager(n.rt, store, slog.New(slog.NewJSONHandler(buf, nil)))
	return rm, n, buf
}

func logLines(t *testing.T, buf *lockedbuf.Buffer, level string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["level"] == level {
			out = append(out, m)
		}
	}
	return out
}

// A store that cannot be written (a full disk) costs a bounded number of
// log lines, not two per run, and they count every run record lost.
func TestStoreFullLogsLostRunsBounded(t *testing.T) {
	ucNoLeaks(t)
	const runs = 30
	store := &fullStore{RunStore: memory.NewRunStore(), failCreates: runs, failUpdates: runs}
	rm, _, buf := storeFullNode(t, store)
	for i := range runs {
		out := newUCOutput()
		rm.ExecuteRun(ucReq(fmt.Sprintf("r%d", i), "a", "t"), out)
		if term := ucCheckStream(t, fmt.Sprintf("r%d", i), out.waitClosed(t)); term.Type != domain.EventComplete {
			t.Fatalf("run %d ended %s", i, term.Type)
		}
	}
	rm.Stop() // reports what is counted and not logged yet
	errs := logLines(t, buf, "ERROR")
	if len(errs) > 2 {
		t.Fatalf("%d ERROR lines for %d runs the store could not take, want at most 2:\n%s", len(errs), runs, buf.String())
	}
	lost := 0
	for _, l := range errs {
		if n, ok := l["runs"].(float64); ok {
			lost += int(n)
		} else {
			lost++
		}
		if !strings.Contains(fmt.Sprint(l["err"]), "disk is full") {
			t.Fatalf("line without the cause: %+v", l)
		}
	}
	if lost != runs {
		t.Fatalf("the log counts %d lost run records, want %d:\n%s", lost, runs, buf.String())
	}
}

// A run whose start record the store refused, and whose end record it
// took, is in the store with its final status.
func TestStoreRefusingStartKeepsFinishedRun(t *testing.T) {
	ucNoLeaks(t)
	store := &fullStore{RunStore: memory.NewRunStore(), failCreates: 1}
	rm, _, buf := storeFullNode(t, store)
	out := newUCOutput()
	rm.ExecuteRun(ucReq("r1", "a", "t"), out)
	ucCheckStream(t, "r1", out.waitClosed(t))
	rm.Stop()
	r, err := store.GetRun(context.Background(), "r1")
	if err != nil {
		t.Fatalf("the run is not in the store: %v", err)
	}
	if s := r.Snapshot(); s.Status != domain.RunSucceeded || s.FinishedAt.IsZero() || s.Adapter != "a" || s.Target != "t" {
		t.Fatalf("stored run %+v, want a finished succeeded run", s)
	}
	if errs := logLines(t, buf, "ERROR"); len(errs) != 0 {
		t.Fatalf("a record that was written is logged as lost: %v", errs)
	}
}

// A run whose start record the store refused is running to run_get while
// it executes, not unknown: the edge's history writes a run its node does
// not know as lost.
func TestRunGetAnswersARunningRunTheStoreLacks(t *testing.T) {
	ucNoLeaks(t)
	store := &fullStore{RunStore: memory.NewRunStore(), failCreates: 1}
	gate := make(chan struct{})
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 4}, map[string]ucExecFunc{"": ucGate(gate, nil, ucDelta("x"))})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	rm := node.NewRunManager(n.rt, store, nil)
	defer rm.Stop()
	cmds := node.NewCommandHandler(n.rt, rm, node.NewSessionHandler(n.rt, rm), store, "v")
	out := newUCOutput()
	done := make(chan struct{})
	go func() { defer close(done); rm.ExecuteRun(ucReq("r1", "a", "t"), out) }()
	// Until the store has refused the start record.
	for deadline := time.Now().Add(ucWait); ; time.Sleep(time.Millisecond) {
		store.mu.Lock()
		refused := store.failCreates == 0
		store.mu.Unlock()
		if refused {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the run's start record was never written")
		}
	}
	raw, err := cmds.RunCommand(context.Background(), nodecmd.CmdRunGet, []byte(`{"run_id":"r1"}`), nil)
	if err != nil {
		t.Fatalf("run_get of a running run the store lacks: %v", err)
	}
	var got nodecmd.Run
	if err := json.Unmarshal(raw, &got); err != nil || got.RunID != "r1" || got.Status != string(domain.RunRunning) {
		t.Fatalf("run_get = %s, %v; want r1 running", raw, err)
	}
	close(gate)
	<-done
	if _, err := cmds.RunCommand(context.Background(), nodecmd.CmdRunGet, []byte(`{"run_id":"r1"}`), nil); err != nil {
		t.Fatalf("run_get after the end wrote the record: %v", err)
	}
}
