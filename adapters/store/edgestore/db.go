// Package edgestore is the edge's durable history of runs and tunnels
// (ports.RunHistory, ports.HistoryReader) with bun on SQLite or PostgreSQL.
// The row types, migrations and queries are shared; only the opener
// differs. Times are stored as Unix microseconds (BIGINT) so ordering,
// cursors and day buckets are plain integer arithmetic on both.
package edgestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/driver/pgdriver"
	"github.com/uptrace/bun/driver/sqliteshim"

	"iop/adapters/store/internal/dbfile"
	"iop/adapters/store/internal/reclaim"
	"iop/adapters/store/internal/sqlprep"
)

// DB is an open, migrated edge store.
type DB struct {
	// bun writes: the history batches, migrations, pruning. On SQLite it is
	// the one connection SQLite's one writer needs.
	bun *bun.DB
	// read answers the history reads from a pool of its own (see
	// openReaders), so no read, however long, holds up a batch write,
	// which has WriteTimeout to commit before its rows are dropped. It is
	// bun itself only for an SQLite database readers cannot share (in
	// memory, or one whose journal is not WAL).
	read     *bun.DB
	postgres bool

	stmts    sqlprep.Cache // the history writes, prepared once (SQLite only)
	narrowed []string      // files Open made private, for the caller to log
	readOnly bool          // an SQLite file opened read-only (mode=ro)

	// usageOfSince is when migration 5 (usage_of) was applied, in µs:
	// before it no tunnel recorded the stored response whose usage it
	// counted, so a response created earlier is taken as counted, as
	// every recalled response was then (ResponseOrigin). MaxInt64 when the
	// schema has no usage_of (a read-only file of an older release).
	usageOfSince int64
}

// Column lists of the prepared writes, in the order of runRow.args and
// tunnelRow.args (a test holds them to the row types' bun fields).
var (
	runColumns = []string{"id", "edge_id", "node", "adapter", "target", "session_id", "key_name", "background",
		"status", "created_us", "finished_us", "error_code", "error_message", "model", "prompt_tokens",
		"completion_tokens", "total_tokens", "cost_usd", "has_usage"}
	tunnelColumns = []string{"id", "edge_id", "node", "provider", "model", "path", "key_name", "status",
		"error_code", "body_bytes", "prompt_tokens", "completion_tokens", "total_tokens", "cost_usd",
		"started_us", "finished_us", "response_id", "usage_of"}
	runWriteSQL    = insertSQL("edge_runs", runColumns, "DO UPDATE SET "+strings.Join(runUpdateSet("edge_runs"), ", "))
	tunnelWriteSQL = insertSQL("edge_tunnels", tunnelColumns, "DO NOTHING")
)

func insertSQL(table string, cols []string, conflict string) string {
	return "INSERT INTO " + table + " (" + strings.Join(cols, ", ") + ") VALUES (" +
		strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ") ON CONFLICT (id) " + conflict
}

