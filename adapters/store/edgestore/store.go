package edgestore

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/driver/pgdriver"

	"iop/adapters/store/internal/usagesql"
	"iop/domain"
	"iop/internal/every"
	"iop/internal/lossreport"
)

// Options tune a Store; zero values take the defaults.
type Options struct {
	EdgeID string // written on every row; several edges may share a database
	// QueueSize bounds rows waiting to be written (default 4096); a row
	// that does not fit is dropped and counted.
	QueueSize int
	// BatchSize is the most rows written in one transaction (default 1024):
	// under load a batch holds what arrived in a FlushInterval, and one
	// commit of many rows writes each touched page once.
	BatchSize int
	// FlushInterval is the longest a row waits for its batch (default 200 ms).
	FlushInterval time.Duration
	// WriteTimeout bounds one batch write (default 5 s); a batch that fails
	// is dropped and counted, never retried forever. On PostgreSQL a batch
	// whose connection broke is tried once more, and a batch refused for a
	// row's data is written row by row, within the same timeout; only the
	// rows that fail are dropped.
	WriteTimeout time.Duration
	// Retention: rows older than this are pruned (default 30 days; <0 keeps all).
	Retention time.Duration
	// PruneInterval is how often pruning runs (default 1 h).
	PruneInterval time.Duration
	// ReadTimeout bounds one history read (GetRun, ListRuns, Usage;
	// default 30 s): one that takes longer is given up and answered
	// domain.CodeTimeout, so no read holds a connection for ever.
	ReadTimeout time.Duration
	// Dropped is told how many rows were lost (for a metric); may be nil.
	Dropped func(n int)
	Logger  *slog.Logger
}

// Store records and answers the edge's history. Record* never block: rows
// go to a bounded queue that one writer goroutine drains in batches.
type Store struct {
	db   *DB
	opts Options
	log  *slog.Logger

	queue chan any // runRow | tunnelRow | syncMark
	// kick wakes the writer before its next interval: a batch's worth of
	// rows is waiting, or the queue was closed.
	kick chan struct{}
	stop context.CancelFunc
	wg   sync.WaitGroup
	mu   sync.RWMutex // orders Record against Close
	done bool

	// lost logs dropped rows: the first drop at once, later ones as one
	// line per droppedLogEvery with their count; what is counted after a
	// line is logged by its timer or at Close, never left unreported.
	lost *lossreport.Reporter
}

// droppedLogEvery is the most often dropped history rows are logged.
const droppedLogEvery = 10 * time.Second

// New starts the writer and the pruner on db; Close stops them.
func New(db *DB, o Options) *Store {
	if o.QueueSize <= 0 {
		o.QueueSize = 4096
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 1024
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = 200 * time.Millisecond
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 5 * time.Second
	}
	if o.Retention == 0 {
		o.Retention = 30 * 24 * time.Hour
	}
	if o.PruneInterval <= 0 {
		o.PruneInterval = time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{db: db, opts: o, log: o.Logger, queue: make(chan any, o.QueueSize), kick: make(chan struct{}, 1), stop: cancel}
	s.lost = lossreport.New(droppedLogEvery, func(err error, _ []any) {
		s.log.Warn("history rows dropped", "rows", 1, "err", err)
	}, func(n int, err error) {
		s.log.Warn("history rows dropped", "rows", n, "err", err)
	})
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.write(ctx) }()
	go func() { defer s.wg.Done(); s.prune(ctx) }()
	return s
}

// RecordRun queues r. The first record of an id writes all of it; a later
// one replaces the run's outcome (status, finish, error, usage) and keeps
// what the run was (node, adapter, target, session, key, background; see
// runUpdate).
func (s *Store) RecordRun(r domain.RunRecord) { s.enqueue(toRunRow(s.opts.EdgeID, r)) }

// RecordTunnel queues t.
func (s *Store) RecordTunnel(t domain.TunnelRecord) { s.enqueue(toTunnelRow(s.opts.EdgeID, t)) }

func (s *Store) enqueue(row any) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.done {
		s.dropped(1, errors.New("the store is closed"))
		return
	}
	select {
	case s.queue <- row:
		if len(s.queue) >= s.opts.BatchSize {
			s.wake()
		}
	default:
		s.dropped(1, errors.New("the write queue is full"))
	}
}

// syncMark, queued behind the rows recorded before it, is closed once the
// writer has written (or dropped) them.
type syncMark chan struct{}

// settleWait bounds how long a read waits for the rows recorded before it.
const settleWait = time.Second

