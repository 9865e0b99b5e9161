package sqlite

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/uptrace/bun"
)

// Backdate sets column (a time) of table's rows of the session to t, as if
// they were written then.
func (db *DB) Backdate(ctx context.Context, table, column, adapter, sessionID string, t time.Time) error {
	_, err := db.bun.ExecContext(ctx, "UPDATE "+table+" SET "+column+" = ? WHERE adapter = ? AND session_id = ?",
		db.timeArg(t), adapter, sessionID)
	return err
}

// PruneChunks is Prune with at most chunk rows per statement.
func (db *DB) PruneChunks(ctx context.Context, cutoff time.Time, chunk int) (PruneResult, error) {
	return db.pruneChunks(ctx, cutoff, chunk)
}

// CountDeletes makes db count the DELETE statements it runs from now on.
func (db *DB) CountDeletes() *atomic.Int64 {
	h := &deleteCounter{}
	db.bun = db.bun.WithQueryHook(h)
	return &h.n
}

type deleteCounter struct{ n atomic.Int64 }

func (c *deleteCounter) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context {
	return ctx
}

func (c *deleteCounter) AfterQuery(_ context.Context, e *bun.QueryEvent) {
	if strings.HasPrefix(e.Query, "DELETE") {
		c.n.Add(1)
	}
}

// BeforeNth makes db call fn once, right before the nth statement it runs
// from now on whose text starts with prefix (before the statement takes
// the connection, so fn may use the stores).
func (db *DB) BeforeNth(prefix string, n int64, fn func()) {
	db.bun = db.bun.WithQueryHook(&beforeNth{prefix: prefix, n: n, fn: fn})
}

type beforeNth struct {
	prefix string
	n      int64
	fn     func()
	seen   atomic.Int64
}

func (h *beforeNth) BeforeQuery(ctx context.Context, e *bun.QueryEvent) context.Context {
	if strings.HasPrefix(e.Query, h.prefix) && h.seen.Add(1) == h.n {
		h.fn()
	}
	return ctx
}

func (h *beforeNth) AfterQuery(context.Context, *bun.QueryEvent) {}
