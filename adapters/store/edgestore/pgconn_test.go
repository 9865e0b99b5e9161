package edgestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/uptrace/bun/driver/pgdriver"

	"iop/adapters/store/edgestore"
	"iop/adapters/store/pgtest"
	"iop/domain"
)

// startPG starts a server of the test's own (one the test may restart).
func startPG(t *testing.T) (*pgtest.Server, string) {
	t.Helper()
	srv, err := pgtest.Start()
	if errors.Is(err, pgtest.ErrUnavailable) {
		t.Skipf("skipping the PostgreSQL run: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	dsn, err := srv.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return srv, dsn
}

// warmPool leaves several idle connections in the store's pool: reads at
// once each take one.
func warmPool(t *testing.T, s *edgestore.Store) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, err := s.ListRuns(context.Background(), domain.RunQuery{}); err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// recordEach records runs one at a time, each waiting to be written or
// dropped, so each is a batch of its own on a connection of the pool.
func recordEach(t *testing.T, s *edgestore.Store, dropped *atomic.Int64, ids ...string) {
	t.Helper()
	for _, id := range ids {
		before := dropped.Load()
		s.RecordRun(run(id, "n1", "exec", "k", domain.RunSucceeded, t0, nil))
		eventually(t, id+" written or dropped", func() bool {
			if dropped.Load() != before {
				return true
			}
			_, err := s.GetRun(context.Background(), id)
			return err == nil
		})
		if n := dropped.Load() - before; n != 0 {
			t.Fatalf("%s: %d rows dropped with the database up", id, n)
		}
	}
}

// A PostgreSQL restart ends the pool's idle connections; the next
// statements on them failed (FATAL 57P01) and lost their batches and
// failed reads, with the database up again. They are written and answered.
func TestPostgresRestartLosesNothing(t *testing.T) {
	srv, dsn := startPG(t)
	var dropped atomic.Int64
	s := open(t, dsn, edgestore.Options{Dropped: func(n int) { dropped.Add(int64(n)) }})
	recordEach(t, s, &dropped, "run_before")

	warmPool(t, s)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	recordEach(t, s, &dropped, "run_1", "run_2", "run_3", "run_4", "run_5")

	// Reads alike: every read after a restart is answered.
	warmPool(t, s)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 4 {
		p, err := s.ListRuns(ctx, domain.RunQuery{})
		if err != nil || len(p.Runs) != 6 {
			t.Fatalf("read %d after the restart: %d runs, %v", i, len(p.Runs), err)
		}
		if _, err := s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByKey}); err != nil {
			t.Fatalf("usage %d after the restart: %v", i, err)
		}
	}
}

// A server that ends idle sessions (idle_session_timeout, a pooler's idle
// kill) left the pool holding dead connections: the next batch was lost.
func TestPostgresIdleSessionTimeoutLosesNothing(t *testing.T) {
	_, dsn := startPG(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	admin := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn)))
	defer admin.Close()
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "ALTER DATABASE "+name+" SET idle_session_timeout = '300ms'"); err != nil {
		t.Fatal(err)
	}
	var dropped atomic.Int64
	s := open(t, dsn, edgestore.Options{Dropped: func(n int) { dropped.Add(int64(n)) }})
	for i := range 3 {
		warmPool(t, s)
		recordEach(t, s, &dropped, fmt.Sprintf("run_%d", i))
		// Until the server has ended the store's sessions (the admin's own,
		// opened before the setting, has none).
		eventually(t, "the idle sessions ended", func() bool {
			var n int
			err := admin.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", name).Scan(&n)
			return err == nil && n == 0
		})
	}
	if _, err := s.ListRuns(ctx, domain.RunQuery{}); err != nil {
		t.Fatalf("a read on ended sessions: %v", err)
	}
}