// settle waits until the rows recorded before it are written, so that a
// read right after a change through this edge sees it: a run just started
// or cancelled is listed as it is, not as it was up to a FlushInterval
// ago. The wait ends early, the read then seeing what is written, at
// settleWait (a slow or unreachable database: the read would wait for it
// anyway), with ctx, or at once when the queue is full (the writer is
// behind and the read cannot be made to wait for all of it) or the store
// is closed. A mark takes a queue slot only until the writer reaches it.
func (s *Store) settle(ctx context.Context) {
	mark := make(syncMark)
	s.mu.RLock()
	queued := false
	if !s.done {
		select {
		case s.queue <- mark:
			queued = true
		default:
		}
	}
	s.mu.RUnlock()
	if !queued {
		return
	}
	s.wake()
	t := time.NewTimer(settleWait)
	defer t.Stop()
	select {
	case <-mark:
	case <-t.C:
	case <-ctx.Done():
	}
}

func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// dropped counts lost rows at once and logs them at most every 10 s, so
// an outage costs one line per interval, not one per row; every dropped
// row is in some line, at Close at the latest.
func (s *Store) dropped(n int, err error) {
	if s.opts.Dropped != nil {
		s.opts.Dropped(n)
	}
	s.lost.Lost(n, err)
}

// EdgeID is the edge id the store writes on every row, as stored (the
// Edge of the records it reads back that this edge wrote).
func (s *Store) EdgeID() string { return text(s.opts.EdgeID, 255) }

// Shared reports whether other edges may write this history too: a
// PostgreSQL one may be shared, an SQLite file is one edge's (whose
// earlier edge ids, a host name that changed, are its own).
func (s *Store) Shared() bool { return s.db.postgres }

// Close flushes what is queued (bounded by the write timeout), stops the
// goroutines and closes the database.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return nil
	}
	s.done = true
	close(s.queue)
	s.mu.Unlock()
	s.wake()
	s.stop()
	s.wg.Wait()
	s.lost.Close() // the drops counted and not logged yet
	return s.db.Close()
}

// write drains the queue in batches until it is closed. It sleeps from
// one flush interval to the next instead of waking for every row, so a
// recorded row costs its sender a buffered channel send, not a thread
// wake-up; enqueue wakes it early once a batch's worth is waiting. A row
// still waits at most one interval, as before.
func (s *Store) write(ctx context.Context) {
	batch := make([]any, 0, s.opts.BatchSize)
	tick := time.NewTicker(s.opts.FlushInterval)
	defer tick.Stop()
	flush := func() {
		if len(batch) == 0 {
			return
		}
		// The final flush after Close still gets its own timeout.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.WriteTimeout)
		lost, err := s.writeBatch(wctx, batch)
		cancel()
		if lost > 0 {
			s.dropped(lost, err)
		}
		clear(batch)
		batch = batch[:0]
	}
	for {
		select {
		case <-tick.C:
		case <-s.kick:
		}
		for drained := false; !drained; {
			select {
			case row, ok := <-s.queue:
				if !ok {
					flush()
					return
				}
				if mark, ok := row.(syncMark); ok {
					flush()
					close(mark)
					continue
				}
				batch = append(batch, row)
				if len(batch) >= s.opts.BatchSize {
					flush()
				}
			default:
				drained = true
			}
		}
		flush()
	}
}

// writeBatch writes one batch in one transaction and returns how many of
// its records were lost and why (the caller counts them as dropped). On
// SQLite a failed batch is lost whole. On PostgreSQL a batch the server
// refused for its data (refusedRow) is written again row by row, so one bad
// row costs itself only, never the rows of other runs and callers batched
// with it.
func (s *Store) writeBatch(ctx context.Context, batch []any) (int, error) {
	runs, tunnels := splitBatch(batch)
	if !s.db.postgres {
		if err := s.db.writePrepared(ctx, runs, tunnels); err != nil {
			return len(batch), err
		}
		return 0, nil
	}
	err := s.retry(ctx, func() error { return s.db.writeMultiRow(ctx, runs, tunnels) })
	if err == nil {
		return 0, nil
	}
	if !refusedRow(err) || ctx.Err() != nil {
		return len(batch), err
	}
	return s.db.writeEach(ctx, runs, tunnels)
}

// retry runs f, and on PostgreSQL once more when the connection broke
// under it (connLost) and ctx has time left. database/sql keeps idle
// connections; one the server ended meanwhile (a restart, an idle session
// timeout, a pooler) failed the statement that took it, which cost a whole
// batch of history rows or answered a read with 503 while the database was
// up. Open drops most such connections before use (peerClosed); this
// covers one that breaks between that check and the statement. A batch's
// retry is bounded by its WriteTimeout, a read's by its caller's context.
func (s *Store) retry(ctx context.Context, f func() error) error {
	err := f()
	if err != nil && s.db.postgres && ctx.Err() == nil && connLost(err) {
		err = f()
	}
	return err
}