// IsPostgres reports whether dsn selects PostgreSQL (postgres:// or
// postgresql://); anything else is an SQLite file or DSN.
func IsPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// Open opens dsn and applies any migrations it lacks. A plain path is an
// SQLite file (created if missing). An SQLite database's files are the
// owner's alone (0600): a new one is created so, an existing one narrowed
// (see Narrowed).
func Open(ctx context.Context, dsn string) (*DB, error) {
	if dsn == "" {
		return nil, errors.New("open edge store: empty dsn")
	}
	var db *DB
	if IsPostgres(dsn) {
		conn, err := newPGConnector(dsn)
		if err != nil {
			return nil, err
		}
		// Two pools: the writes' (the writer's batch, and the pruner's
		// chunk beside it) and the reads'. In one pool a few slow reads (a
		// usage sum over a month) held every connection while the writer's
		// batch waited for one, and lost its rows when that took its
		// WriteTimeout. The reads' connections have no read timeout of
		// their own: a read's answer comes only once the database has
		// summed it, and the store's ReadTimeout (30 s) bounds it instead
		// of the DSN's read_timeout (5 s by default), which cut it off as a
		// database that is down.
		// The server gives a read up a second after the store does (see
		// withStatementTimeout): the store's bound ends it first, and the
		// caller is told 504 timeout, not that the database is down.
		rconn, err := newPGConnector(dsn, pgdriver.WithReadTimeout(0), withStatementTimeout(DefaultReadTimeout+time.Second))
		if err != nil {
			return nil, err
		}
		pool := func(conn driver.Connector, n int) *sql.DB {
			p := sql.OpenDB(conn)
			p.SetMaxOpenConns(n)
			// An idle connection is closed after a minute: one a firewall or
			// NAT forgot without a word (no FIN to see, see peerClosed) would
			// otherwise hold its next statement until the read timeout.
			p.SetConnMaxIdleTime(time.Minute)
			return p
		}
		sqldb := pool(conn, pgWriteConns)
		db = &DB{bun: bun.NewDB(sqldb, pgdialect.New()), postgres: true, stmts: sqlprep.Cache{DB: sqldb}}
		db.read = bun.NewDB(pool(rconn, readConns), pgdialect.New())
	} else {
		// The history names nodes, targets, callers' keys and errors: it
		// is the owner's alone, like the node's store.
		_, narrowed, err := dbfile.Private(sqliteDSN(dsn))
		if err != nil {
			return nil, fmt.Errorf("open edge store: %w", err)
		}
		sqlprep.HoldAllocatorPages()
		sqldb, err := sql.Open(sqliteshim.ShimName, sqliteDSN(dsn))
		if err != nil {
			return nil, fmt.Errorf("open edge store: %w", err)
		}
		// One connection, never recycled: SQLite has one writer, and
		// queueing in database/sql beats SQLITE_BUSY (see the node store);
		// the pragmas below then hold for the life of the DB. A checkpoint
		// every 4,000 WAL pages (8 MiB of this store's pages; SQLite's
		// default is 1,000): history inserts land all over the id index, and
		// a page written by many commits is copied back once per checkpoint
		// (≈ 0.88× the writer's CPU per row in BenchmarkWriteBatch).
		//
		// Pages of 2 KiB instead of SQLite's 4 KiB (a new file only; an
		// existing one keeps its size): each B-tree split takes a scratch
		// buffer of 10 bytes per cell of three sibling pages plus a page.
		// Interior pages hold hundreds of small cells, so on 4 KiB pages it
		// passes 16 KiB, the largest slot of the C heap (see
		// sqlprep.HoldAllocatorPages), and each such split cost an mmap, page faults
		// and an munmap. On 2 KiB pages it stays near 8 KiB, a reused slot. History
		// rows are small (a few hundred bytes) and fit such pages well: in a
		// steady stream of 64-row batches a row costs ≈ 0.65× the CPU
		// (tunnel rows) and ≈ 0.5× (finished runs).
		//
		// The reads have a pool of their own (see openReaders): WAL lets
		// them run beside the one writer.
		sqldb.SetMaxOpenConns(1)
		sqldb.SetConnMaxLifetime(0)
		sqldb.SetConnMaxIdleTime(0)
		db = &DB{bun: bun.NewDB(sqldb, sqlitedialect.New()), stmts: sqlprep.Cache{DB: sqldb}, narrowed: narrowed,
			readOnly: dbfile.ReadOnly(dsn)}
		// page_size and reclaim.Pragma take effect only on a new file, before
		// anything is written to it; the latter lets the store give the
		// pages a prune frees back to the file system (Reclaim). It writes,
		// so a read-only DSN goes without. busy_timeout comes first: the
		// others read the file, which a previous edge still stopping may
		// hold locked for a moment (its last connection checkpoints the
		// WAL under an exclusive lock), and the start must wait for that
		// rather than fail with "database is locked".
		pragmas := []string{"PRAGMA busy_timeout = 5000", fmt.Sprintf("PRAGMA page_size = %d", sqlprep.ScratchPageSize)}
		if !dbfile.ReadOnly(dsn) {
			pragmas = append(pragmas, reclaim.Pragma)
		}
		pragmas = append(pragmas, "PRAGMA journal_mode = WAL", "PRAGMA synchronous = NORMAL",
			"PRAGMA wal_autocheckpoint = 4000")
		for _, p := range pragmas {
			if _, err := sqldb.ExecContext(ctx, p); err != nil {
				_ = sqldb.Close()
				return nil, fmt.Errorf("open edge store %s: %s: %w", dsn, p, err)
			}
		}
	}
	on := db.bun
	if db.postgres {
		// The migrations on a connection of the reads' pool, which has no
		// read timeout (the migration's minute bounds them): an index
		// built over a large history is one statement whose answer comes
		// only at its end, which the DSN's read_timeout (5 s by default)
		// would cut off, and the edge could then never start on that
		// database. The pool's statement_timeout (a read's) does not cut
		// it either: migrate sets the transaction's own, its minute's
		// (boundStatements' SET LOCAL).
		on = db.read
	}
	if err := db.migrate(ctx, on); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open edge store: %w", err)
	}
	if db.postgres {
		if err := checkPrivileges(ctx, on); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("open edge store: %w", err)
		}
	}
	if err := on.QueryRowContext(ctx, "SELECT applied_us FROM edge_schema_migrations WHERE version = 5").Scan(&db.usageOfSince); errors.Is(err, sql.ErrNoRows) {
		db.usageOfSince = math.MaxInt64
	} else if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open edge store: read the schema's migrations: %w", err)
	}
	if db.read == nil {
		if err := db.openReaders(ctx, dsn); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("open edge store %s: %w", dsn, err)
		}
	}
	return db, nil
}

