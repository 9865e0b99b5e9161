package edgestore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/driver/sqliteshim"

	"iop/adapters/store/pgtest"
	"iop/domain"
)

// The prepared writes name their columns by hand: they must be the row
// types' columns, in the order args gives the values.
func TestPreparedColumnsMatchRows(t *testing.T) {
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "edge.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	check := func(model any, cols []string, args []any) {
		t.Helper()
		table := db.bun.Table(reflect.TypeOf(model))
		var want []string
		var vals []any
		v := reflect.ValueOf(model)
		for _, f := range table.Fields {
			want = append(want, f.Name)
			vals = append(vals, v.FieldByIndex(f.Index).Interface())
		}
		if fmt.Sprint(cols) != fmt.Sprint(want) {
			t.Fatalf("%T columns:\n got %v\nwant %v", model, cols, want)
		}
		if fmt.Sprint(args) != fmt.Sprint(vals) {
			t.Fatalf("%T args:\n got %v\nwant %v", model, args, vals)
		}
	}
	r := toRunRow("e1", domain.RunRecord{ID: "run_1", Node: "n", Adapter: "a", Target: "t", SessionID: "s", Key: "k",
		Background: true, Status: domain.RunFailed, CreatedAt: time.UnixMicro(1), FinishedAt: time.UnixMicro(2),
		ErrorCode: "c", ErrorMsg: "m", Usage: &domain.Usage{PromptTokens: 3, CompletionTokens: 4, CostUSD: 0.5, Model: "mo"}})
	check(r, runColumns, r.args())
	tu := toTunnelRow("e1", domain.TunnelRecord{ID: "tun_1", Node: "n", Provider: "p", Model: "mo", Path: "/x", Key: "k",
		Status: 200, ErrorCode: "c", BodyBytes: 9, StartedAt: time.UnixMicro(1), FinishedAt: time.UnixMicro(2),
		Usage: &domain.Usage{PromptTokens: 3, CompletionTokens: 4, CostUSD: 0.5}, Response: "resp_1", UsageOf: "resp_0"})
	args := tu.args()
	args[7] = int(args[7].(int64)) // the status column is bound as int64
	check(tu, tunnelColumns, args)
}

// Several records of one run in a batch: the last wins, once.
func TestSplitBatchKeepsTheLastRecordOfARun(t *testing.T) {
	a1 := runRow{ID: "a", Status: "running"}
	b := runRow{ID: "b", Status: "running"}
	a2 := runRow{ID: "a", Status: "succeeded"}
	tu := tunnelRow{ID: "t"}
	runs, tunnels := splitBatch([]any{a1, tu, b, a2})
	if len(runs) != 2 || runs[0].ID != "a" || runs[0].Status != "succeeded" || runs[1].ID != "b" || len(tunnels) != 1 {
		t.Fatalf("runs %+v tunnels %+v", runs, tunnels)
	}
}