// refusedRow reports whether PostgreSQL refused a statement for what some
// row holds rather than for being unreachable, busy or unfit for the
// history: a data exception (class 22: bad encoding, a value out of
// range), an integrity violation (23), or a syntax error (42601: bun
// inlines a value it cannot write as an error text, which the server then
// cannot parse). Only then is a row by row retry worth its round trips; in
// an outage, or when the edge's role may not write a table (42501) or a
// table is missing (42P01), every row would fail alike, each in a
// statement of its own.
func refusedRow(err error) bool {
	var pg pgdriver.Error
	if !errors.As(err, &pg) {
		return false
	}
	switch code := pg.Field('C'); {
	case strings.HasPrefix(code, "22"), strings.HasPrefix(code, "23"), code == "42601":
		return true
	}
	return false
}

// writeEach writes each row in a statement of its own (no transaction:
// each commits alone) and returns how many failed and the first error. It
// stops when ctx ends, counting the rows not tried as failed.
func (db *DB) writeEach(ctx context.Context, runs []runRow, tunnels []tunnelRow) (int, error) {
	var lost int
	var first error
	fail := func(err error) {
		lost++
		if first == nil {
			first = err
		}
	}
	for i := range runs {
		if ctx.Err() != nil {
			return lost + len(runs) - i + len(tunnels), errors.Join(first, ctx.Err())
		}
		if err := db.writeMultiRow(ctx, runs[i:i+1], nil); err != nil {
			fail(err)
		}
	}
	for i := range tunnels {
		if ctx.Err() != nil {
			return lost + len(tunnels) - i, errors.Join(first, ctx.Err())
		}
		if err := db.writeMultiRow(ctx, nil, tunnels[i:i+1]); err != nil {
			fail(err)
		}
	}
	return lost, first
}

// splitBatch sorts a batch into runs and tunnels; of several records of one
// run in the batch the last wins, in the place of the first, keeping an
// earlier record's model when it has none (as the write does; see
// runUpdateSet).
func splitBatch(batch []any) ([]runRow, []tunnelRow) {
	var runs []runRow
	var tunnels []tunnelRow
	var at map[string]int // run id → index in runs
	for _, r := range batch {
		switch r := r.(type) {
		case runRow:
			if i, ok := at[r.ID]; ok {
				if r.Model == "" {
					r.Model = runs[i].Model
				}
				runs[i] = r
				continue
			}
			if at == nil {
				at = make(map[string]int, len(batch))
			}
			at[r.ID] = len(runs)
			runs = append(runs, r)
		case tunnelRow:
			tunnels = append(tunnels, r)
		}
	}
	return runs, tunnels
}

// runUpdate is what a later record of a run replaces: its outcome. What
// the run was (node, adapter, target, session, key, background) is fixed
// when it is dispatched, and every later record of it is made from the
// first (application/edge: observe, cancel, run history), so the first
// record's values stay. Not naming them matters: SQLite rewrites the entry
// of every index on a column the SET names, changed or not, and node is
// indexed (edge_runs_node_idx) — one index entry deleted and inserted again
// per finished run for nothing.
var runUpdate = []string{"status", "finished_us", "error_code", "error_message", "model", "prompt_tokens",
	"completion_tokens", "total_tokens", "cost_usd", "has_usage"}

// runUpdateSet is the SET list of the run upsert: runUpdate from the new
// record, except that a record without a model keeps the stored one. A
// run's model is known only to the edge that saw its end (the node's store
// has none), so a later record made from the node's (a repair of a row
// another edge, or this one, finished meanwhile) must not clear it: usage
// by model would count the run under "". table names the stored row in the
// statement (bun's insert aliases it: ?TableAlias).
func runUpdateSet(table string) []string {
	set := make([]string, len(runUpdate))
	for i, c := range runUpdate {
		set[i] = c + " = EXCLUDED." + c
		if c == "model" {
			set[i] = "model = CASE WHEN EXCLUDED.model = '' THEN " + table + ".model ELSE EXCLUDED.model END"
		}
	}
	return set
}

// writeMultiRow writes the batch as one multi-row INSERT per table, built
// by bun: on PostgreSQL one round trip per table matters more than the
// statement's parse on the server.
func (db *DB) writeMultiRow(ctx context.Context, runs []runRow, tunnels []tunnelRow) error {
	return db.bun.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if err := boundStatements(ctx, tx); err != nil {
			return err
		}
		if len(runs) > 0 {
			q := tx.NewInsert().Model(&runs).On("CONFLICT (id) DO UPDATE")
			for _, set := range runUpdateSet("?TableAlias") {
				q = q.Set(set)
			}
			if _, err := q.Exec(ctx); err != nil {
				return fmt.Errorf("write runs: %w", err)
			}
		}
		if len(tunnels) > 0 {
			if _, err := tx.NewInsert().Model(&tunnels).On("CONFLICT (id) DO NOTHING").Exec(ctx); err != nil {
				return fmt.Errorf("write tunnels: %w", err)
			}
		}
		return nil
	})
}

