// Package storetest holds contract suites for the node's store ports. Every
// implementation (the SQLite stores and the in-memory fakes) runs the same
// suites, so the fakes used in use-case tests cannot drift from the real thing.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"iop/domain"
	"iop/ports"
)

// timeTolerance is how far a stored time may be from the one written: stores
// keep at least millisecond precision.
const timeTolerance = time.Millisecond

// base is a creation time outside UTC and with sub-millisecond digits, so the
// suites see both the UTC conversion and the precision of the store.
var base = time.Date(2025, 3, 1, 12, 0, 0, 123_456_789, time.FixedZone("UTC+2", 2*3600))

// RunStoreContract checks the behaviour every ports.RunStore must have.
// newStore must return an empty store that the test may use exclusively.
func RunStoreContract(t *testing.T, newStore func(t *testing.T) ports.RunStore) {
	t.Run("create and get", func(t *testing.T) {
		s := newStore(t)
		run := mustNewRun(t, "r1", "ollama", base)
		mustCreate(t, s, run)
		got := mustGet(t, s, "r1")
		checkRun(t, got, run.Snapshot())
	})

	t.Run("get missing is ErrRunNotFound", func(t *testing.T) {
		s := newStore(t)
		_, err := s.GetRun(context.Background(), "nope")
		if !errors.Is(err, domain.ErrRunNotFound) {
			t.Fatalf("GetRun(missing) error = %v, want ErrRunNotFound", err)
		}
	})

	t.Run("update missing is ErrRunNotFound and skips fn", func(t *testing.T) {
		s := newStore(t)
		called := false
		err := s.UpdateRun(context.Background(), "nope", func(*domain.Run) error { called = true; return nil })
		if !errors.Is(err, domain.ErrRunNotFound) {
			t.Fatalf("UpdateRun(missing) error = %v, want ErrRunNotFound", err)
		}
		if called {
			t.Fatal("UpdateRun(missing) called fn")
		}
	})

	t.Run("duplicate create is an error and keeps the first", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		first := mustNewRun(t, "r1", "ollama", base)
		mustCreate(t, s, first)
		if err := s.CreateRun(ctx, mustNewRun(t, "r1", "codex", base.Add(time.Hour))); err == nil {
			t.Fatal("second CreateRun with the same id succeeded")
		}
		checkRun(t, mustGet(t, s, "r1"), first.Snapshot())
	})

	t.Run("nil create is an error", func(t *testing.T) {
		if err := newStore(t).CreateRun(context.Background(), nil); err == nil {
			t.Fatal("CreateRun(nil) succeeded")
		}
	})

	t.Run("update persists transitions", func(t *testing.T) {
		started := base.Add(time.Second)
		finished := base.Add(3*time.Second + 987_654*time.Nanosecond)
		fullUsage := &domain.Usage{
			PromptTokens: 11, CompletionTokens: 22, TotalTokens: 33, CostUSD: 0.125,
			DurationMS: 1500, StopReason: "stop", Model: "llama3.2",
		}
		cases := []struct {
			name  string
			apply func(r *domain.Run) error
			want  func(s domain.RunSnapshot) domain.RunSnapshot
		}{
			{
				name:  "start",
				apply: func(r *domain.Run) error { return r.Start(started) },
				want: func(s domain.RunSnapshot) domain.RunSnapshot {
					s.Status, s.StartedAt = domain.RunRunning, started
					return s
				},
			},
			{
				name: "complete with usage",
				apply: func(r *domain.Run) error {
					if err := r.Start(started); err != nil {
						return err
					}
					return r.Finish(domain.RunEvent{Type: domain.EventComplete, Usage: fullUsage}, finished)
				},
				want: func(s domain.RunSnapshot) domain.RunSnapshot {
					u := *fullUsage
					s.Status, s.StartedAt, s.FinishedAt, s.Usage = domain.RunSucceeded, started, finished, &u
					return s
				},
			},
			{
				name: "error without usage",
				apply: func(r *domain.Run) error {
					ev := domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: domain.CodeTimeout, Message: "it's \"late\"\n"}}
					return r.Finish(ev, finished)
				},
				want: func(s domain.RunSnapshot) domain.RunSnapshot {
					s.Status, s.FinishedAt = domain.RunFailed, finished
					s.ErrorCode, s.ErrorMessage = domain.CodeTimeout, "it's \"late\"\n"
					return s
				},
			},
			{
				name: "cancelled with zero usage",
				apply: func(r *domain.Run) error {
					return r.Finish(domain.RunEvent{Type: domain.EventCancelled, Usage: &domain.Usage{}}, finished)
				},
				want: func(s domain.RunSnapshot) domain.RunSnapshot {
					s.Status, s.FinishedAt, s.Usage = domain.RunCancelled, finished, &domain.Usage{}
					return s
				},
			},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				s, ctx := newStore(t), context.Background()
				run := mustNewRun(t, "r1", "ollama", base)
				mustCreate(t, s, run)
				if err := s.UpdateRun(ctx, "r1", tc.apply); err != nil {
					t.Fatalf("UpdateRun: %v", err)
				}
				checkRun(t, mustGet(t, s, "r1"), tc.want(run.Snapshot()))
			})
		}
	})

	t.Run("finishing twice is ErrRunAlreadyFinished and changes nothing", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		mustCreate(t, s, mustNewRun(t, "r1", "ollama", base))
		finish := func(ev domain.RunEvent, at time.Time) func(*domain.Run) error {
			return func(r *domain.Run) error { return r.Finish(ev, at) }
		}
		usage := &domain.Usage{PromptTokens: 1, CompletionTokens: 2}
		if err := s.UpdateRun(ctx, "r1", finish(domain.RunEvent{Type: domain.EventComplete, Usage: usage}, base.Add(time.Second))); err != nil {
			t.Fatalf("first finish: %v", err)
		}
		before := mustGet(t, s, "r1").Snapshot()
		second := domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "x", Message: "y"}}
		err := s.UpdateRun(ctx, "r1", finish(second, base.Add(time.Hour)))
		if !errors.Is(err, domain.ErrRunAlreadyFinished) {
			t.Fatalf("second finish error = %v, want ErrRunAlreadyFinished", err)
		}
		checkRun(t, mustGet(t, s, "r1"), before)
	})

	t.Run("fn error discards its changes", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		run := mustNewRun(t, "r1", "ollama", base)
		mustCreate(t, s, run)
		boom := errors.New("boom")
		err := s.UpdateRun(ctx, "r1", func(r *domain.Run) error {
			if err := r.Start(base.Add(time.Second)); err != nil {
				return err
			}
			return fmt.Errorf("after start: %w", boom)
		})
		if !errors.Is(err, boom) {
			t.Fatalf("UpdateRun error = %v, want fn's error", err)
		}
		checkRun(t, mustGet(t, s, "r1"), run.Snapshot())
	})

	t.Run("runs handed in and out are copies", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		run := mustNewRun(t, "r1", "ollama", base)
		want := run.Snapshot()
		mustCreate(t, s, run)
		if err := run.Start(base.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		got := mustGet(t, s, "r1")
		if err := got.Start(base.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		listed, err := s.ListRuns(ctx, domain.RunFilter{})
		if err != nil || len(listed) != 1 {
			t.Fatalf("ListRuns = %d runs, %v", len(listed), err)
		}
		if err := listed[0].Start(base.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		var kept *domain.Run
		if err := s.UpdateRun(ctx, "r1", func(r *domain.Run) error { kept = r; return nil }); err != nil {
			t.Fatal(err)
		}
		if err := kept.Start(base.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		checkRun(t, mustGet(t, s, "r1"), want)
	})

	t.Run("list filters and orders newest first", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		seed := []struct {
			id, adapter string
			at          time.Duration
			status      domain.RunStatus
		}{
			{"r1", "a", 1 * time.Minute, domain.RunQueued},
			{"r2", "b", 2 * time.Minute, domain.RunSucceeded},
			{"r3", "a", 3 * time.Minute, domain.RunFailed},
			{"r4", "a", 4 * time.Minute, domain.RunSucceeded},
			{"r5", "b", 5 * time.Minute, domain.RunRunning},
			{"r6", "a", 4 * time.Minute, domain.RunSucceeded}, // same time as r4: id breaks the tie
			{"r7", "a", 4*time.Minute + time.Millisecond, domain.RunCancelled},
			// A whole second, just before r4 and r6: "12:04:00" must sort before "12:04:00.123".
			{"r8", "a", 4*time.Minute - base.Sub(base.Truncate(time.Second)), domain.RunQueued},
		}
		for _, r := range seed {
			mustCreate(t, s, mustNewRun(t, r.id, r.adapter, base.Add(r.at)))
			if r.status != domain.RunQueued {
				if err := s.UpdateRun(ctx, r.id, transitionTo(r.status, base.Add(r.at+time.Second))); err != nil {
					t.Fatalf("UpdateRun %s: %v", r.id, err)
				}
			}
		}
		cases := []struct {
			name   string
			filter domain.RunFilter
			want   []string
		}{
			{"all", domain.RunFilter{}, []string{"r5", "r7", "r6", "r4", "r8", "r3", "r2", "r1"}},
			{"negative limit means default", domain.RunFilter{Limit: -1}, []string{"r5", "r7", "r6", "r4", "r8", "r3", "r2", "r1"}},
			{"status", domain.RunFilter{Status: domain.RunSucceeded}, []string{"r6", "r4", "r2"}},
			{"queued", domain.RunFilter{Status: domain.RunQueued}, []string{"r8", "r1"}},
			{"adapter", domain.RunFilter{Adapter: "a"}, []string{"r7", "r6", "r4", "r8", "r3", "r1"}},
			{"adapter and status", domain.RunFilter{Adapter: "a", Status: domain.RunSucceeded}, []string{"r6", "r4"}},
			{"limit", domain.RunFilter{Limit: 2}, []string{"r5", "r7"}},
			{"limit with filter", domain.RunFilter{Adapter: "b", Limit: 1}, []string{"r5"}},
			{"no match", domain.RunFilter{Adapter: "zzz"}, nil},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				runs, err := s.ListRuns(ctx, tc.filter)
				if err != nil {
					t.Fatalf("ListRuns: %v", err)
				}
				if got := ids(runs); !slices.Equal(got, tc.want) {
					t.Fatalf("ListRuns(%+v) = %v, want %v", tc.filter, got, tc.want)
				}
			})
		}
	})

	t.Run("list pages by (created_at, id) however many runs share a time", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		// r00..r11 in three instants, four runs each: every page boundary
		// but the last falls inside a group of runs created at once. The
		// times carry sub-microsecond digits (base), which a store may drop.
		for i := range 12 {
			mustCreate(t, s, mustNewRun(t, fmt.Sprintf("r%02d", i), "a", base.Add(time.Duration(i/4)*time.Minute)))
		}
		// One of another adapter and one other status, left out by the filters.
		mustCreate(t, s, mustNewRun(t, "r05x", "b", base.Add(time.Minute)))
		mustCreate(t, s, mustNewRun(t, "r06x", "a", base.Add(time.Minute)))
		if err := s.UpdateRun(ctx, "r06x", transitionTo(domain.RunSucceeded, base.Add(2*time.Minute))); err != nil {
			t.Fatal(err)
		}
		page := func(after *domain.RunKey, limit int) ([]*domain.Run, *domain.RunKey) {
			t.Helper()
			runs, err := s.ListRuns(ctx, domain.RunFilter{Adapter: "a", Status: domain.RunQueued, Limit: limit, After: after})
			if err != nil {
				t.Fatalf("ListRuns(after %+v): %v", after, err)
			}
			if len(runs) == 0 {
				return nil, nil
			}
			k := runs[len(runs)-1].Snapshot().Key()
			return runs, &k
		}
		p1, k := page(nil, 3)
		if got, want := ids(p1), []string{"r11", "r10", "r09"}; !slices.Equal(got, want) {
			t.Fatalf("page 1 = %v, want %v", got, want)
		}
		// Between pages: runs newer than the cursor (not listed), at its time
		// before and after it in id order, and older.
		mustCreate(t, s, mustNewRun(t, "r99", "a", base.Add(3*time.Minute)))
		mustCreate(t, s, mustNewRun(t, "r09z", "a", base.Add(2*time.Minute))) // sorts before r09: already passed
		mustCreate(t, s, mustNewRun(t, "r08z", "a", base.Add(2*time.Minute))) // sorts after r09: still to come
		mustCreate(t, s, mustNewRun(t, "r00a", "a", base))
		var all []string
		all = append(all, ids(p1)...)
		for pages := 0; k != nil; pages++ {
			if pages > 10 {
				t.Fatalf("no end after 10 pages: %v", all)
			}
			var p []*domain.Run
			p, k = page(k, 3)
			if len(p) > 3 {
				t.Fatalf("page of %d runs, limit 3", len(p))
			}
			all = append(all, ids(p)...)
		}
		want := []string{"r11", "r10", "r09", "r08z", "r08", "r07", "r06", "r05", "r04", "r03", "r02", "r01", "r00a", "r00"}
		if !slices.Equal(all, want) {
			t.Fatalf("pages = %v, want %v", all, want)
		}
		// The key of the last run of all: nothing after it.
		last := mustGet(t, s, "r00").Snapshot().Key()
		if rest, k := page(&last, 0); rest != nil || k != nil {
			t.Fatalf("after the last run: %v", ids(rest))
		}
		// A key of no stored run is a position all the same.
		mid := domain.RunKey{CreatedAt: base.Add(90 * time.Second), ID: "r00"}
		if p, _ := page(&mid, 2); !slices.Equal(ids(p), []string{"r07", "r06"}) {
			t.Fatalf("after %+v = %v, want [r07 r06]", mid, ids(p))
		}
	})

	t.Run("list limit defaults to 50 and caps at one more than 1000", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		const n = 1005
		for i := range n {
			mustCreate(t, s, mustNewRun(t, fmt.Sprintf("r%04d", i), "a", base.Add(time.Duration(i)*time.Second)))
		}
		cases := []struct {
			limit, want int
		}{{0, 50}, {1000, 1000}, {1001, 1001}, {1002, 1001}, {1 << 30, 1001}}
		for _, tc := range cases {
			runs, err := s.ListRuns(ctx, domain.RunFilter{Limit: tc.limit})
			if err != nil {
				t.Fatalf("ListRuns(limit %d): %v", tc.limit, err)
			}
			if len(runs) != tc.want {
				t.Fatalf("ListRuns(limit %d) returned %d runs, want %d", tc.limit, len(runs), tc.want)
			}
			if first := runs[0].ID(); first != fmt.Sprintf("r%04d", n-1) {
				t.Fatalf("ListRuns(limit %d) starts with %s, want the newest", tc.limit, first)
			}
		}
	})

	t.Run("usage by adapter", func(t *testing.T) {
		s, ctx := newStore(t), context.Background()
		empty, err := s.UsageByAdapter(ctx)
		if err != nil || len(empty) != 0 {
			t.Fatalf("UsageByAdapter(empty store) = %v, %v; want none", empty, err)
		}
		seed := []struct {
			id, adapter string
			ev          *domain.RunEvent // nil: leave queued
			start       bool
		}{
			{"a1", "ollama", &domain.RunEvent{Type: domain.EventComplete, Usage: &domain.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15, CostUSD: 0.25}}, true},
			// No total reported: Total() = prompt + completion.
			{"a2", "ollama", &domain.RunEvent{Type: domain.EventCancelled, Usage: &domain.Usage{PromptTokens: 3, CompletionTokens: 4, CostUSD: 0.5}}, true},
			{"a3", "ollama", &domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "x"}}, false},
			{"a4", "ollama", nil, false},
			{"a5", "ollama", nil, true},
			{"c1", "codex", &domain.RunEvent{Type: domain.EventComplete, Usage: &domain.Usage{TotalTokens: 100}}, true},
			{"c2", "codex", &domain.RunEvent{Type: domain.EventComplete}, true},
			{"e1", "exec", nil, false},
		}
		for i, r := range seed {
			mustCreate(t, s, mustNewRun(t, r.id, r.adapter, base.Add(time.Duration(i)*time.Second)))
			err := s.UpdateRun(ctx, r.id, func(run *domain.Run) error {
				if r.start {
					if err := run.Start(base); err != nil {
						return err
					}
				}
				if r.ev != nil {
					return run.Finish(*r.ev, base)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("UpdateRun %s: %v", r.id, err)
			}
		}
		got, err := s.UsageByAdapter(ctx)
		if err != nil {
			t.Fatalf("UsageByAdapter: %v", err)
		}
		want := []domain.UsageSummary{
			{Adapter: "codex", RunsTotal: 2, Succeeded: 2, TotalTokens: 100},
			{Adapter: "exec", RunsTotal: 1, Running: 1},
			{Adapter: "ollama", RunsTotal: 5, Succeeded: 1, Failed: 1, Cancelled: 1, Running: 2,
				PromptTokens: 13, CompletionTokens: 9, TotalTokens: 22, CostUSD: 0.75},
		}
		if !slices.Equal(got, want) {
			t.Fatalf("UsageByAdapter =\n%+v\nwant\n%+v", got, want)
		}
	})

	t.Run("usage within bounds", func(t *testing.T) {
		// One absurd report (tokens near the int64 maximum, whose total
		// wrapped negative; a cost of 1e308; NaN) is kept within the
		// bounds of domain.Usage.Bounded, and every sum over it stays an
		// integer that fits, and a finite cost.
		s, ctx := newStore(t), context.Background()
		huge := int64(math.MaxInt64 - 7)
		seed := []domain.Usage{
			{PromptTokens: huge, CompletionTokens: 100, TotalTokens: huge + 100, CostUSD: 1e308}, // the total wrapped
			{PromptTokens: huge, CompletionTokens: huge, CostUSD: 1e308},
			{PromptTokens: -5, CompletionTokens: 7, CostUSD: math.NaN()},
		}
		for i, u := range seed {
			id := fmt.Sprintf("u%d", i)
			mustCreate(t, s, mustNewRun(t, id, "openai", base.Add(time.Duration(i)*time.Second)))
			err := s.UpdateRun(ctx, id, func(run *domain.Run) error {
				if err := run.Start(base); err != nil {
					return err
				}
				return run.Finish(domain.RunEvent{Type: domain.EventComplete, Usage: &u}, base)
			})
			if err != nil {
				t.Fatalf("UpdateRun %s: %v", id, err)
			}
		}
		got := mustGet(t, s, "u0").Snapshot().Usage
		if got == nil || *got != (domain.Usage{PromptTokens: domain.MaxUsageTokens, CompletionTokens: 100, CostUSD: domain.MaxUsageCostUSD}) {
			t.Fatalf("stored usage = %+v; want the counts and cost within bounds, the negative total 0", got)
		}
		sums, err := s.UsageByAdapter(ctx)
		if err != nil {
			t.Fatalf("UsageByAdapter: %v", err)
		}
		want := []domain.UsageSummary{{Adapter: "openai", RunsTotal: 3, Succeeded: 3,
			PromptTokens: 2 * domain.MaxUsageTokens, CompletionTokens: domain.MaxUsageTokens + 107,
			TotalTokens: 3*domain.MaxUsageTokens + 107, CostUSD: 2 * domain.MaxUsageCostUSD}}
		if !slices.Equal(sums, want) {
			t.Fatalf("UsageByAdapter =\n%+v\nwant\n%+v", sums, want)
		}
	})
}