// Connections of the pools: PostgreSQL's writes take one for the writer's
// batch and one for the pruner's chunk; the reads have readConns, on
// SQLite too.
const (
	pgWriteConns = 2
	readConns    = 4
)

// openReaders opens the SQLite history's read pool: readConns read-only
// connections to the file the writer has open. In WAL mode (which Open
// sets) a reader reads the last commit before it began while the one
// writer goes on, and the writer never waits for a reader; a checkpoint
// copies back only what no reader still needs (see reclaim's checkpoint,
// which does not wait for them either). With the writer's one connection
// for both, a usage sum over a large history (seconds) held every batch
// behind it, and a batch that waited WriteTimeout was dropped. The readers
// are opened after the migrations, so the file exists with its schema and
// with the page size and auto-vacuum the writer gave it; read-only, they
// cannot change either. Without WAL (the file's journal mode could not be
// changed: a read-only DSN of a file in another mode) a reader would block
// the writer's commit, and in memory a second pool would open another
// database: the reads then share the writer's connection, as before.
func (db *DB) openReaders(ctx context.Context, dsn string) error {
	db.read = db.bun
	var mode string
	if err := db.bun.DB.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("PRAGMA journal_mode: %w", err)
	}
	rdsn := readerDSN(sqliteDSN(dsn))
	if !strings.EqualFold(mode, "wal") || rdsn == "" {
		return nil
	}
	sqldb, err := sql.Open(sqliteshim.ShimName, rdsn)
	if err != nil {
		return err
	}
	sqldb.SetMaxOpenConns(readConns)
	sqldb.SetMaxIdleConns(readConns)
	sqldb.SetConnMaxLifetime(0)
	sqldb.SetConnMaxIdleTime(0)
	if err := sqldb.PingContext(ctx); err != nil {
		_ = sqldb.Close()
		return fmt.Errorf("open the history's readers: %w", err)
	}
	db.read = bun.NewDB(sqldb, sqlitedialect.New())
	return nil
}

// readerDSN is the file URI dsn (as sqliteDSN makes it) opened read-only,
// with a page cache of its own (a shared cache would lock tables between
// the readers and the writer) and each connection waiting out a lock as
// the writer does (busy_timeout: a reader may meet one while the last
// connection of an edge stopping checkpoints, or a truncating checkpoint
// resets the WAL). The DSN's own pragmas are left out: they are the
// writer's to run. "" for an in-memory database, or a DSN it cannot read.
func readerDSN(dsn string) string {
	rest, ok := strings.CutPrefix(dsn, "file:")
	if !ok || dbfile.Path(dsn) == "" {
		return ""
	}
	path, query, _ := strings.Cut(rest, "?")
	query, _, _ = strings.Cut(query, "#")
	v, err := url.ParseQuery(query)
	if err != nil {
		return ""
	}
	v.Del("_pragma")
	v.Set("mode", "ro")
	v.Set("cache", "private")
	v.Add("_pragma", "busy_timeout(5000)")
	return "file:" + path + "?" + v.Encode()
}

