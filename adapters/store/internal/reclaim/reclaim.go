// Package reclaim gives the pages a prune freed in an SQLite file back to
// the file system, so a store's file shrinks after its retention deletes
// rows instead of keeping the largest size it ever reached.
//
// It relies on incremental auto-vacuum, which SQLite records in a file's
// header when the file is created: a store sets Pragma on every connection
// (a no-op on a file that already has tables), and Free does nothing on a
// file made without it. Such a file switches over with one VACUUM, which
// rewrites the whole file and so is left to the operator (offline).
package reclaim

import (
	"context"
	"database/sql"
	"fmt"
)

// Pragma makes a file created by this connection vacuum incrementally. It
// must run before the file's first table is created.
const Pragma = "PRAGMA auto_vacuum = INCREMENTAL"

// step is the most pages one statement frees. Like a prune's chunk, it
// keeps each statement short (a few milliseconds: the pages moved are
// written to the WAL), so writers take turns with a large reclaim.
const step = 1024

// incremental is auto_vacuum's value for INCREMENTAL.
const incremental = 2

// Free returns db's free pages to the file system, step pages per
// statement, and checkpoints the WAL so the file is cut to its new size.
// It returns the bytes given back. A file made without incremental
// auto-vacuum gives nothing back (0, nil). db must be an SQLite database;
// with one connection in its pool Free's statements queue with the others.
func Free(ctx context.Context, db *sql.DB) (int64, error) {
	var mode, pageSize int64
	if err := db.QueryRowContext(ctx, "PRAGMA auto_vacuum").Scan(&mode); err != nil {
		return 0, fmt.Errorf("auto_vacuum: %w", err)
	}
	if mode != incremental {
		return 0, nil
	}
	if err := db.QueryRowContext(ctx, "PRAGMA page_size").Scan(&pageSize); err != nil {
		return 0, fmt.Errorf("page_size: %w", err)
	}
	var freed int64
	for {
		before, err := freePages(ctx, db)
		if err != nil {
			return freed * pageSize, err
		}
		if before == 0 {
			break
		}
		// incremental_vacuum frees one page per step of its statement: run
		// as a query and read to its end, not as an Exec, which steps once.
		rows, err := db.QueryContext(ctx, fmt.Sprintf("PRAGMA incremental_vacuum(%d)", step))
		if err != nil {
			return freed * pageSize, fmt.Errorf("incremental_vacuum: %w", err)
		}
		for rows.Next() {
		}
		err = rows.Err()
		_ = rows.Close()
		if err != nil {
			return freed * pageSize, fmt.Errorf("incremental_vacuum: %w", err)
		}
		after, err := freePages(ctx, db)
		if err != nil {
			return freed * pageSize, err
		}
		if after >= before {
			break // nothing moved: leave the rest for the next pass
		}
		freed += before - after
	}
	if freed == 0 {
		return 0, nil
	}
	return freed * pageSize, checkpoint(ctx, db)
}

func freePages(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	if err := db.QueryRowContext(ctx, "PRAGMA freelist_count").Scan(&n); err != nil {
		return 0, fmt.Errorf("freelist_count: %w", err)
	}
	return n, nil
}

// checkpoint copies the WAL into the file, which cuts the file to the
// database's size, and empties the WAL. A reader (another connection of
// the process, the sqlite3 shell) can keep it from finishing; the next
// automatic checkpoint does it. It does not wait for such a reader: a
// truncating checkpoint waits for every reader by the busy handler, and
// on the one connection a store writes on it held every write behind it
// for the whole busy_timeout.
func checkpoint(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("wal_checkpoint: %w", err)
	}
	defer func() { _ = conn.Close() }()
	var busy int64
	if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil {
		return fmt.Errorf("busy_timeout: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = 0"); err != nil {
		return fmt.Errorf("busy_timeout: %w", err)
	}
	rows, err := conn.QueryContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		_ = rows.Close()
	}
	// The connection's own setting back, whatever the checkpoint did.
	if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), fmt.Sprintf("PRAGMA busy_timeout = %d", busy)); rerr != nil {
		return fmt.Errorf("busy_timeout: %w", rerr)
	}
	if err != nil {
		return fmt.Errorf("wal_checkpoint: %w", err)
	}
	return nil
}