// transitionTo moves a queued run to status at time at.
func transitionTo(status domain.RunStatus, at time.Time) func(*domain.Run) error {
	return func(r *domain.Run) error {
		if err := r.Start(at); err != nil {
			return err
		}
		switch status {
		case domain.RunRunning:
			return nil
		case domain.RunSucceeded:
			return r.Finish(domain.RunEvent{Type: domain.EventComplete}, at)
		case domain.RunCancelled:
			return r.Finish(domain.RunEvent{Type: domain.EventCancelled}, at)
		default:
			return r.Finish(domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "x"}}, at)
		}
	}
}

func mustNewRun(t *testing.T, id, adapter string, created time.Time) *domain.Run {
	t.Helper()
	r, err := domain.NewRun(domain.RunRequest{
		RunID: id, Adapter: adapter, Target: "llama3.2", SessionID: "sess-" + id, Background: len(id)%2 == 0,
	}, created)
	if err != nil {
		t.Fatalf("NewRun: %v", err)
	}
	return r
}

func mustCreate(t *testing.T, s ports.RunStore, r *domain.Run) {
	t.Helper()
	if err := s.CreateRun(context.Background(), r); err != nil {
		t.Fatalf("CreateRun %s: %v", r.ID(), err)
	}
}

func mustGet(t *testing.T, s ports.RunStore, id string) *domain.Run {
	t.Helper()
	r, err := s.GetRun(context.Background(), id)
	if err != nil {
		t.Fatalf("GetRun %s: %v", id, err)
	}
	return r
}