// Both writes give the same rows: a later record of a run in a later batch
// replaces the first (all but id, edge and creation time), a tunnel written
// twice stays as first written.
func TestWritesUpsertAlike(t *testing.T) {
	ctx := context.Background()
	for _, way := range []struct {
		name  string
		write func(*DB, context.Context, []runRow, []tunnelRow) error
	}{{"multirow", (*DB).writeMultiRow}, {"prepared", (*DB).writePrepared}} {
		t.Run(way.name, func(t *testing.T) {
			db, err := Open(ctx, filepath.Join(t.TempDir(), "edge.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			s := &Store{db: db}
			start := domain.RunRecord{ID: "run_1", Node: "n1", Adapter: "exec", Target: "t", Status: domain.RunRunning, CreatedAt: time.UnixMicro(100)}
			fin := start
			fin.Status, fin.FinishedAt, fin.ErrorCode, fin.ErrorMsg = domain.RunFailed, time.UnixMicro(200), "adapter_error", "boom"
			fin.Usage = &domain.Usage{PromptTokens: 1, CompletionTokens: 2, CostUSD: 0.25, Model: "m"}
			fin.CreatedAt = time.UnixMicro(150) // ignored: the first record's creation time stays
			fin.Node, fin.Target = "n2", "t2"   // ignored too: what the run was is fixed at dispatch
			tun := domain.TunnelRecord{ID: "tun_1", Node: "n1", Status: 200, BodyBytes: 5, StartedAt: time.UnixMicro(100)}
			tun2 := tun
			tun2.Status = 502
			for _, batch := range [][]any{{toRunRow("e1", start), toTunnelRow("e1", tun)}, {toRunRow("e1", fin), toTunnelRow("e1", tun2)}} {
				runs, tunnels := splitBatch(batch)
				if err := way.write(db, ctx, runs, tunnels); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.GetRun(ctx, "run_1")
			if err != nil {
				t.Fatal(err)
			}
			want := fin
			want.Node, want.Target = start.Node, start.Target
			want.CreatedAt, want.FinishedAt, want.Key = time.UnixMicro(100).UTC(), time.UnixMicro(200).UTC(), domain.AnonymousName
			want.Edge = "e1"
			want.Usage = &domain.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3, CostUSD: 0.25, Model: "m"}
			gu, wu := *got.Usage, *want.Usage
			got.Usage, want.Usage = nil, nil
			if fmt.Sprintf("%+v %+v", got, gu) != fmt.Sprintf("%+v %+v", want, wu) {
				t.Fatalf("run:\n got %+v %+v\nwant %+v %+v", got, gu, want, wu)
			}
			var statuses []int
			if err := db.bun.NewSelect().Table("edge_tunnels").Column("status").Scan(ctx, &statuses); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(statuses) != "[200]" {
				t.Fatalf("tunnel statuses %v, want [200]", statuses)
			}

			// Larger batches: every row, once.
			const n = 70
			var first, second []any
			for i := range n {
				r := domain.RunRecord{ID: fmt.Sprintf("run_c%d", i), Node: "n1", Status: domain.RunRunning, CreatedAt: time.UnixMicro(int64(i + 1))}
				first = append(first, toRunRow("e1", r), toTunnelRow("e1", domain.TunnelRecord{ID: fmt.Sprintf("tun_c%d", i), Status: 200}))
				r.Status, r.FinishedAt = domain.RunSucceeded, time.UnixMicro(int64(1000+i))
				second = append(second, toRunRow("e1", r))
			}
			for _, batch := range [][]any{first, second} {
				runs, tunnels := splitBatch(batch)
				if err := way.write(db, ctx, runs, tunnels); err != nil {
					t.Fatal(err)
				}
			}
			for i := range n {
				r, err := s.GetRun(ctx, fmt.Sprintf("run_c%d", i))
				if err != nil || r.Status != domain.RunSucceeded || r.FinishedAt.UnixMicro() != int64(1000+i) || r.CreatedAt.UnixMicro() != int64(i+1) {
					t.Fatalf("run_c%d = %+v, %v", i, r, err)
				}
			}
			if c, err := db.bun.NewSelect().Table("edge_tunnels").Count(ctx); err != nil || c != n+1 {
				t.Fatalf("%d tunnels, %v; want %d", c, err, n+1)
			}
		})
	}
}

// BenchmarkWriteBatch compares, batch by batch in the same loop, a batch
// written as bun's multi-row INSERT (what the edge did on SQLite before, and
// still does on PostgreSQL) with the prepared row-by-row write, each into
// its own SQLite file, as the edge sees them under tunnel load (one row per
// request) and under run load (a run's start and finish, mostly in one
// batch), in batches of 256 and 1024, with ids like the edge's (time
// first) and, for comparison, with random ids (the edge's before). It
// reports the process CPU time per row of each (user+system, so noise from
// other processes on the machine counts little) and their ratio. Run it
// with a fixed -benchtime (e.g. 100x): the files grow with the iterations,
// and so does a row's cost.
func BenchmarkWriteBatch(b *testing.B) {
	tunnels := make([]any, 1024)
	runs := make([]any, 0, 1024)
	for i := range tunnels {
		tunnels[i] = toTunnelRow("e1", domain.TunnelRecord{ID: randomID("tun"), Node: "n1", Provider: "bench",
			Model: "chat", Path: "/v1/chat/completions", Status: 200, BodyBytes: 2750, StartedAt: time.Now(), FinishedAt: time.Now(),
			Usage: &domain.Usage{PromptTokens: 10, CompletionTokens: 50}})
	}
	for range 512 {
		rec := domain.RunRecord{ID: randomID("run"), Node: "n1", Adapter: "exec", Target: "echo",
			Status: domain.RunRunning, CreatedAt: time.Now()}
		runs = append(runs, toRunRow("e1", rec))
		rec.Status, rec.FinishedAt = domain.RunSucceeded, time.Now()
		runs = append(runs, toRunRow("e1", rec))
	}
	for _, load := range []struct {
		name  string
		batch []any
		newID func(prefix string) string
	}{
		{"tunnels-256", tunnels[:256], orderedID}, {"runs-256", runs[:256], orderedID},
		{"tunnels-1024", tunnels, orderedID}, {"runs-1024", runs, orderedID},
		{"tunnels-256-randomids", tunnels[:256], randomID},
	} {
		b.Run(load.name, func(b *testing.B) {
			ways := []struct {
				name  string
				write func(*DB, context.Context, []runRow, []tunnelRow) error
				db    *DB
				cpu   time.Duration
			}{{name: "multirow", write: (*DB).writeMultiRow}, {name: "prepared", write: (*DB).writePrepared}}
			// A batch has a deadline in the edge (Options.WriteTimeout): so here.
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			for i := range ways {
				db, err := Open(ctx, filepath.Join(b.TempDir(), ways[i].name+".db"))
				if err != nil {
					b.Fatal(err)
				}
				defer db.Close()
				ways[i].db = db
			}
			batch := make([]any, len(load.batch))
			for i := 0; b.Loop(); i++ {
				// Fresh ids each round (inserts, not conflicts), like the edge's.
				fresh := map[string]string{}
				for j, r := range load.batch {
					switch r := r.(type) {
					case runRow:
						if fresh[r.ID] == "" {
							fresh[r.ID] = load.newID("run")
						}
						r.ID = fresh[r.ID]
						batch[j] = r
					case tunnelRow:
						r.ID = load.newID("tun")
						batch[j] = r
					}
				}
				for k := range ways {
					w := &ways[(i+k)%len(ways)] // alternate who goes first
					runs, tunnels := splitBatch(batch)
					c0 := processCPU(b)
					if err := w.write(w.db, ctx, runs, tunnels); err != nil {
						b.Fatal(err)
					}
					w.cpu += processCPU(b) - c0
				}
			}
			rows := float64(b.N * len(load.batch))
			for _, w := range ways {
				b.ReportMetric(float64(w.cpu.Nanoseconds())/rows, w.name+"-cpu-ns/row")
			}
			b.ReportMetric(float64(ways[1].cpu)/float64(ways[0].cpu), "prepared/multirow")
		})
	}
}

// processCPU is the process's user+system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// randomID is an id as the edge made them before: random, so the index
// took inserts all over.
func randomID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// orderedID is an id as the edge makes them (application/edge
// timeOrderedID): milliseconds first, then random bits.
func orderedID(prefix string) string {
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], uint64(time.Now().UnixMilli())<<16)
	_, _ = rand.Read(b[6:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// TestPageSize: a new SQLite store gets 2 KiB pages (so a B-tree split's
// scratch buffer fits a reused slot of the C heap; see Open), and a store
// made before keeps its 4 KiB pages and still works.
func TestPageSize(t *testing.T) {
	ctx := context.Background()
	pageSize := func(db *DB) int {
		var n int
		if err := db.bun.DB.QueryRowContext(ctx, "PRAGMA page_size").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	fresh, err := Open(ctx, filepath.Join(t.TempDir(), "new.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if n := pageSize(fresh); n != 2048 {
		t.Fatalf("new store: page size %d, want 2048", n)
	}

	path := filepath.Join(t.TempDir(), "old.db")
	old, err := sql.Open(sqliteshim.ShimName, sqliteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"PRAGMA page_size = 4096", "PRAGMA journal_mode = WAL", "CREATE TABLE made_before (x INTEGER)"} {
		if _, err := old.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if n := pageSize(db); n != 4096 {
		t.Fatalf("existing store: page size %d, want its 4096", n)
	}
	rec := domain.RunRecord{ID: "run_old", Node: "n1", Adapter: "exec", Status: domain.RunSucceeded, CreatedAt: time.UnixMicro(1), FinishedAt: time.UnixMicro(2)}
	if err := db.writePrepared(ctx, []runRow{toRunRow("e1", rec)}, nil); err != nil {
		t.Fatal(err)
	}
	var status string
	if err := db.bun.DB.QueryRowContext(ctx, "SELECT status FROM edge_runs WHERE id = 'run_old'").Scan(&status); err != nil || status != string(domain.RunSucceeded) {
		t.Fatalf("status %q, %v", status, err)
	}
}

// A PostgreSQL batch refused for one row's data is written again row by
// row: the bad row alone is lost (counted), the others are written. The
// rows here skip toRunRow, whose cleaning would take the NUL out.
func TestPostgresRefusedBatchFallsBackToRows(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{db: db}
	defer db.Close()
	var batch []any
	for i := range 4 {
		batch = append(batch, runRow{ID: fmt.Sprintf("run_%d", i), Status: "succeeded", KeyName: "k"})
	}
	batch = append(batch, runRow{ID: "run_bad", Status: "failed", ErrorMessage: "a\x00b"},
		tunnelRow{ID: "tun_good", Path: "/x"}, tunnelRow{ID: "tun_bad", Path: "/\x00"})
	lost, err := s.writeBatch(ctx, batch)
	if lost != 2 || err == nil {
		t.Fatalf("writeBatch lost %d rows (%v), want the 2 bad ones", lost, err)
	}
	if got := storedIDs(t, db); got != "[run_0 run_1 run_2 run_3] [tun_good]" {
		t.Fatalf("written %s, want every good row", got)
	}
}

// Only a refusal of a row's data is worth a row by row retry, not an
// unreachable server.
func TestRefusedRow(t *testing.T) {
	if refusedRow(errors.New("dial tcp: connection refused")) || refusedRow(context.DeadlineExceeded) {
		t.Fatal("a connection failure counted as a refused row")
	}
}

// deleteCounter counts the DELETE statements run on a DB.
type deleteCounter struct{ n atomic.Int64 }

func (c *deleteCounter) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context {
	return ctx
}
func (c *deleteCounter) AfterQuery(_ context.Context, e *bun.QueryEvent) {
	if strings.HasPrefix(e.Query, "DELETE") {
		c.n.Add(1)
	}
}

// Prune deletes in chunks, each its own statement, so on SQLite's one
// connection writers and readers get their turns between them; what it
// keeps stays (runs in flight, recent rows).
func TestPruneDeletesInChunks(t *testing.T) {
	ctx := context.Background()
	for name, dsn := range map[string]func(t *testing.T) string{
		"sqlite":   func(t *testing.T) string { return filepath.Join(t.TempDir(), "edge.db") },
		"postgres": func(t *testing.T) string { return pgtest.DSN(t) },
	} {
		t.Run(name, func(t *testing.T) {
			db, err := Open(ctx, dsn(t))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			s := &Store{db: db}
			var runs []runRow
			var tunnels []tunnelRow
			for i := range 25 { // expired: 6 full chunks of 4 and one of 1
				runs = append(runs, runRow{ID: fmt.Sprintf("run_old%02d", i), Status: "succeeded", CreatedUS: 1, FinishedUS: 2})
			}
			runs = append(runs, runRow{ID: "run_live", Status: "running", CreatedUS: 1},
				runRow{ID: "run_new", Status: "succeeded", CreatedUS: 100, FinishedUS: 101})
			for i := range 8 { // expired: 2 full chunks, then an empty one
				tunnels = append(tunnels, tunnelRow{ID: fmt.Sprintf("tun_old%d", i), StartedUS: 1})
			}
			tunnels = append(tunnels, tunnelRow{ID: "tun_new", StartedUS: 100})
			if err := db.writeMultiRow(ctx, runs, tunnels); err != nil {
				t.Fatal(err)
			}
			var deletes deleteCounter
			db.bun = db.bun.WithQueryHook(&deletes)
			n, err := s.pruneChunks(ctx, time.UnixMicro(50), 4)
			if err != nil || n != 33 {
				t.Fatalf("pruned %d rows, %v; want 33", n, err)
			}
			if got := deletes.n.Load(); got != 7+3 {
				t.Fatalf("%d DELETE statements, want 10 (chunks of at most 4 rows)", got)
			}
			if got := storedIDs(t, db); got != "[run_live run_new] [tun_new]" {
				t.Fatalf("kept %s", got)
			}
		})
	}
}

// A later record of a run without a model (one a repair made from the
// node's store, which has none) keeps the model stored before it, whether
// the two are written in one batch or in two; one with a model replaces it.
func TestLaterRecordWithoutModelKeepsStoredModel(t *testing.T) {
	ctx := context.Background()
	for _, way := range []struct {
		name  string
		dsn   func(t *testing.T) string
		write func(*DB, context.Context, []runRow, []tunnelRow) error
	}{
		{"sqlite-multirow", func(t *testing.T) string { return filepath.Join(t.TempDir(), "edge.db") }, (*DB).writeMultiRow},
		{"sqlite-prepared", func(t *testing.T) string { return filepath.Join(t.TempDir(), "edge.db") }, (*DB).writePrepared},
		{"postgres-multirow", func(t *testing.T) string { return pgtest.DSN(t) }, (*DB).writeMultiRow},
	} {
		t.Run(way.name, func(t *testing.T) {
			db, err := Open(ctx, way.dsn(t))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			s := &Store{db: db}
			rec := func(id, model string) runRow {
				r := domain.RunRecord{ID: id, Node: "n1", Adapter: "exec", Status: domain.RunSucceeded,
					CreatedAt: time.UnixMicro(1), FinishedAt: time.UnixMicro(2), Usage: &domain.Usage{TotalTokens: 5, Model: model}}
				return toRunRow("e1", r)
			}
			write := func(rows ...any) {
				t.Helper()
				runs, tunnels := splitBatch(rows)
				if err := way.write(db, ctx, runs, tunnels); err != nil {
					t.Fatal(err)
				}
			}
			write(rec("run_two", "m1"))
			write(rec("run_two", ""))
			write(rec("run_one", "m1"), rec("run_one", ""))
			write(rec("run_new", "m1"))
			write(rec("run_new", "m2"))
			for id, want := range map[string]string{"run_two": "m1", "run_one": "m1", "run_new": "m2"} {
				r, err := s.GetRun(ctx, id)
				if err != nil || r.Usage == nil || r.Usage.Model != want {
					t.Fatalf("%s: %+v %v; want model %q", id, r.Usage, err, want)
				}
			}
		})
	}
}

// storedIDs lists the run ids and the tunnel ids in db, each sorted:
// "[run_a run_b] [tun_c]". It reads as the store's reads do.
func storedIDs(t *testing.T, db *DB) string {
	t.Helper()
	ctx := context.Background()
	var ids, tuns []string
	if err := db.read.NewSelect().Table("edge_runs").Column("id").Order("id").Scan(ctx, &ids); err != nil {
		t.Fatal(err)
	}
	if err := db.read.NewSelect().Table("edge_tunnels").Column("id").Order("id").Scan(ctx, &tuns); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(ids, tuns)
}

// The rows a prune deletes give their pages back to the file system: a new
// history file shrinks after its retention passes instead of keeping the
// largest size it reached. A file made before the store set incremental
// auto-vacuum gives nothing back (it takes a VACUUM to switch).
func TestReclaimAfterPrune(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "edge.db")
	db, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	msg := strings.Repeat("e", 2000)
	for b := range 20 {
		var runs []runRow
		for i := range 200 {
			runs = append(runs, runRow{ID: fmt.Sprintf("run_%02d_%03d", b, i), Status: "failed", CreatedUS: 1, FinishedUS: 2,
				ErrorCode: "adapter_error", ErrorMessage: msg})
		}
		if err := db.writeMultiRow(ctx, runs, nil); err != nil {
			t.Fatal(err)
		}
	}
	files := func() int64 {
		var total int64
		for _, p := range []string{path, path + "-wal"} {
			if st, err := os.Stat(p); err == nil {
				total += st.Size()
			}
		}
		return total
	}
	grown := files()
	s := &Store{db: db}
	if n, err := s.Prune(ctx, time.UnixMicro(50)); err != nil || n != 4000 {
		t.Fatalf("pruned %d rows, %v", n, err)
	}
	freed, err := db.Reclaim(ctx)
	if err != nil || freed < 6<<20 {
		t.Fatalf("Reclaim = %d, %v; want the ≈ 8 MB pruned given back", freed, err)
	}
	if now := files(); now > grown/4 {
		t.Fatalf("the history's files take %d bytes after the prune, %d before", now, grown)
	}
	if err := db.writeMultiRow(ctx, []runRow{{ID: "run_after", Status: "succeeded", CreatedUS: 100, FinishedUS: 101}}, nil); err != nil {
		t.Fatal(err)
	}
	if got := storedIDs(t, db); got != "[run_after] []" {
		t.Fatalf("kept %s", got)
	}

	oldPath := filepath.Join(t.TempDir(), "old.db")
	old, err := sql.Open(sqliteshim.ShimName, sqliteDSN(oldPath))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"PRAGMA journal_mode = WAL", "CREATE TABLE made_before (x TEXT)",
		"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) INSERT INTO made_before SELECT printf('%.5000c', 'x') FROM n",
		"DELETE FROM made_before"} {
		if _, err := old.ExecContext(ctx, q); err != nil {
			t.Fatal(q, err)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	made, err := Open(ctx, oldPath)
	if err != nil {
		t.Fatal(err)
	}
	defer made.Close()
	if freed, err := made.Reclaim(ctx); err != nil || freed != 0 {
		t.Fatalf("Reclaim of a file made before = %d, %v; want 0, nil", freed, err)
	}
}

// insertCounter counts the INSERT statements run on a DB.
type insertCounter struct{ n atomic.Int64 }

func (c *insertCounter) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context {
	return ctx
}
func (c *insertCounter) AfterQuery(_ context.Context, e *bun.QueryEvent) {
	if strings.HasPrefix(e.Query, "INSERT") {
		c.n.Add(1)
	}
}

// A batch refused for what the database is, not for a row's data (the
// edge's role may not write the tables: 42501; a table is missing: 42P01),
// is lost in one statement: written again row by row it failed the same
// way, once per row, up to a batch of 1,024.
func TestPostgresBatchRefusedForTheDatabaseIsNotRetriedByRow(t *testing.T) {
	ctx := context.Background()
	dsn, owner, role, roleDSN := ownerAndRole(t, "reader_")
	execAll(t, owner,
		"CREATE ROLE "+role+" LOGIN",
		"GRANT CREATE ON SCHEMA public TO "+role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON edge_runs, edge_tunnels TO "+role,
		"GRANT SELECT ON edge_schema_migrations TO "+role,
	)
	for _, c := range []struct {
		name string
		dsn  string
		prep string
	}{
		// Taken away once the edge runs (one lacking them at start is
		// refused: TestPostgresRoleThatMayNotWriteTheHistoryIsRefused).
		{"insufficient privilege", roleDSN, "REVOKE INSERT, UPDATE, DELETE ON edge_runs, edge_tunnels FROM " + role},
		{"undefined table", dsn, "ALTER TABLE edge_tunnels RENAME TO edge_tunnels_gone"},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, err := Open(ctx, c.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if c.prep != "" {
				if _, err := owner.bun.ExecContext(ctx, c.prep); err != nil {
					t.Fatal(err)
				}
			}
			var inserts insertCounter
			db.bun = db.bun.WithQueryHook(&inserts)
			s := &Store{db: db}
			var batch []any
			for i := range 5 {
				batch = append(batch, tunnelRow{ID: fmt.Sprintf("tun_%d", i), Path: "/x"})
			}
			lost, err := s.writeBatch(ctx, batch)
			if lost != 5 || err == nil {
				t.Fatalf("writeBatch lost %d rows (%v), want all 5", lost, err)
			}
			if n := inserts.n.Load(); n != 1 {
				t.Fatalf("%d INSERT statements (%v), want the batch's one", n, err)
			}
		})
	}
}

// Rows written before the store clamped usage numbers may hold anything:
// the usage sums read each within the same bounds, so such a row no
// longer fails every sum over it.
func TestUsageBoundsRowsWrittenBefore(t *testing.T) {
	onBothDatabases(t, func(t *testing.T, db *DB) {
		ctx := context.Background()
		s := &Store{db: db}
		old := runRow{Status: "succeeded", KeyName: "k", PromptTokens: math.MaxInt64, CompletionTokens: -7,
			TotalTokens: math.MaxInt64, CostUSD: 1.5e308, HasUsage: true}
		a, b := old, old
		a.ID, b.ID = "run_a", "run_b"
		if lost, err := s.writeBatch(ctx, []any{a, b, tunnelRow{ID: "tun_a", KeyName: "k", TotalTokens: math.MaxInt64, CostUSD: -3}}); lost != 0 {
			t.Fatal(err)
		}
		u, err := s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByKey})
		if err != nil {
			t.Fatal(err)
		}
		if len(u) != 1 || u[0].PromptTokens != 2*domain.MaxUsageTokens || u[0].CompletionTokens != 0 || u[0].TotalTokens != 3*domain.MaxUsageTokens || u[0].CostUSD != 2*domain.MaxUsageCostUSD {
			t.Fatalf("usage %+v", u)
		}
	})
}

// A NaN or infinite cost a history holds from before costs were bounded
// (PostgreSQL stores NaN; both store infinities) counts 0 in the sums, as
// it is written now: PostgreSQL orders NaN above every number, so the
// clamp alone read it as the 1e9 bound.
func TestUsageCountsNonFiniteCostsAsZero(t *testing.T) {
	onBothDatabases(t, func(t *testing.T, db *DB) {
		ctx := context.Background()
		s := &Store{db: db}
		costs := []float64{math.Inf(1), math.Inf(-1), 0.25}
		if db.postgres {
			costs = append(costs, math.NaN()) // SQLite stores NaN as NULL, which the column refuses
		}
		var rows []any
		for i, c := range costs {
			rows = append(rows, runRow{ID: fmt.Sprintf("run_%d", i), Status: "succeeded", KeyName: "k", CostUSD: c, HasUsage: true})
		}
		if lost, err := s.writeBatch(ctx, rows); lost != 0 {
			t.Fatal(err)
		}
		u, err := s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByKey})
		if err != nil {
			t.Fatal(err)
		}
		if len(u) != 1 || u[0].CostUSD != 0.25 {
			t.Fatalf("usage %+v, want the finite 0.25 only", u)
		}
	})
}

// A sum past what its type holds is told apart from an unreachable
// database, on both: the caller is told to narrow the range.
func TestSumOverflowed(t *testing.T) {
	onBothDatabases(t, func(t *testing.T, db *DB) {
		ctx := context.Background()
		var n int64
		err := db.bun.NewRaw("SELECT SUM(x) FROM (SELECT CAST(9223372036854775807 AS BIGINT) AS x UNION ALL SELECT 1) AS v").Scan(ctx, &n)
		if err == nil || !sumOverflowed(err) {
			t.Fatalf("sum past int64: %v, counted as an overflow: %v", err, err != nil && sumOverflowed(err))
		}
		if e := usageError("sum runs", err); domain.CodeOf(e) != domain.CodeInvalidRequest || !strings.Contains(e.Error(), "narrow since and until") {
			t.Fatalf("usageError = %v", e)
		}
		if sumOverflowed(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")) {
			t.Fatal("a connection failure counted as an overflow")
		}
	})
}

// onBothDatabases runs test on a new SQLite history file and on a new
// database of a throwaway PostgreSQL server, each opened (and closed after).
func onBothDatabases(t *testing.T, test func(t *testing.T, db *DB)) {
	for name, dsn := range map[string]func() string{
		"sqlite":   func() string { return filepath.Join(t.TempDir(), "edge.db") },
		"postgres": func() string { return pgtest.DSN(t) },
	} {
		t.Run(name, func(t *testing.T) {
			db, err := Open(context.Background(), dsn())
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			test(t, db)
		})
	}
}
