package sqlite

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"iop/domain"
)

func openFile(t *testing.T) *DB {
	t.Helper()
	db, err := Open(context.Background(), "file:"+filepath.Join(t.TempDir(), "iop.db")+"?cache=shared&mode=rwc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func startedRun(t *testing.T, id string) *domain.Run {
	t.Helper()
	now := time.Now()
	run, err := domain.NewRun(domain.RunRequest{RunID: id, Adapter: "exec", Target: "cat"}, now)
	if err != nil {
		t.Fatal(err)
	}
	_ = run.Start(now)
	return run
}

func finish(ev domain.EventType) func(*domain.Run) error {
	return func(r *domain.Run) error { return r.Finish(domain.RunEvent{Type: ev}, time.Now()) }
}

// A run finished from outside the process (here: plain SQL on the same
// file) is not finished again from the remembered state: the status guard
// misses, and the update reads the stored run back.
func TestUpdateAfterAnOutsideWriteReadsTheRowBack(t *testing.T) {
	db, ctx := openFile(t), context.Background()
	s := NewRunStore(db)
	if err := s.CreateRun(ctx, startedRun(t, "r1")); err != nil {
		t.Fatal(err)
	}
	if _, ok := db.runs.m["r1"]; !ok {
		t.Fatal("a created, unfinished run is not remembered")
	}
	if _, err := db.bun.ExecContext(ctx, "UPDATE runs SET status = 'failed', finished_at = started_at, error_code = 'operator' WHERE id = 'r1'"); err != nil {
		t.Fatal(err)
	}
	calls := 0
	err := s.UpdateRun(ctx, "r1", func(r *domain.Run) error { calls++; return finish(domain.EventComplete)(r) })
	if !errors.Is(err, domain.ErrRunAlreadyFinished) {
		t.Fatalf("UpdateRun after the outside finish = %v; want ErrRunAlreadyFinished", err)
	}
	if calls != 2 {
		t.Errorf("fn called %d times; want 2 (remembered state, then the stored row)", calls)
	}
	got, err := s.GetRun(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if snap := got.Snapshot(); snap.Status != domain.RunFailed || snap.ErrorCode != "operator" {
		t.Fatalf("stored run %+v; want the outside write kept", snap)
	}
	if _, ok := db.runs.m["r1"]; ok {
		t.Error("the run is still remembered after the guard missed")
	}
}

// Two stores on one database share what they remember, so neither writes
// over the other's change.
func TestStoresOnOneDatabaseShareState(t *testing.T) {
	db, ctx := openFile(t), context.Background()
	a, b := NewRunStore(db), NewRunStore(db)
	if err := a.CreateRun(ctx, startedRun(t, "r1")); err != nil {
		t.Fatal(err)
	}
	if err := b.UpdateRun(ctx, "r1", finish(domain.EventCancelled)); err != nil {
		t.Fatal(err)
	}
	if err := a.UpdateRun(ctx, "r1", finish(domain.EventComplete)); !errors.Is(err, domain.ErrRunAlreadyFinished) {
		t.Fatalf("second finish = %v; want ErrRunAlreadyFinished", err)
	}
	got, err := a.GetRun(ctx, "r1")
	if err != nil || got.Status() != domain.RunCancelled {
		t.Fatalf("GetRun = %v, %v; want cancelled", got, err)
	}
	if len(db.runs.m) != 0 {
		t.Errorf("finished runs still remembered: %v", db.runs.m)
	}
}

// Past maxUnfinished, runs are recorded and updated all the same, through
// the read-back path.
func TestUnfinishedIsBounded(t *testing.T) {
	db, ctx := openFile(t), context.Background()
	s := NewRunStore(db)
	for i := range maxUnfinished + 10 {
		if err := s.CreateRun(ctx, startedRun(t, fmt.Sprintf("r%05d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(db.runs.m); n != maxUnfinished {
		t.Fatalf("remembering %d runs; want %d", n, maxUnfinished)
	}
	last := fmt.Sprintf("r%05d", maxUnfinished+9)
	if err := s.UpdateRun(ctx, last, finish(domain.EventComplete)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetRun(ctx, last); err != nil || got.Status() != domain.RunSucceeded {
		t.Fatalf("GetRun(%s) = %v, %v; want succeeded", last, got, err)
	}
}
