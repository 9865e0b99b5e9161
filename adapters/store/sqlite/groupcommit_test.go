package sqlite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/domain"
)

// queued waits until the run store's group commit has a leader writing and
// n writes queued behind it.
func queued(t *testing.T, db *DB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		db.group.mu.Lock()
		active, got := db.group.active, len(db.group.queue)
		db.group.mu.Unlock()
		if active && got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group commit: active %v, %d queued; want %d queued", active, got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Writes queued while another is written go in one transaction; one of
// them failing (a duplicate run id) fails that caller alone, and one whose
// guard matches no row (finished from outside) takes the read-back path,
// as each would without grouping.
func TestGroupedWritesEachGetTheirOwnResult(t *testing.T) {
	ctx := context.Background()
	db := openFile(t)
	s := NewRunStore(db)
	for _, id := range []string{"dup", "fin", "outside"} {
		if err := s.CreateRun(ctx, startedRun(t, id)); err != nil {
			t.Fatal(err)
		}
	}
	// Finished behind the store's back: its remembered state is stale.
	if _, err := db.bun.ExecContext(ctx, "UPDATE runs SET status = 'failed' WHERE id = 'outside'"); err != nil {
		t.Fatal(err)
	}

	// Hold the only connection, so the first write blocks while it leads
	// and the rest queue behind it.
	conn, err := db.stmts.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := map[string]error{}
	var mu sync.Mutex
	do := func(name string, f func() error) {
		wg.Go(func() {
			err := f()
			mu.Lock()
			results[name] = err
			mu.Unlock()
		})
	}
	do("lead", func() error { return s.CreateRun(ctx, startedRun(t, "lead")) })
	queued(t, db, 0)
	for i := range 4 {
		id := fmt.Sprintf("new-%d", i)
		do(id, func() error { return s.CreateRun(ctx, startedRun(t, id)) })
	}
	do("dup", func() error { return s.CreateRun(ctx, startedRun(t, "dup")) })
	do("fin", func() error { return s.UpdateRun(ctx, "fin", finish(domain.EventComplete)) })
	do("outside", func() error { return s.UpdateRun(ctx, "outside", finish(domain.EventComplete)) })
	queued(t, db, 7)
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	for name, err := range results {
		switch name {
		case "dup":
			if err == nil || !strings.Contains(err.Error(), "UNIQUE") {
				t.Errorf("duplicate insert: %v, want a UNIQUE constraint error", err)
			}
		case "outside":
			if !errors.Is(err, domain.ErrRunAlreadyFinished) {
				t.Errorf("update of a run finished from outside: %v, want ErrRunAlreadyFinished", err)
			}
		default:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	want := map[string]domain.RunStatus{"lead": domain.RunRunning, "dup": domain.RunRunning, "fin": domain.RunSucceeded, "outside": domain.RunFailed}
	for i := range 4 {
		want[fmt.Sprintf("new-%d", i)] = domain.RunRunning
	}
	for id, st := range want {
		run, err := s.GetRun(ctx, id)
		if err != nil {
			t.Fatalf("GetRun(%s): %v", id, err)
		}
		if got := run.Snapshot().Status; got != st {
			t.Errorf("run %s is %s, want %s", id, got, st)
		}
	}
	// The remembered state follows what was committed: the new runs'
	// finish takes the one-statement path.
	if _, _, ok := db.runs.get("new-0"); !ok {
		t.Error("a run created in a group is not remembered")
	}
	if _, _, ok := db.runs.get("fin"); ok {
		t.Error("a run finished in a group is still remembered")
	}
}

// More writes than one transaction carries are written in several, all of
// them; the last leader leaves none queued.
func TestGroupCommitSplitsLongQueues(t *testing.T) {
	ctx := context.Background()
	db := openFile(t)
	s := NewRunStore(db)
	if err := s.CreateRun(ctx, startedRun(t, "warm")); err != nil { // prepares the insert
		t.Fatal(err)
	}
	conn, err := db.stmts.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*maxGroup+2)
	wg.Go(func() { errs <- s.CreateRun(ctx, startedRun(t, "lead")) })
	queued(t, db, 0)
	for i := range 2*maxGroup + 1 {
		wg.Go(func() { errs <- s.CreateRun(ctx, startedRun(t, fmt.Sprintf("r%03d", i))) })
	}
	queued(t, db, 2*maxGroup+1)
	_ = conn.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	runs, err := s.ListRuns(ctx, domain.RunFilter{Limit: domain.MaxRunPage})
	if err != nil || len(runs) != 2*maxGroup+3 {
		t.Fatalf("ListRuns: %d runs, %v; want %d", len(runs), err, 2*maxGroup+3)
	}
	db.group.mu.Lock()
	defer db.group.mu.Unlock()
	if db.group.active || len(db.group.queue) != 0 {
		t.Errorf("after the writes: active %v, %d queued", db.group.active, len(db.group.queue))
	}
}

// A caller whose context is done before its write is queued gets the
// context's error and nothing is written.
func TestGroupWriteWithDoneContext(t *testing.T) {
	db := openFile(t)
	s := NewRunStore(db)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.CreateRun(ctx, startedRun(t, "late")); !errors.Is(err, context.Canceled) {
		t.Fatalf("CreateRun with a cancelled context: %v", err)
	}
	if _, err := s.GetRun(context.Background(), "late"); !errors.Is(err, domain.ErrRunNotFound) {
		t.Fatalf("GetRun: %v, want not found", err)
	}
}