// checkRun compares a stored run with the snapshot written, times within
// timeTolerance and in UTC.
func checkRun(t *testing.T, got *domain.Run, want domain.RunSnapshot) {
	t.Helper()
	g := got.Snapshot()
	checkTime(t, "CreatedAt", g.CreatedAt, want.CreatedAt)
	checkTime(t, "StartedAt", g.StartedAt, want.StartedAt)
	checkTime(t, "FinishedAt", g.FinishedAt, want.FinishedAt)
	g.CreatedAt, g.StartedAt, g.FinishedAt = time.Time{}, time.Time{}, time.Time{}
	want.CreatedAt, want.StartedAt, want.FinishedAt = time.Time{}, time.Time{}, time.Time{}
	if (g.Usage == nil) != (want.Usage == nil) || (g.Usage != nil && *g.Usage != *want.Usage) {
		t.Errorf("Usage = %+v, want %+v", g.Usage, want.Usage)
	}
	g.Usage, want.Usage = nil, nil
	if g != want {
		t.Errorf("run =\n%+v\nwant\n%+v", g, want)
	}
}

func checkTime(t *testing.T, name string, got, want time.Time) {
	t.Helper()
	if want.IsZero() {
		if !got.IsZero() {
			t.Errorf("%s = %v, want zero", name, got)
		}
		return
	}
	if got.Location() != time.UTC {
		t.Errorf("%s = %v, want UTC", name, got)
	}
	if d := got.Sub(want); d < -timeTolerance || d > timeTolerance {
		t.Errorf("%s = %v, want %v (±%v)", name, got, want, timeTolerance)
	}
}

// checkRecent checks that a store-stamped time lies in [from, to] (with
// tolerance) and is in UTC.
func checkRecent(t *testing.T, name string, got, from, to time.Time) {
	t.Helper()
	if got.Location() != time.UTC {
		t.Errorf("%s = %v, want UTC", name, got)
	}
	if got.Before(from.Add(-timeTolerance)) || got.After(to.Add(timeTolerance)) {
		t.Errorf("%s = %v, want between %v and %v", name, got, from, to)
	}
}

func ids(runs []*domain.Run) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.ID())
	}
	return out
}