// boundStatements makes the server give up tx's statements when ctx
// does (SET LOCAL statement_timeout: this transaction only, so a pooler
// sharing the connection keeps its settings). pgdriver cannot cancel a
// statement: at the batch's timeout it closes its socket and the server
// goes on. A batch waiting on a lock another session holds (a LOCK TABLE,
// an ALTER, a VACUUM FULL) then left a backend waiting behind it, one
// more per batch while the lock was held, until the server's
// max_connections were taken and it refused every client.
func boundStatements(ctx context.Context, tx bun.Tx) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	ms := time.Until(deadline).Milliseconds()
	if ms < 1 {
		ms = 1 // 0 would turn the bound off
	}
	if _, err := tx.ExecContext(ctx, "SET LOCAL statement_timeout = "+strconv.FormatInt(ms, 10)); err != nil {
		return fmt.Errorf("statement timeout: %w", err)
	}
	return nil
}

// writePrepared writes the batch row by row through two statements
// prepared once for the life of the DB. On SQLite (in process, one
// connection) that is far cheaper than a multi-row statement with the
// values inlined, which SQLite would parse and plan afresh per batch.
func (db *DB) writePrepared(ctx context.Context, runs []runRow, tunnels []tunnelRow) error {
	// Prepared before the transaction takes the only connection.
	runIns, err := db.stmts.Get(ctx, runWriteSQL)
	if err != nil {
		return fmt.Errorf("prepare run write: %w", err)
	}
	tunnelIns, err := db.stmts.Get(ctx, tunnelWriteSQL)
	if err != nil {
		return fmt.Errorf("prepare tunnel write: %w", err)
	}
	tx, err := db.bun.DB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("write history: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	// The rows are written with a context that is never done: with a
	// cancellable one the SQLite driver starts a goroutine per statement to
	// interrupt it on cancel (a spawn and two wake-ups per row). The batch
	// keeps its timeout: database/sql rolls the transaction back when ctx
	// ends, and every later statement of it then fails; one row's insert
	// is microseconds (a lock wait is bounded by busy_timeout).
	rowCtx := context.WithoutCancel(ctx)
	if len(runs) > 0 {
		ins := tx.StmtContext(ctx, runIns)
		for i := range runs {
			if _, err := ins.ExecContext(rowCtx, runs[i].args()...); err != nil {
				return fmt.Errorf("write runs: %w", err)
			}
		}
	}
	if len(tunnels) > 0 {
		ins := tx.StmtContext(ctx, tunnelIns)
		for i := range tunnels {
			if _, err := ins.ExecContext(rowCtx, tunnels[i].args()...); err != nil {
				return fmt.Errorf("write tunnels: %w", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("write history: %w", err)
	}
	return nil
}

// prune deletes rows past the retention now and every PruneInterval, in
// chunks (see Prune) so writers are never held up for long.
func (s *Store) prune(ctx context.Context) {
	if s.opts.Retention < 0 {
		return
	}
	every.Run(ctx, s.opts.PruneInterval, func(ctx context.Context) {
		if n, err := s.Prune(ctx, time.Now().Add(-s.opts.Retention)); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("history prune failed", "rows", n, "err", err)
			}
		} else if n > 0 {
			// The file shrinks by what the prune freed.
			freed, err := s.db.Reclaim(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				s.log.Warn("history pruned; giving the freed pages back failed", "rows", n, "reclaimed_bytes", freed, "err", err)
			case err == nil:
				s.log.Info("history pruned", "rows", n, "reclaimed_bytes", freed)
			}
		}
	})
}

// pruneChunk is the most rows one pruning statement deletes: on SQLite
// (one writer connection) a statement holds every write of the store until
// it ends (reads go on beside it, see openReaders), and 1,000 rows with
// their index entries take milliseconds, where all of a month's expired
// rows in one statement could take longer than a batch's WriteTimeout.
const pruneChunk = 1000

// Prune deletes finished runs created, and tunnels started, before cutoff.
// Runs still in flight are kept. It deletes in chunks of pruneChunk rows,
// each its own statement and transaction, so history writes take turns
// with it however much has expired; it returns the rows deleted
// so far, with the error that stopped it.
func (s *Store) Prune(ctx context.Context, cutoff time.Time) (int64, error) {
	return s.pruneChunks(ctx, cutoff, pruneChunk)
}

// pruneChunks is Prune deleting at most chunk rows per statement, until a
// statement deletes fewer.
func (s *Store) pruneChunks(ctx context.Context, cutoff time.Time, chunk int) (int64, error) {
	us := cutoff.UnixMicro()
	// A chunk is picked by SQLite's rowid (the table's own b-tree key, no
	// index lookup), on PostgreSQL by the primary key.
	key := "id"
	if !s.db.postgres {
		key = "rowid"
	}
	expired := []*bun.SelectQuery{
		s.db.bun.NewSelect().Model((*runRow)(nil)).ColumnExpr(key).Where("created_us < ?", us).Where("finished_us > 0"),
		s.db.bun.NewSelect().Model((*tunnelRow)(nil)).ColumnExpr(key).Where("started_us < ?", us),
	}
	models := []any{(*runRow)(nil), (*tunnelRow)(nil)}
	var total int64
	for i, sel := range expired {
		for {
			// Each statement gets the bound the single statement had.
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			var res sql.Result
			del := func(ctx context.Context, on bun.IDB) (err error) {
				res, err = on.NewDelete().Model(models[i]).Where(key+" IN (?)", sel.Limit(int64(chunk))).Exec(ctx)
				return err
			}
			err := s.retry(sctx, func() error {
				if !s.db.postgres {
					return del(sctx, s.db.bun)
				}
				// The server gives the statement up when the edge does
				// (boundStatements): one waiting on a lock another
				// session holds would leave a backend behind each pass.
				return s.db.bun.RunInTx(sctx, nil, func(ctx context.Context, tx bun.Tx) error {
					if err := boundStatements(ctx, tx); err != nil {
						return err
					}
					return del(ctx, tx)
				})
			})
			cancel()
			if err != nil {
				return total, err
			}
			n, _ := res.RowsAffected()
			total += n
			if n < int64(chunk) {
				break
			}
		}
	}
	return total, nil
}

// GetRun returns one run; domain.ErrRunNotFound if the store has none.
func (s *Store) GetRun(ctx context.Context, id string) (domain.RunRecord, error) {
	ctx, cancel := s.readContext(ctx)
	defer cancel()
	var rows []runRow
	if err := s.retry(ctx, func() error {
		rows = nil
		return s.db.read.NewSelect().Model(&rows).Where("id = ?", id).Limit(int64(1)).Scan(ctx)
	}); err != nil {
		return domain.RunRecord{}, s.readError(ctx, fmt.Errorf("read run: %w", err))
	}
	if len(rows) == 0 {
		return domain.RunRecord{}, domain.Errorf(domain.CodeRunNotFound, "run %s is not in the edge's history", id)
	}
	return rows[0].record(), nil
}

// ResponseOrigin returns the oldest tunnel recorded as creating stored
// response id (ports.ResponseHistory): the first to answer with an id
// created it, as the edge remembers ids in memory. found is false when the
// history holds no such tunnel (an id it cannot keep whole, responseID,
// is never found). Its usage counts as counted (UsageCounted) when that
// tunnel recorded usage, when a later tunnel recorded it as the
// response's (usage_of), or when another edge sharing the PostgreSQL
// history created it: that edge counts it on a retrieval through it, and
// two edges counting it would count it twice. An SQLite file is one
// edge's: its responses are all its own. A response created before the
// schema recorded usage_of (migration 5) counts as counted, as every
// recalled response did before: a retrieval then may have counted it.
func (s *Store) ResponseOrigin(ctx context.Context, id string) (domain.TunnelRecord, bool, error) {
	id = responseID(id)
	if id == "" {
		return domain.TunnelRecord{}, false, nil
	}
	ctx, cancel := s.readContext(ctx)
	defer cancel()
	var rows []tunnelRow
	counted := false
	if err := s.retry(ctx, func() error {
		rows, counted = nil, false
		if err := s.db.responseQuery(&rows, id).Scan(ctx); err != nil || len(rows) == 0 {
			return err
		}
		row := rows[0]
		counted = row.hasUsage() || row.StartedUS < s.db.usageOfSince || (s.Shared() && row.EdgeID != s.EdgeID())
		if counted {
			return nil
		}
		var err error
		counted, err = s.db.usageOfQuery(id).Exists(ctx)
		return err
	}); err != nil {
		return domain.TunnelRecord{}, false, s.readError(ctx, fmt.Errorf("read response: %w", err))
	}
	if len(rows) == 0 {
		return domain.TunnelRecord{}, false, nil
	}
	rec := rows[0].record()
	rec.UsageCounted = counted
	return rec, true, nil
}

// responseQuery is ResponseOrigin's statement: the oldest tunnel of
// response id (as stored), through edge_tunnels_response_idx, read as far
// as its origin and usage (not its path, up to maxText bytes).
func (db *DB) responseQuery(rows *[]tunnelRow, id string) *bun.SelectQuery {
	return db.read.NewSelect().Model(rows).
		Column("id", "edge_id", "node", "provider", "key_name", "response_id", "prompt_tokens", "completion_tokens", "total_tokens", "cost_usd", "started_us").
		Where("response_id = ?", id).OrderExpr("started_us ASC, id ASC").Limit(1)
}

// usageOfQuery selects the tunnels that counted the usage of response id
// (as stored) without creating it, through edge_tunnels_usage_of_idx.
func (db *DB) usageOfQuery(id string) *bun.SelectQuery {
	return db.read.NewSelect().Table("edge_tunnels").Column("id").Where("usage_of = ?", id).Limit(1)
}

// Limits of a listing.
const (
	DefaultLimit = 50
	MaxLimit     = 1000
)

// ListRuns returns runs newest first (by creation, then id), one page.
func (s *Store) ListRuns(ctx context.Context, q domain.RunQuery) (domain.RunPage, error) {
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	var rows []runRow
	sel, err := s.listQuery(q, &rows, limit)
	if err != nil {
		return domain.RunPage{}, err
	}
	ctx, cancel := s.readContext(ctx)
	defer cancel()
	if err := s.retry(ctx, func() error { rows = nil; return sel.Scan(ctx) }); err != nil {
		return domain.RunPage{}, s.readError(ctx, fmt.Errorf("list runs: %w", err))
	}
	page := domain.RunPage{Runs: make([]domain.RunRecord, 0, min(len(rows), limit))}
	for i, r := range rows {
		if i == limit {
			last := rows[limit-1]
			page.Next = encodeCursor(last.CreatedUS, last.ID)
			break
		}
		page.Runs = append(page.Runs, r.record())
	}
	return page, nil
}

// listQuery is the statement of ListRuns' page of limit rows (one more,
// to know there is a next page), scanned into rows.
func (s *Store) listQuery(q domain.RunQuery, rows *[]runRow, limit int) (*bun.SelectQuery, error) {
	sel := s.db.read.NewSelect().Model(rows)
	if q.Node != "" {
		sel = sel.Where("node = ?", q.Node)
	}
	if len(q.Nodes) > 0 {
		sel = sel.Where("node IN (?)", bun.List(q.Nodes))
	}
	if q.Adapter != "" {
		sel = sel.Where("adapter = ?", q.Adapter)
	}
	if q.Status != "" {
		sel = sel.Where("status = ?", string(q.Status))
	}
	if q.Key != "" {
		sel = sel.Where("key_name = ?", q.Key)
	}
	if q.Session != "" {
		// The second term is the predicate of edge_runs_session_idx: it
		// lets SQLite and PostgreSQL use that partial index.
		sel = sel.Where("session_id = ? AND session_id <> ''", q.Session)
	}
	if q.Took {
		sel = sel.Where("(status <> ? OR error_code NOT IN (?))", string(domain.RunFailed), bun.List(domain.RefusedBeforeStartCodes()))
	}
	if len(q.ExcludeKeys) > 0 {
		sel = sel.Where("key_name NOT IN (?)", bun.List(q.ExcludeKeys))
	}
	if q.Own && s.db.postgres {
		// As toRunRow wrote it. An SQLite file is one edge's: its rows
		// are all its own, also those written under an earlier host name.
		sel = sel.Where("edge_id = ?", s.EdgeID())
	}
	if !q.Since.IsZero() {
		sel = sel.Where("created_us >= ?", ceilMicros(q.Since))
	}
	if !q.Until.IsZero() {
		sel = sel.Where("created_us < ?", ceilMicros(q.Until))
	}
	if q.Cursor != "" {
		us, id, err := decodeCursor(q.Cursor)
		if err != nil {
			return nil, err
		}
		sel = sel.WhereGroup(" AND ", func(w *bun.SelectQuery) *bun.SelectQuery {
			return w.Where("created_us < ?", us).WhereOr("created_us = ? AND id < ?", us, id)
		})
	}
	return sel.OrderExpr("created_us DESC, id DESC").Limit(int64(limit + 1)), nil
}

func encodeCursor(us int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(us, 10) + "|" + id))
}