// sqliteDSN turns a plain path into a file DSN that creates the file.
func sqliteDSN(dsn string) string {
	if strings.HasPrefix(dsn, "file:") || strings.Contains(dsn, ":memory:") {
		return dsn
	}
	return "file:" + dsn + "?mode=rwc"
}

// Narrowed lists the files of an existing SQLite database that group or
// others could read and Open made the owner's alone.
func (db *DB) Narrowed() []string { return db.narrowed }

// Close closes the database: the readers first, so that on SQLite the
// writer's connection is the file's last and checkpoints the WAL away.
func (db *DB) Close() error {
	var rerr error
	if db.read != nil && db.read != db.bun {
		rerr = db.read.Close()
	}
	db.stmts.Close()
	return errors.Join(db.bun.Close(), rerr)
}

// migrationLock is the PostgreSQL advisory lock key that serialises
// migrations of edges sharing one database ("iopmigr" in ASCII).
const migrationLock = 0x696f706d69677

// migrations are applied in order, each once, in one transaction with the
// version recorded. Append only: never edit a released migration.
var migrations = []struct {
	version int
	stmts   []string
}{
	{1, []string{
		`CREATE TABLE edge_runs (
			id VARCHAR(64) PRIMARY KEY,
			edge_id VARCHAR(255) NOT NULL,
			node VARCHAR(255) NOT NULL,
			adapter VARCHAR(255) NOT NULL,
			target TEXT NOT NULL,
			session_id TEXT NOT NULL,
			key_name VARCHAR(255) NOT NULL,
			background BOOLEAN NOT NULL,
			status VARCHAR(16) NOT NULL,
			created_us BIGINT NOT NULL,
			finished_us BIGINT NOT NULL,
			error_code VARCHAR(64) NOT NULL,
			error_message TEXT NOT NULL,
			model VARCHAR(255) NOT NULL,
			prompt_tokens BIGINT NOT NULL,
			completion_tokens BIGINT NOT NULL,
			total_tokens BIGINT NOT NULL,
			cost_usd DOUBLE PRECISION NOT NULL,
			has_usage BOOLEAN NOT NULL
		)`,
		`CREATE INDEX edge_runs_created_idx ON edge_runs (created_us, id)`,
		`CREATE INDEX edge_runs_node_idx ON edge_runs (node, created_us)`,
		`CREATE TABLE edge_tunnels (
			id VARCHAR(64) PRIMARY KEY,
			edge_id VARCHAR(255) NOT NULL,
			node VARCHAR(255) NOT NULL,
			provider VARCHAR(255) NOT NULL,
			model VARCHAR(255) NOT NULL,
			path TEXT NOT NULL,
			key_name VARCHAR(255) NOT NULL,
			status INTEGER NOT NULL,
			error_code VARCHAR(64) NOT NULL,
			body_bytes BIGINT NOT NULL,
			prompt_tokens BIGINT NOT NULL,
			completion_tokens BIGINT NOT NULL,
			total_tokens BIGINT NOT NULL,
			cost_usd DOUBLE PRECISION NOT NULL,
			started_us BIGINT NOT NULL,
			finished_us BIGINT NOT NULL
		)`,
		`CREATE INDEX edge_tunnels_started_idx ON edge_tunnels (started_us)`,
	}},
	// A session's runs, newest first: where a session run goes when the
	// edge has no node for it in memory (after a restart). Partial, so the
	// many runs without a session cost no index write.
	{2, []string{
		`CREATE INDEX edge_runs_session_idx ON edge_runs (session_id, adapter, created_us) WHERE session_id <> ''`,
	}},
	// The runs in flight, newest first (GET /v1/runs?status=running, which
	// the console asks on every load, and the reconciler's): through the
	// created index alone, with few runs in flight, that read the whole
	// history (seconds at millions of rows). Partial, so a row costs an
	// index entry only while it runs: a full index of status (or one of
	// key_name or adapter) cost a finished run's write ≈ 1.3-2× the CPU
	// (BenchmarkWriteBatch). A filter on those that few rows match still
	// walks the created index, within the read timeout and on the readers'
	// connections (see openReaders), never the writer's. The edge never
	// records a run queued (see RunHistoryHandler.List in application/edge);
	// the predicate names it all the same. Spelled with OR, not IN: SQLite
	// uses a partial index only for a query whose terms match a term of
	// its predicate.
	{3, []string{
		`CREATE INDEX edge_runs_live_idx ON edge_runs (status, created_us, id) WHERE status = 'queued' OR status = 'running'`,
	}},
	// The stored response (Responses API) a tunnel created: whose it is
	// and where its follow-ups go, for an edge that no longer remembers
	// it (a restart, or 10,000 newer ones). Nullable, and the index
	// partial, so the many tunnels that create none cost no index entry;
	// the column is added without a default, which neither database
	// rewrites the table for.
	{4, []string{
		`ALTER TABLE edge_tunnels ADD COLUMN response_id VARCHAR(255)`,
		`CREATE INDEX edge_tunnels_response_idx ON edge_tunnels (response_id, started_us) WHERE response_id IS NOT NULL`,
	}},
	// The stored response whose usage a tunnel counted without creating
	// it (the first retrieval of a background response that reported its
	// usage): an edge that recalls the response from the history knows
	// its usage was counted. Nullable and partial, as response_id.
	{5, []string{
		`ALTER TABLE edge_tunnels ADD COLUMN usage_of VARCHAR(255)`,
		`CREATE INDEX edge_tunnels_usage_of_idx ON edge_tunnels (usage_of) WHERE usage_of IS NOT NULL`,
	}},
}

