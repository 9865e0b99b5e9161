//go:build unix

package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"iop/domain"
)

// bunRunStore is how RunStore wrote a run before its prepared statements:
// queries built by bun with the values spelled into the SQL text, so SQLite
// parsed and planned each one. Kept as BenchmarkRunLifecycle's baseline.
type bunRunStore struct{ db *bun.DB }

func (s bunRunStore) CreateRun(ctx context.Context, run *domain.Run) error {
	_, err := s.db.NewInsert().Model(toRow(run)).Exec(ctx)
	return err
}

func (s bunRunStore) UpdateRun(ctx context.Context, id string, fn func(*domain.Run) error) error {
	return s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		row := new(runRow)
		err := tx.NewSelect().Model(row).Where("id = ?", id).Scan(ctx)
		if errors.Is(err, sql.ErrNoRows) {
			return domain.ErrRunNotFound
		}
		if err != nil {
			return err
		}
		run, err := toDomain(row)
		if err != nil {
			return err
		}
		if err := fn(run); err != nil {
			return err
		}
		_, err = tx.NewUpdate().Model(toRow(run)).WherePK().Exec(ctx)
		return err
	})
}

// ungroupedRunStore is how RunStore wrote a run before groupCommit: the
// same prepared statements and remembered state, each write its own
// transaction, one caller at a time. Kept as BenchmarkRunLifecycle's
// baseline for the grouping.
type ungroupedRunStore struct {
	*RunStore
	mu sync.Mutex
}

func (s *ungroupedRunStore) CreateRun(ctx context.Context, run *domain.Run) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.raw.stmts.Get(ctx, insertRunSQL)
	if err == nil {
		_, err = st.ExecContext(ctx, s.raw.insertArgs(toRow(run))...)
	}
	if err == nil {
		s.raw.runs.put(run.Snapshot())
	}
	return err
}

func (s *ungroupedRunStore) UpdateRun(ctx context.Context, id string, fn func(*domain.Run) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	run, was, ok := s.raw.runs.get(id)
	if !ok {
		return fmt.Errorf("run %s not remembered", id)
	}
	if err := fn(run); err != nil {
		return err
	}
	upd, err := s.raw.stmts.Get(ctx, updateRunIfSQL)
	if err != nil {
		return err
	}
	row := toRow(run)
	if _, err := upd.ExecContext(ctx, append(s.raw.appendState(nil, row), row.ID, string(was.Status))...); err != nil {
		return err
	}
	s.raw.runs.put(run.Snapshot())
	return nil
}

type runWriter interface {
	CreateRun(ctx context.Context, run *domain.Run) error
	UpdateRun(ctx context.Context, id string, fn func(*domain.Run) error) error
}

// BenchmarkRunLifecycle records what the node records per run — the run
// created as started, then finished — on a WAL database file like the
// node's, from 32 goroutines at once (the load tool's 32 concurrent runs):
// bun-built queries in a read-back transaction (the first version), the
// prepared statements and the remembered state of unfinished runs, each
// write its own transaction (the second), and those writes grouped into
// shared transactions (groupCommit, now).
func BenchmarkRunLifecycle(b *testing.B) {
	for _, bc := range []struct {
		name  string
		store func(*DB) runWriter
	}{
		{"bun-queries", func(db *DB) runWriter { return bunRunStore{db.bun} }},
		{"prepared-remembered", func(db *DB) runWriter { return &ungroupedRunStore{RunStore: NewRunStore(db)} }},
		{"grouped", func(db *DB) runWriter { return NewRunStore(db) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			db, err := Open(context.Background(), "file:"+filepath.Join(b.TempDir(), "iop.db")+"?cache=shared&mode=rwc")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = db.Close() })
			s := bc.store(db)
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			cpu := processCPU()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					id := fmt.Sprintf("run-%d", n.Add(1))
					now := time.Now()
					run, err := domain.NewRun(domain.RunRequest{RunID: id, Adapter: "exec", Target: "cat"}, now)
					if err != nil {
						b.Error(err)
						return
					}
					_ = run.Start(now)
					if err := s.CreateRun(ctx, run); err != nil {
						b.Error(err)
						return
					}
					finish := func(r *domain.Run) error {
						return r.Finish(domain.RunEvent{Type: domain.EventComplete, Usage: &domain.Usage{DurationMS: 3}}, time.Now())
					}
					if err := s.UpdateRun(ctx, id, finish); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64((processCPU()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the process's user+system CPU so far: per iteration, unlike
// ns/op, it does not move with what else the machine runs.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
