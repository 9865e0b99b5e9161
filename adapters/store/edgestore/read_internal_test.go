package edgestore

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"iop/adapters/store/pgtest"
	"iop/domain"
)

// holdRead opens a read on the store's read path and leaves it going (a
// rows iterator one row in, as a long usage sum or listing is) until
// release or the test's end.
func holdRead(t *testing.T, db *DB) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.read.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := conn.QueryContext(ctx, "SELECT id FROM edge_runs")
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatalf("the held read has no row: %v", rows.Err())
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = rows.Close(); _ = conn.Close() }) }
	t.Cleanup(release)
	return release
}

// A read of the SQLite history (a usage sum or a listing over millions of
// rows takes seconds) shared the writer's one connection: the writer's
// batch waited for it, and after WriteTimeout its rows were dropped. Reads
// have their own connections now; the writer commits beside a read that
// is still going, and the rows it wrote are read meanwhile.
func TestSQLiteWritesGoOnBesideAHeldRead(t *testing.T) {
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "edge.db"))
	if err != nil {
		t.Fatal(err)
	}
	var dropped atomic.Int64
	s := New(db, Options{FlushInterval: 10 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, Retention: -1,
		Dropped: func(n int) { dropped.Add(int64(n)) }})
	defer s.Close()
	s.RecordRun(domain.RunRecord{ID: "run_first", Node: "n1", Adapter: "exec", Status: domain.RunRunning, CreatedAt: time.Now()})
	waitWritten(t, s, &dropped, "run_first")

	holdRead(t, db)
	for i := range 3 {
		id := fmt.Sprintf("run_%d", i)
		s.RecordRun(domain.RunRecord{ID: id, Node: "n1", Adapter: "exec", Status: domain.RunRunning, CreatedAt: time.Now()})
		waitWritten(t, s, &dropped, id)
	}
}