func decodeCursor(c string) (int64, string, error) {
	bad := domain.Errorf(domain.CodeInvalidRequest, "cursor %q is not one this edge returned", c)
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, "", bad
	}
	ts, id, ok := strings.Cut(string(b), "|")
	if !ok {
		return 0, "", bad
	}
	us, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || domain.CheckID("cursor", id) != nil {
		// A run id this edge made has no control byte: one would reach
		// the query and fail it as if the database were down.
		return 0, "", bad
	}
	return us, id, nil
}

type usageRow struct {
	Group            string  `bun:"grp"`
	N                int64   `bun:"n"`
	Errors           int64   `bun:"errors"`
	PromptTokens     int64   `bun:"prompt_tokens"`
	CompletionTokens int64   `bun:"completion_tokens"`
	TotalTokens      int64   `bun:"total_tokens"`
	CostUSD          float64 `bun:"cost_usd"`
	BodyBytes        int64   `bun:"body_bytes"`
}

const dayMicros = int64(24 * time.Hour / time.Microsecond)

// Usage sums runs and tunnels in [Since, Until) by q.GroupBy. Errors are
// failed runs and tunnels that ended with an error. Day groups are UTC
// dates (YYYY-MM-DD).
func (s *Store) Usage(ctx context.Context, q domain.UsageQuery) ([]domain.UsageTotal, error) {
	var runGroup, tunGroup string
	switch q.GroupBy {
	case domain.GroupByKey:
		runGroup, tunGroup = "key_name", "key_name"
	case domain.GroupByNode:
		runGroup, tunGroup = "node", "node"
	case domain.GroupByModel:
		runGroup, tunGroup = "model", "model"
	case domain.GroupByDay:
		runGroup, tunGroup = fmt.Sprintf("created_us / %d", dayMicros), fmt.Sprintf("started_us / %d", dayMicros)
	default:
		return nil, domain.Errorf(domain.CodeInvalidRequest, "group_by must be key, node, model or day, not %q", q.GroupBy)
	}
	var runRows, tunRows []usageRow
	// Each row's numbers within the bounds the store writes (storedUsage):
	// a row written before it clamped them may hold anything.
	usage := func(q *bun.SelectQuery) *bun.SelectQuery {
		for _, col := range []string{"prompt_tokens", "completion_tokens", "total_tokens"} {
			q = q.ColumnExpr("SUM(" + usagesql.Tokens(col, s.db.postgres) + ") AS " + col)
		}
		return q.ColumnExpr("SUM(" + usagesql.Cost("cost_usd", s.db.postgres) + ") AS cost_usd")
	}
	rq := usage(s.db.read.NewSelect().Model((*runRow)(nil)).
		ColumnExpr("CAST("+runGroup+" AS VARCHAR(255)) AS grp").
		ColumnExpr("COUNT(*) AS n").
		ColumnExpr("SUM(CASE WHEN status = ? THEN 1 ELSE 0 END) AS errors", string(domain.RunFailed))).
		ColumnExpr("0 AS body_bytes").
		GroupExpr(runGroup)
	tq := usage(s.db.read.NewSelect().Model((*tunnelRow)(nil)).
		ColumnExpr("CAST(" + tunGroup + " AS VARCHAR(255)) AS grp").
		ColumnExpr("COUNT(*) AS n").
		ColumnExpr("SUM(CASE WHEN error_code <> '' THEN 1 ELSE 0 END) AS errors")).
		ColumnExpr("SUM(body_bytes) AS body_bytes").
		GroupExpr(tunGroup)
	if !q.Since.IsZero() {
		rq = rq.Where("created_us >= ?", ceilMicros(q.Since))
		tq = tq.Where("started_us >= ?", ceilMicros(q.Since))
	}
	if !q.Until.IsZero() {
		rq = rq.Where("created_us < ?", ceilMicros(q.Until))
		tq = tq.Where("started_us < ?", ceilMicros(q.Until))
	}
	if len(q.Nodes) > 0 {
		rq = rq.Where("node IN (?)", bun.List(q.Nodes))
		tq = tq.Where("node IN (?)", bun.List(q.Nodes))
	}
	ctx, cancel := s.readContext(ctx)
	defer cancel()
	if err := s.retry(ctx, func() error { runRows = nil; return rq.Scan(ctx, &runRows) }); err != nil {
		return nil, s.readError(ctx, usageError("sum runs", err))
	}
	if err := s.retry(ctx, func() error { tunRows = nil; return tq.Scan(ctx, &tunRows) }); err != nil {
		return nil, s.readError(ctx, usageError("sum tunnels", err))
	}
	return addTotals(q.GroupBy, runRows, tunRows)
}

