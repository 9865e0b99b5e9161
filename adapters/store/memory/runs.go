// Package memory implements the node's stores in memory, with the same
// semantics as the SQLite stores (the storetest contracts run against both).
// Nothing survives the process. Values handed in or out are copies, so the
// only way to change a stored run is UpdateRun.
package memory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

// RunStore is a map-backed ports.RunStore.
type RunStore struct {
	mu   sync.Mutex
	runs map[string]domain.RunSnapshot
}

var _ ports.RunStore = (*RunStore)(nil)

// NewRunStore returns an empty RunStore.
func NewRunStore() *RunStore {
	return &RunStore{runs: map[string]domain.RunSnapshot{}}
}

// CreateRun stores a copy of run; a run with the same id already stored is an error.
func (s *RunStore) CreateRun(_ context.Context, run *domain.Run) error {
	if run == nil {
		return errors.New("insert run: nil run")
	}
	snap := normalize(run.Snapshot())
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.runs[snap.ID]; ok {
		return fmt.Errorf("insert run %s: duplicate id", snap.ID)
	}
	s.runs[snap.ID] = snap
	return nil
}

// UpdateRun applies fn to a copy of the run and stores the copy only if fn
// succeeds. fn's error is returned as is; a missing run is
// domain.ErrRunNotFound and fn is not called. fn runs under the store's lock,
// so it must not call the store.
func (s *RunStore) UpdateRun(_ context.Context, id string, fn func(*domain.Run) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap, ok := s.runs[id]
	if !ok {
		return fmt.Errorf("select run %s: %w", id, domain.ErrRunNotFound)
	}
	run, err := domain.RehydrateRun(cloneSnapshot(snap))
	if err != nil {
		return err
	}
	if err := fn(run); err != nil {
		return err
	}
	s.runs[id] = normalize(run.Snapshot())
	return nil
}

// GetRun returns a copy of the run, or domain.ErrRunNotFound.
func (s *RunStore) GetRun(_ context.Context, id string) (*domain.Run, error) {
	s.mu.Lock()
	snap, ok := s.runs[id]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("select run %s: %w", id, domain.ErrRunNotFound)
	}
	return domain.RehydrateRun(cloneSnapshot(snap))
}

// ListRuns returns copies of the page f asks for of the runs matching it:
// newest first, ties broken by id, both descending (domain.RunKey), those
// after f.After when it is set, at most f.PageLimit().
func (s *RunStore) ListRuns(_ context.Context, f domain.RunFilter) ([]*domain.Run, error) {
	s.mu.Lock()
	var snaps []domain.RunSnapshot
	for _, snap := range s.runs {
		if (f.Status == "" || snap.Status == f.Status) && (f.Adapter == "" || snap.Adapter == f.Adapter) &&
			(f.After == nil || f.After.Before(snap.Key())) {
			snaps = append(snaps, cloneSnapshot(snap))
		}
	}
	s.mu.Unlock()

	slices.SortFunc(snaps, func(a, b domain.RunSnapshot) int { return a.Key().Compare(b.Key()) })
	snaps = snaps[:min(len(snaps), f.PageLimit())]
	runs := make([]*domain.Run, 0, len(snaps))
	for _, snap := range snaps {
		r, err := domain.RehydrateRun(snap)
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// UsageByAdapter returns one summary per adapter that has runs, ordered by
// adapter name. Running counts queued and running runs; TotalTokens sums
// domain.Usage.Total.
func (s *RunStore) UsageByAdapter(_ context.Context) ([]domain.UsageSummary, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	byAdapter := map[string]*domain.UsageSummary{}
	for _, snap := range s.runs {
		sum := byAdapter[snap.Adapter]
		if sum == nil {
			sum = &domain.UsageSummary{Adapter: snap.Adapter}
			byAdapter[snap.Adapter] = sum
		}
		sum.RunsTotal++
		switch snap.Status {
		case domain.RunSucceeded:
			sum.Succeeded++
		case domain.RunFailed:
			sum.Failed++
		case domain.RunCancelled:
			sum.Cancelled++
		case domain.RunQueued, domain.RunRunning:
			sum.Running++
		}
		if u := snap.Usage; u != nil {
			sum.PromptTokens += u.PromptTokens
			sum.CompletionTokens += u.CompletionTokens
			sum.TotalTokens += u.Total()
			sum.CostUSD += u.CostUSD
		}
	}
	out := make([]domain.UsageSummary, 0, len(byAdapter))
	for _, sum := range byAdapter {
		out = append(out, *sum)
	}
	slices.SortFunc(out, func(a, b domain.UsageSummary) int { return cmp.Compare(a.Adapter, b.Adapter) })
	return out, nil
}

// cloneSnapshot copies the one field a snapshot shares with its run.
func cloneSnapshot(s domain.RunSnapshot) domain.RunSnapshot {
	if s.Usage != nil {
		u := *s.Usage
		s.Usage = &u
	}
	return s
}

// normalize makes a stored snapshot look like one read back from SQLite:
// times in UTC at microsecond precision, and its own copy of Usage, within
// its bounds (domain.Usage.Bounded).
func normalize(s domain.RunSnapshot) domain.RunSnapshot {
	s = cloneSnapshot(s)
	if s.Usage != nil {
		*s.Usage = s.Usage.Bounded()
	}
	s.CreatedAt, s.StartedAt, s.FinishedAt = storedTime(s.CreatedAt), storedTime(s.StartedAt), storedTime(s.FinishedAt)
	return s
}

// storedTime is t as the SQLite store keeps it: UTC, truncated to the
// microsecond, the zero time staying zero.
func storedTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Truncate(time.Microsecond)
}