// Version is the schema version this build migrates to.
func Version() int { return migrations[len(migrations)-1].version }

// migrate applies the migrations the database lacks, in one transaction
// on on, within a minute.
func (db *DB) migrate(ctx context.Context, on *bun.DB) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !db.postgres {
		return inSQLiteTx(ctx, on, !db.readOnly, db.applyMigrations)
	}
	start := time.Now()
	locked := false // a try gave way to another session's lock
	held := func(err error) error {
		return fmt.Errorf("%w (another session held a lock on the history's tables for %s, longer than this edge waits to migrate them)",
			err, time.Since(start).Round(time.Millisecond))
	}
	for {
		err := on.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			// The server gives up the migration when this edge does: one
			// left waiting on a table lock would hold the migration lock,
			// and every edge starting after it would wait for that lock in
			// vain.
			if err := boundStatements(ctx, tx); err != nil {
				return err
			}
			// Two edges starting at once: the second waits here, then
			// sees the first one's versions and applies nothing.
			if err := lockMigrations(ctx, tx); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = "+strconv.FormatInt(migrationLockWait.Milliseconds(), 10)); err != nil {
				return fmt.Errorf("lock timeout: %w", err)
			}
			return db.applyMigrations(ctx, tx)
		})
		if !lockNotAvailable(err) {
			if dl, _ := ctx.Deadline(); locked && err != nil && time.Until(dl) < migrationLockWait {
				// The last try ran out of the minute still waiting for
				// that lock: its statements' bound (what was left, under
				// lock_timeout) or the connection's deadline ended it.
				return held(err)
			}
			return err
		}
		locked = true
		// Another session holds a lock on a table to migrate (an edge of
		// the older release reading the history, say): give way to the
		// writes queued behind this migration's wait, then try again.
		t := time.NewTimer(migrationLockPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return held(err)
		case <-t.C:
		}
	}
}

// migrationLockWait is how long a migration statement waits for a lock on
// a table another session holds before the migration gives way and is
// tried again (until its minute ends). A statement waiting for one holds
// up every statement on that table after it, and those of the edges that
// go on writing the history (their batches have 5 s, WriteTimeout) would
// wait with it as long as another's read: 30 s.
const migrationLockWait = 2 * time.Second

// lockNotAvailable reports whether err is PostgreSQL's lock_timeout
// (SQLSTATE 55P03).
func lockNotAvailable(err error) bool { return pgCode(err) == "55P03" }

// pgCode is the SQLSTATE of a PostgreSQL error, "" for any other.
func pgCode(err error) string {
	var pg pgdriver.Error
	if !errors.As(err, &pg) {
		return ""
	}
	return pg.Field('C')
}

