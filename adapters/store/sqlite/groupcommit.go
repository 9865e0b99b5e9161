package sqlite

import (
	"context"
	"database/sql"
	"sync"
)

// maxGroup is the most writes one transaction of groupCommit carries; the
// rest wait for the next, so a transaction (which holds the store's only
// connection) stays short.
const maxGroup = 64

// groupCommit writes the run store's one-statement writes (a run's insert,
// its guarded finish) of concurrent callers in one transaction. A caller
// still returns only once its own write is committed, or failed, with the
// same result it would have had alone; what the callers share is the
// commit (the WAL append of the pages the writes touched, its locks and
// system calls), which was most of a run's store cost under concurrent
// runs. A caller alone writes in autocommit, as without it.
//
// It has no goroutine of its own: the first caller to find no transaction
// under way leads, writing the queued writes (its own first). When they are
// committed it hands the lead to the oldest write still queued, so no
// caller waits for more than the transaction before its own and its own.
// The queue holds one entry per blocked caller, so it is bounded by the
// runs in flight.
type groupCommit struct {
	mu     sync.Mutex
	queue  []*groupWrite
	active bool // a leader is writing
}

// groupWrite is one caller's statement and, once written, its result.
type groupWrite struct {
	ctx   context.Context
	query string
	args  []any
	// guarded: a statement that matched no row is not an error; matched
	// tells whether it did (RowsAffected is 1).
	guarded bool

	matched bool
	err     error
	// wake gets one value: false once the write is done, true when its
	// caller is to lead the next transaction.
	wake chan bool
}

// write runs w's statement, grouped with other callers' writes; w's
// result fields are set when it returns.
func (g *groupCommit) write(db *DB, w *groupWrite) {
	if w.err = w.ctx.Err(); w.err != nil {
		return
	}
	w.wake = make(chan bool, 1)
	g.mu.Lock()
	g.queue = append(g.queue, w)
	if g.active {
		g.mu.Unlock()
		if lead := <-w.wake; !lead {
			return
		}
		g.mu.Lock()
	}
	g.active = true
	n := min(len(g.queue), maxGroup)
	batch := g.queue[:n:n]
	g.queue = g.queue[n:]
	if len(g.queue) == 0 {
		g.queue = nil // the backing array goes with the batch
	}
	g.mu.Unlock()

	db.writeGroup(w.ctx, batch)
	for _, o := range batch[1:] { // batch[0] is w
		o.wake <- false
	}

	g.mu.Lock()
	if len(g.queue) == 0 {
		g.active = false
		g.mu.Unlock()
		return
	}
	next := g.queue[0]
	g.mu.Unlock()
	next.wake <- true
}

// writeGroup writes batch in one transaction. When any statement fails,
// the transaction is rolled back and each write is done again on its own,
// so each caller gets its own error, as without grouping (a failed
// statement can have ended SQLite's transaction, after which the rest
// would not be in it).
func (db *DB) writeGroup(ctx context.Context, batch []*groupWrite) {
	ctx = context.WithoutCancel(ctx)
	stmts := make([]*sql.Stmt, len(batch))
	for i, w := range batch {
		// Prepared before a transaction takes the only connection.
		stmts[i], w.err = db.stmts.Get(ctx, w.query)
	}
	if len(batch) > 1 && db.writeInTx(ctx, batch, stmts) {
		return
	}
	for i, w := range batch {
		if w.err == nil {
			w.exec(ctx, stmts[i])
		}
	}
}

// writeInTx writes batch in one transaction and reports whether every
// write and the commit succeeded; if not, nothing was written.
func (db *DB) writeInTx(ctx context.Context, batch []*groupWrite, stmts []*sql.Stmt) bool {
	for _, w := range batch {
		if w.err != nil {
			return false
		}
	}
	tx, err := db.stmts.DB.BeginTx(ctx, nil)
	if err != nil {
		return false
	}
	for i, w := range batch {
		if w.exec(ctx, tx.StmtContext(ctx, stmts[i])); w.err != nil {
			_ = tx.Rollback()
			w.err = nil
			return false
		}
	}
	if err := tx.Commit(); err != nil {
		return false
	}
	return true
}

// exec runs w's statement as st and sets its result.
func (w *groupWrite) exec(ctx context.Context, st *sql.Stmt) {
	res, err := st.ExecContext(ctx, w.args...)
	if err != nil {
		w.err = err
		return
	}
	if w.guarded {
		n, err := res.RowsAffected()
		w.matched = err == nil && n == 1
	}
}