// addTotals is the usage of each group: its runs' sums and its tunnels'
// added. Each sum fits (the database checks it); the two of a group added
// here may not (each near the int64 bound, which clamped rows reach only
// in their millions), and a total that would wrap is refused as a sum
// the database refused is.
func addTotals(groupBy string, runRows, tunRows []usageRow) ([]domain.UsageTotal, error) {
	groups := map[string]*domain.UsageTotal{}
	var order []string
	overflowed := false
	plus := func(a *int64, b int64) {
		if (b > 0 && *a > math.MaxInt64-b) || (b < 0 && *a < math.MinInt64-b) {
			overflowed = true
			return
		}
		*a += b
	}
	add := func(r usageRow, tunnel bool) {
		name := r.Group
		if groupBy == domain.GroupByDay {
			if d, err := strconv.ParseInt(name, 10, 64); err == nil {
				name = time.UnixMicro(d * dayMicros).UTC().Format(time.DateOnly)
			}
		}
		g := groups[name]
		if g == nil {
			g = &domain.UsageTotal{Group: name}
			groups[name] = g
			order = append(order, name)
		}
		if tunnel {
			plus(&g.Tunnels, r.N)
		} else {
			plus(&g.Runs, r.N)
		}
		plus(&g.Requests, r.N)
		plus(&g.Errors, r.Errors)
		plus(&g.PromptTokens, r.PromptTokens)
		plus(&g.CompletionTokens, r.CompletionTokens)
		plus(&g.TotalTokens, r.TotalTokens)
		g.CostUSD += r.CostUSD
		plus(&g.BodyBytes, r.BodyBytes)
	}
	for _, r := range runRows {
		add(r, false)
	}
	for _, r := range tunRows {
		add(r, true)
	}
	if overflowed {
		return nil, errUsageTooLarge()
	}
	out := make([]domain.UsageTotal, 0, len(order))
	for _, name := range order {
		g := *groups[name]
		// Databases sum floats their own way (SQLite compensates for
		// rounding, PostgreSQL adds in whatever order it reads): rounded
		// to a nanodollar, both answer alike.
		g.CostUSD = math.Round(g.CostUSD*1e9) / 1e9
		out = append(out, g)
	}
	sortTotals(out)
	return out, nil
}