// waitWritten waits until id can be read from s, failing if a row is
// dropped first.
func waitWritten(t *testing.T, s *Store, dropped *atomic.Int64, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n := dropped.Load(); n != 0 {
			t.Fatalf("%d history rows dropped while a read was going", n)
		}
		// Each try bounded: on a store whose reads wait for the writer's
		// connection, the drop is what the test reports.
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := s.GetRun(ctx, id)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s neither written nor dropped: %v", id, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A truncating checkpoint (after a prune gave pages back) waits for every
// reader by the busy handler, on the one connection the SQLite history
// writes on: with a read going, every batch waited behind it for the whole
// busy_timeout. It does not wait now (the next automatic checkpoint
// finishes the job), and the connection keeps its busy_timeout.
func TestSQLiteReclaimDoesNotWaitForAReader(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "edge.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := &Store{db: db}
	var runs []any
	for i := range 3000 {
		runs = append(runs, runRow{ID: fmt.Sprintf("run_%05d", i), Status: "succeeded", CreatedUS: 1, FinishedUS: 2,
			ErrorMessage: strings.Repeat("x", 200)})
	}
	if lost, err := s.writeBatch(ctx, runs); lost != 0 {
		t.Fatal(err)
	}
	if _, err := s.Prune(ctx, time.UnixMicro(10)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.bun.DB.ExecContext(ctx, "INSERT INTO edge_runs (id, edge_id, node, adapter, target, session_id, key_name, background, status, created_us, finished_us, error_code, error_message, model, prompt_tokens, completion_tokens, total_tokens, cost_usd, has_usage) VALUES ('run_kept', '', '', '', '', '', '', false, 'running', 1, 0, '', '', '', 0, 0, 0, 0, false)"); err != nil {
		t.Fatal(err)
	}
	release := holdRead(t, db)
	// Longer than the test waits for the reclaim.
	if _, err := db.bun.DB.ExecContext(ctx, "PRAGMA busy_timeout = 60000"); err != nil {
		t.Fatal(err)
	}
	type result struct {
		freed int64
		err   error
	}
	done := make(chan result, 1)
	go func() {
		freed, err := db.Reclaim(ctx)
		done <- result{freed, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		release()
		<-done
		t.Fatal("the reclaim waited for the reader")
	}
	freed, err := r.freed, r.err
	if err != nil {
		t.Fatalf("reclaim beside a reader: %v", err)
	}
	if freed == 0 {
		t.Fatal("the prune freed no pages: the test checks nothing")
	}
	var busy int64
	if err := db.bun.DB.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil || busy != 60000 {
		t.Fatalf("busy_timeout after the reclaim: %d, %v", busy, err)
	}
}

// A read that runs out of the read timeout is answered as a timeout the
// caller can act on (504), not as the database being down (503).
func TestReadTimeoutIsATimeout(t *testing.T) {
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "edge.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := &Store{db: db, opts: Options{ReadTimeout: time.Nanosecond}}
	time.Sleep(time.Millisecond)
	_, err = s.ListRuns(context.Background(), domain.RunQuery{Key: "nobody"})
	if domain.CodeOf(err) != domain.CodeTimeout || !strings.Contains(err.Error(), "narrow the query") {
		t.Fatalf("ListRuns past the read timeout: %v (code %s)", err, domain.CodeOf(err))
	}
	_, err = s.Usage(context.Background(), domain.UsageQuery{GroupBy: domain.GroupByKey})
	if domain.CodeOf(err) != domain.CodeTimeout {
		t.Fatalf("Usage past the read timeout: %v (code %s)", err, domain.CodeOf(err))
	}
	// The caller's own deadline stays the caller's.
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	s.opts.ReadTimeout = time.Hour
	if _, err = s.GetRun(ctx, "run_x"); err == nil || domain.CodeOf(err) == domain.CodeTimeout {
		t.Fatalf("GetRun past the caller's deadline: %v (code %s)", err, domain.CodeOf(err))
	}
}

// The runs in flight (?status=running, asked on every load of the
// console) are read through an index, not by walking the whole history.
func TestListByLiveStatusUsesAnIndex(t *testing.T) {
	onBothDatabases(t, func(t *testing.T, db *DB) {
		ctx := context.Background()
		s := &Store{db: db}
		for _, q := range []domain.RunQuery{
			{Status: domain.RunRunning},
			{Status: domain.RunQueued},
			{Status: domain.RunRunning, Since: time.UnixMicro(5), Cursor: encodeCursor(100, "run_x")},
		} {
			var rows []runRow
			sel, err := s.listQuery(q, &rows, 200)
			if err != nil {
				t.Fatal(err)
			}
			var plan []string
			if db.postgres {
				// An empty table is read whole by PostgreSQL's choice;
				// without that choice the plan must still find an index.
				err = db.bun.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
					if _, err := tx.ExecContext(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
						return err
					}
					return tx.NewRaw("EXPLAIN "+sel.String()).Scan(ctx, &plan)
				})
			} else {
				plan, err = sqlitePlan(ctx, db, sel.String())
			}
			if err != nil {
				t.Fatal(err)
			}
			if p := strings.Join(plan, "\n"); !strings.Contains(p, "edge_runs_live_idx") {
				t.Fatalf("%+v: plan does not use edge_runs_live_idx:\n%s", q, p)
			}
		}
	})
}

// PostgreSQL's writes have connections of their own: reads holding every
// connection of the read pool leave the writer one.
func TestPostgresWritesGoOnBesideHeldReads(t *testing.T) {
	db, err := Open(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	var dropped atomic.Int64
	s := New(db, Options{FlushInterval: 10 * time.Millisecond, WriteTimeout: 2 * time.Second, Retention: -1,
		Dropped: func(n int) { dropped.Add(int64(n)) }})
	defer s.Close()
	s.RecordRun(domain.RunRecord{ID: "run_first", Node: "n1", Adapter: "exec", Status: domain.RunRunning, CreatedAt: time.Now()})
	ctx := context.Background()
	for {
		if _, err := s.GetRun(ctx, "run_first"); err == nil {
			break
		}
		if dropped.Load() != 0 {
			t.Fatal("a row dropped with the database up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range readConns {
		holdRead(t, db)
	}
	s.RecordRun(domain.RunRecord{ID: "run_2", Node: "n1", Adapter: "exec", Status: domain.RunRunning, CreatedAt: time.Now()})
	// Seen through the writer's pool: the readers' are all held.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n := dropped.Load(); n != 0 {
			t.Fatalf("%d rows dropped while reads held their pool", n)
		}
		// Bounded: on a store whose writes wait for the reads' connections,
		// the drop is what the test reports.
		var n int
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := db.bun.NewSelect().Table("edge_runs").ColumnExpr("count(*)").Where("id = 'run_2'").Scan(cctx, &n)
		cancel()
		if err == nil && n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("run_2 neither written nor dropped")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sqlitePlan is the detail column of EXPLAIN QUERY PLAN query.
func sqlitePlan(ctx context.Context, db *DB, query string) ([]string, error) {
	rows, err := db.read.QueryContext(ctx, "EXPLAIN QUERY PLAN "+query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			return nil, err
		}
		plan = append(plan, detail)
	}
	return plan, rows.Err()
}

// On PostgreSQL a read slower than the DSN's read_timeout (a usage sum
// over a month) is not cut off as a database that is down: the store's
// ReadTimeout bounds it. Here a lock holds the read for several read
// timeouts; it used to fail with "read tcp …: i/o timeout", code internal
// (503 history_unavailable).
func TestPostgresReadOutlastsTheReadTimeout(t *testing.T) {
	const readTimeout = 250 * time.Millisecond
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	db, err := Open(ctx, dsn+"&read_timeout="+readTimeout.String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := &Store{db: db, opts: Options{ReadTimeout: time.Minute}}
	tx, err := db.bun.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "LOCK TABLE edge_runs IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.GetRun(ctx, "run_x")
		done <- err
	}()
	time.Sleep(4 * readTimeout)
	select {
	case err := <-done:
		t.Fatalf("GetRun returned while the table was locked: %v (code %s)", err, domain.CodeOf(err))
	default:
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; domain.CodeOf(err) != domain.CodeRunNotFound {
		t.Fatalf("GetRun once the lock was gone: %v, want run_not_found", err)
	}
}