// inSQLiteTx runs fn in an SQLite transaction that, when write, holds the
// file's write lock from its start (BEGIN IMMEDIATE), waiting for it as
// every statement does (busy_timeout); a read-only file's may take none
// (and can only be at the edge's schema already). A deferred one (BEGIN) read the applied
// versions first and then asked for the lock to migrate; when another
// connection to the file (a previous edge still stopping, writing its
// last history batch) committed in between, SQLite refused the upgrade
// of its read at once, busy_timeout or not, and the edge did not start:
// "migration 4: database is locked (5) (SQLITE_BUSY)".
func inSQLiteTx(ctx context.Context, on *bun.DB, write bool, fn func(context.Context, bun.IDB) error) error {
	conn, err := on.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	begin := "BEGIN"
	if write {
		begin = "BEGIN IMMEDIATE"
	}
	if _, err := conn.ExecContext(ctx, begin); err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	if err := fn(ctx, conn); err != nil {
		// Rolled back even when ctx ended: the connection stays open.
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return fmt.Errorf("commit migration: %w", err)
	}
	return nil
}

// applyMigrations applies, in tx, the migrations the database lacks.
func (db *DB) applyMigrations(ctx context.Context, tx bun.IDB) error {
	// On PostgreSQL the table is made only when it is missing: CREATE
	// TABLE IF NOT EXISTS needs the CREATE privilege on the schema even
	// when the table is there, and an edge whose role may only read
	// and write its tables (a database its owner migrated) could not
	// start at all.
	exists := false
	var role, schema string // whom a refused CREATE names (read first: a refusal aborts tx)
	if db.postgres {
		if err := tx.QueryRowContext(ctx, "SELECT to_regclass('edge_schema_migrations') IS NOT NULL, current_user, coalesce(current_schema(), '')").
			Scan(&exists, &role, &schema); err != nil {
			return fmt.Errorf("read migrations: %w", err)
		}
	}
	// cannotCreate says what an edge refused the tables of an empty
	// database lacks; "permission denied for schema public" alone named
	// neither the privilege nor how to grant it.
	cannotCreate := func(err error) error {
		return fmt.Errorf("%w: this edge's database role %q may not create the history's tables: it needs the CREATE privilege "+
			"on schema %q (GRANT CREATE ON SCHEMA %s TO %s, as the schema's owner or a superuser), or start this release "+
			"once as a role that has it (the database's owner), which creates them",
			err, role, schema, pgIdent(schema), pgIdent(role))
	}
	if !exists {
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS edge_schema_migrations (
		version INTEGER PRIMARY KEY, applied_us BIGINT NOT NULL)`); err != nil {
			if db.postgres && notOwner(err) {
				return fmt.Errorf("create migrations table: %w", cannotCreate(err))
			}
			return fmt.Errorf("create migrations table: %w", err)
		}
	}
	var applied []int
	if err := tx.NewSelect().Table("edge_schema_migrations").Column("version").Scan(ctx, &applied); err != nil {
		return fmt.Errorf("read migrations: %w", err)
	}
	done := map[int]bool{}
	for _, v := range applied {
		done[v] = true
	}
	for _, v := range applied {
		if v > Version() {
			return fmt.Errorf("database schema version %d is newer than this edge knows (%d)", v, Version())
		}
	}
	from := 0
	for _, v := range applied {
		from = max(from, v)
	}
	for _, m := range migrations {
		if done[m.version] {
			continue
		}
		for _, s := range m.stmts {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				if notOwner(err) && from == 0 {
					// No table of the history is there yet to own.
					return fmt.Errorf("migration %d: %w", m.version, cannotCreate(err))
				}
				if notOwner(err) {
					return fmt.Errorf("migration %d: %w: this edge's database role may not change the history's schema "+
						"(from version %d to %d); start this release once as the role that owns the tables "+
						"edge_runs and edge_tunnels (the one that created them) or a superuser, which migrates it",
						m.version, err, from, Version())
				}
				return fmt.Errorf("migration %d: %w", m.version, err)
			}
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO edge_schema_migrations (version, applied_us) VALUES (?, ?)",
			m.version, time.Now().UnixMicro()); err != nil {
			return fmt.Errorf("migration %d: %w", m.version, err)
		}
	}
	return nil
}

// pgIdent is name quoted as a PostgreSQL identifier, for a statement an
// error message suggests.
func pgIdent(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

// checkPrivileges refuses a PostgreSQL role that may not read and write
// the history (README's minimum: SELECT, INSERT, UPDATE, DELETE on
// edge_runs and edge_tunnels, SELECT on edge_schema_migrations), naming
// what it lacks and the GRANT that gives it. Such an edge started, and
// every row it wrote was refused and dropped ("history rows dropped ...
// permission denied for table edge_runs"): the runs went unrecorded, with
// a warning in the log at most.
func checkPrivileges(ctx context.Context, on *bun.DB) error {
	rows, err := on.QueryContext(ctx, `SELECT current_user, t, p FROM (VALUES
		('edge_runs', 'SELECT'), ('edge_runs', 'INSERT'), ('edge_runs', 'UPDATE'), ('edge_runs', 'DELETE'),
		('edge_tunnels', 'SELECT'), ('edge_tunnels', 'INSERT'), ('edge_tunnels', 'UPDATE'), ('edge_tunnels', 'DELETE'),
		('edge_schema_migrations', 'SELECT')) AS need(t, p)
		WHERE NOT has_table_privilege(t, p)`)
	if err != nil {
		return fmt.Errorf("check privileges: %w", err)
	}
	defer rows.Close()
	var role string
	missing := map[string][]string{} // table → privileges it lacks
	var tables []string
	for rows.Next() {
		var t, p string
		if err := rows.Scan(&role, &t, &p); err != nil {
			return fmt.Errorf("check privileges: %w", err)
		}
		if missing[t] == nil {
			tables = append(tables, t)
		}
		missing[t] = append(missing[t], p)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check privileges: %w", err)
	}
	if len(tables) == 0 {
		return nil
	}
	var lacks, grants []string
	for _, t := range tables {
		ps := strings.Join(missing[t], ", ")
		lacks = append(lacks, ps+" on "+t)
		grants = append(grants, "GRANT "+ps+" ON "+pgIdent(t)+" TO "+pgIdent(role))
	}
	return fmt.Errorf("this edge's database role %q may not read and write the history: it lacks %s (%s; as the tables' owner or a superuser)",
		role, strings.Join(lacks, "; "), strings.Join(grants, "; "))
}

// notOwner reports whether err is PostgreSQL's refusal of a statement for
// want of a privilege (SQLSTATE 42501): ALTER TABLE and CREATE INDEX need
// the table's owner, CREATE TABLE the schema's CREATE.
func notOwner(err error) bool {
	var pg pgdriver.Error
	return errors.As(err, &pg) && pg.Field('C') == "42501"
}

// migrationLockPoll is how often an edge waiting for another's migration
// tries the lock again.
const migrationLockPoll = 100 * time.Millisecond

// lockMigrations takes the migration lock for tx, waiting while another
// edge holds it until ctx ends. It polls pg_try_advisory_xact_lock rather
// than blocking in pg_advisory_xact_lock: a blocked statement's answer is
// one read, cut off by the connection's read timeout (5 s by default,
// read_timeout), and another edge's migration on a loaded machine may take
// longer than that.
func lockMigrations(ctx context.Context, tx bun.Tx) error {
	return waitMigrationLock(ctx, func(ctx context.Context) (got bool, err error) {
		err = tx.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock(?)", int64(migrationLock)).Scan(&got)
		return got, err
	})
}

// waitMigrationLock is lockMigrations's wait, with try the lock's one try.
func waitMigrationLock(ctx context.Context, try func(context.Context) (bool, error)) error {
	start := time.Now()
	waitEnded := func() error {
		return fmt.Errorf("migration lock: another edge sharing the database held it (migrating the schema) for %s, longer than this edge waits: %w",
			time.Since(start).Round(time.Millisecond), ctx.Err())
	}
	for tried := false; ; tried = true {
		got, err := try(ctx)
		if err != nil {
			if tried && ctx.Err() != nil {
				// The wait ended while a try was on its way: the driver
				// says only "bad connection", which names no cause.
				return waitEnded()
			}
			return fmt.Errorf("migration lock: %w", err)
		}
		if got {
			return nil
		}
		t := time.NewTimer(migrationLockPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return waitEnded()
		case <-t.C:
		}
	}
}

// Reclaim gives the pages a prune freed back to the file system, so the
// file shrinks, and returns the bytes given back: nothing on PostgreSQL or
// on a file made before the store set incremental auto-vacuum (see package
// reclaim).
func (db *DB) Reclaim(ctx context.Context) (int64, error) {
	if db.postgres {
		return 0, nil
	}
	return reclaim.Free(ctx, db.stmts.DB)
}