// usageError is the error of a usage sum: one too large to add up is the
// caller's to narrow (it was answered as the database being unreachable).
func usageError(what string, err error) error {
	if sumOverflowed(err) {
		return errUsageTooLarge()
	}
	return fmt.Errorf("%s: %w", what, err)
}

func errUsageTooLarge() error {
	return domain.Errorf(domain.CodeInvalidRequest,
		"the usage totals of this range are too large to add up (some runs or tunnels report implausible token counts); narrow since and until")
}

// DefaultReadTimeout is Options.ReadTimeout's default, which the
// statement_timeout of PostgreSQL's read connections follows (see Open).
const DefaultReadTimeout = 30 * time.Second

// errReadTimeout is the cause of a read's context that ran out of the
// read timeout.
var errReadTimeout = errors.New("history read timeout")

// readTimeout is the bound of one history read: Options.ReadTimeout, or
// its default when unset.
func (s *Store) readTimeout() time.Duration {
	if s.opts.ReadTimeout > 0 {
		return s.opts.ReadTimeout
	}
	return DefaultReadTimeout
}

// readContext is ctx bounded by the read timeout, once the rows recorded
// before the read are written (settle).
func (s *Store) readContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.readTimeout(), errReadTimeout)
	s.settle(ctx)
	return ctx, cancel
}

// readError is err, the error of a history read under ctx (from
// readContext). A read that ran out of the read timeout, not of its
// caller's time, is a timeout the caller is told about (504 timeout, not
// 503 history_unavailable: the database is there, the read is too large).
func (s *Store) readError(ctx context.Context, err error) error {
	if domain.CodeOf(err) == domain.CodeInternal && errors.Is(context.Cause(ctx), errReadTimeout) {
		return domain.Errorf(domain.CodeTimeout,
			"reading the edge's history took longer than %s and was given up; narrow the query (since and until, filters)", s.readTimeout())
	}
	return err
}

// sumOverflowed reports whether err says a sum went past what its type
// holds: SQLite's "integer overflow", PostgreSQL's numeric_value_out_of_range
// (22003), or a PostgreSQL sum of BIGINTs (a NUMERIC) past int64 when it
// is read.
func sumOverflowed(err error) bool {
	var pg pgdriver.Error
	if errors.As(err, &pg) {
		return pg.Field('C') == "22003"
	}
	return errors.Is(err, strconv.ErrRange) || strings.Contains(err.Error(), "integer overflow")
}

func sortTotals(t []domain.UsageTotal) {
	sort.Slice(t, func(i, j int) bool { return t[i].Group < t[j].Group })
}

// ceilMicros is t in whole microseconds, the history's resolution, rounded
// up: a bound between two microseconds, compared with the stored times,
// then keeps the half-open range [since, until) it names.
func ceilMicros(t time.Time) int64 {
	us := t.UnixMicro()
	if time.UnixMicro(us).Before(t) {
		us++
	}
	return us
}
