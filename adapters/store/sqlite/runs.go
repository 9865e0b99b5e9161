package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/uptrace/bun"

	"iop/adapters/store/internal/usagesql"
	"iop/domain"
	"iop/ports"
)

// RunStore is the node's run record in SQLite.
type RunStore struct {
	db  *bun.DB
	raw *DB // for the prepared statements of CreateRun, UpdateRun and GetRun
}

var _ ports.RunStore = (*RunStore)(nil)

// NewRunStore returns a RunStore on db.
func NewRunStore(db *DB) *RunStore {
	return &RunStore{db: db.bun, raw: db}
}

// runRow is one row of the runs table. Times are written by bun in UTC as
// "2006-01-02 15:04:05.999999+00:00" text; with the fixed offset suffix that
// text sorts in time order, which ListRuns relies on. The usage columns are
// all NULL when the run has no usage, so "no usage" and "zero usage" survive
// a round trip.
type runRow struct {
	bun.BaseModel `bun:"table:runs"`

	ID           string    `bun:"id,pk"`
	Adapter      string    `bun:"adapter,notnull"`
	Target       string    `bun:"target,notnull"`
	SessionID    string    `bun:"session_id,notnull"`
	Background   bool      `bun:"background,notnull"`
	Status       string    `bun:"status,notnull"`
	CreatedAt    time.Time `bun:"created_at,notnull"`
	StartedAt    time.Time `bun:"started_at,nullzero"`
	FinishedAt   time.Time `bun:"finished_at,nullzero"`
	ErrorCode    string    `bun:"error_code,notnull"`
	ErrorMessage string    `bun:"error_message,notnull"`

	PromptTokens     *int64   `bun:"prompt_tokens"`
	CompletionTokens *int64   `bun:"completion_tokens"`
	TotalTokens      *int64   `bun:"total_tokens"`
	CostUSD          *float64 `bun:"cost_usd"`
	DurationMS       *int64   `bun:"duration_ms"`
	StopReason       *string  `bun:"stop_reason"`
	Model            *string  `bun:"model"`
}

func toRow(r *domain.Run) *runRow {
	s := r.Snapshot()
	row := &runRow{
		ID: s.ID, Adapter: s.Adapter, Target: s.Target, SessionID: s.SessionID, Background: s.Background,
		Status: string(s.Status), CreatedAt: s.CreatedAt.UTC(), StartedAt: utc(s.StartedAt), FinishedAt: utc(s.FinishedAt),
		ErrorCode: s.ErrorCode, ErrorMessage: s.ErrorMessage,
	}
	if s.Usage != nil {
		// Within the bounds every sum over it needs (see domain.Usage.Bounded).
		u := s.Usage.Bounded()
		row.PromptTokens, row.CompletionTokens, row.TotalTokens = &u.PromptTokens, &u.CompletionTokens, &u.TotalTokens
		row.CostUSD, row.DurationMS, row.StopReason, row.Model = &u.CostUSD, &u.DurationMS, &u.StopReason, &u.Model
	}
	return row
}

func toDomain(row *runRow) (*domain.Run, error) {
	s := domain.RunSnapshot{
		ID: row.ID, Adapter: row.Adapter, Target: row.Target, SessionID: row.SessionID, Background: row.Background,
		Status: domain.RunStatus(row.Status), CreatedAt: row.CreatedAt.UTC(), StartedAt: utc(row.StartedAt),
		FinishedAt: utc(row.FinishedAt), ErrorCode: row.ErrorCode, ErrorMessage: row.ErrorMessage,
	}
	if row.PromptTokens != nil {
		s.Usage = &domain.Usage{
			PromptTokens: deref(row.PromptTokens), CompletionTokens: deref(row.CompletionTokens),
			TotalTokens: deref(row.TotalTokens), CostUSD: deref(row.CostUSD), DurationMS: deref(row.DurationMS),
			StopReason: deref(row.StopReason), Model: deref(row.Model),
		}
	}
	return domain.RehydrateRun(s)
}

// utc converts t to UTC but keeps the zero time zero, so an unset timestamp
// stays NULL in the table and IsZero in the domain.
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// The columns of runRow, and the prepared statements over them (see
// stmts). Every placeholder appears once, in number order. Only a run's
// state changes once it is created (domain.Run's Start and Finish), so an
// update sets just those columns and leaves the created_at index alone.
var (
	createdColumns = []string{"id", "adapter", "target", "session_id", "background", "created_at"}
	stateColumns   = []string{"status", "started_at", "finished_at", "error_code", "error_message",
		"prompt_tokens", "completion_tokens", "total_tokens", "cost_usd", "duration_ms", "stop_reason", "model"}
	allRunColumns = strings.Join(append(slices.Clone(createdColumns), stateColumns...), ", ")
	insertRunSQL  = "INSERT INTO runs (" + allRunColumns + ") VALUES (" + placeholders(len(createdColumns)+len(stateColumns)) + ")"
	selectRunSQL  = "SELECT " + allRunColumns + " FROM runs WHERE id = $1"
	updateRunSQL  = func() string {
		set := make([]string, len(stateColumns))
		for i, c := range stateColumns {
			set[i] = c + " = $" + strconv.Itoa(i+1)
		}
		return "UPDATE runs SET " + strings.Join(set, ", ") + " WHERE id = $" + strconv.Itoa(len(stateColumns)+1)
	}()
	// updateRunIfSQL is updateRunSQL guarded by the status the run had.
	updateRunIfSQL = updateRunSQL + " AND status = $" + strconv.Itoa(len(stateColumns)+2)
)

func placeholders(n int) string {
	p := make([]string, n)
	for i := range p {
		p[i] = "$" + strconv.Itoa(i+1)
	}
	return strings.Join(p, ", ")
}

// createdArg is a run's creation time as a statement argument: as
// timeArg, but the zero time as it is (the column is not null, and bun
// writes the zero time as it is).
func (db *DB) createdArg(t time.Time) any {
	created := db.timeArg(t)
	if created == nil {
		created = t.UTC().Format(sqliteTime)
		if db.postgres {
			created = t.UTC()
		}
	}
	return created
}

// insertArgs returns row's columns as insertRunSQL's arguments.
func (db *DB) insertArgs(row *runRow) []any {
	args := make([]any, 0, len(createdColumns)+len(stateColumns))
	args = append(args, row.ID, row.Adapter, row.Target, row.SessionID, row.Background, db.createdArg(row.CreatedAt))
	return db.appendState(args, row)
}

// appendState appends row's state columns, in stateColumns order, as
// statement arguments: NULL for a nil pointer or an unset (zero) start or
// finish time, as bun writes them.
func (db *DB) appendState(args []any, row *runRow) []any {
	return append(args, row.Status, db.timeArg(row.StartedAt), db.timeArg(row.FinishedAt), row.ErrorCode, row.ErrorMessage,
		nullable(row.PromptTokens), nullable(row.CompletionTokens), nullable(row.TotalTokens),
		nullable(row.CostUSD), nullable(row.DurationMS), nullable(row.StopReason), nullable(row.Model))
}

func nullable[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// CreateRun inserts a new run; a run with the same id already stored is an error.
func (s *RunStore) CreateRun(ctx context.Context, run *domain.Run) error {
	if run == nil {
		return errors.New("insert run: nil run")
	}
	row := toRow(run)
	if s.raw.postgres {
		st, err := s.raw.stmts.Get(ctx, insertRunSQL)
		if err == nil {
			_, err = st.ExecContext(ctx, s.raw.insertArgs(row)...)
		}
		if err != nil {
			return fmt.Errorf("insert run %s: %w", run.ID(), err)
		}
		return nil
	}
	w := &groupWrite{ctx: ctx, query: insertRunSQL, args: s.raw.insertArgs(row)}
	s.raw.group.write(s.raw, w)
	if w.err != nil {
		return fmt.Errorf("insert run %s: %w", run.ID(), w.err)
	}
	s.raw.runs.put(run.Snapshot())
	return nil
}

// UpdateRun loads the run, applies fn and saves the result in one
// transaction. fn's error is returned as is and nothing is saved; a missing
// run is domain.ErrRunNotFound and fn is not called. fn runs while the
// transaction holds the database's only connection, so it must be quick and
// must not call any store on the same DB (that would deadlock). fn may be
// called twice, each time on a fresh copy, when the row was changed from
// outside the process (see unfinished); it must only transform the run it
// is given.
func (s *RunStore) UpdateRun(ctx context.Context, id string, fn func(*domain.Run) error) error {
	if !s.raw.postgres {
		if run, was, ok := s.raw.runs.get(id); ok {
			done, err := s.updateKnown(ctx, run, was, fn)
			if done {
				return err
			}
			s.raw.runs.forget(id)
		}
	}
	// Prepared before the transaction takes the only connection.
	sel, err := s.raw.stmts.Get(ctx, selectRunSQL)
	if err != nil {
		return fmt.Errorf("select run %s: %w", id, err)
	}
	upd, err := s.raw.stmts.Get(ctx, updateRunSQL)
	if err != nil {
		return fmt.Errorf("update run %s: %w", id, err)
	}
	var saved domain.RunSnapshot
	err = s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		run, err := getRun(ctx, tx.StmtContext(ctx, sel), id)
		if err != nil {
			return err
		}
		if err := fn(run); err != nil {
			return err
		}
		row := toRow(run)
		if _, err := tx.StmtContext(ctx, upd).ExecContext(ctx, append(s.raw.appendState(make([]any, 0, len(stateColumns)+1), row), row.ID)...); err != nil {
			return fmt.Errorf("update run %s: %w", id, err)
		}
		saved = run.Snapshot()
		return nil
	})
	if err == nil && !s.raw.postgres {
		s.raw.runs.put(saved)
	}
	return err
}

// updateKnown is UpdateRun for a run whose state unfinished holds (was,
// rebuilt as run): fn applied to it and the result written in one
// statement, guarded by the stored status, grouped with other runs'
// writes (groupCommit). done is false when no row matched the guard, so
// the caller must read the row back instead.
func (s *RunStore) updateKnown(ctx context.Context, run *domain.Run, was domain.RunSnapshot, fn func(*domain.Run) error) (done bool, err error) {
	if err := fn(run); err != nil {
		return true, err
	}
	row := toRow(run)
	w := &groupWrite{ctx: ctx, query: updateRunIfSQL, guarded: true,
		args: append(s.raw.appendState(make([]any, 0, len(stateColumns)+2), row), row.ID, string(was.Status))}
	s.raw.group.write(s.raw, w)
	if w.err != nil {
		s.raw.runs.forget(was.ID)
		return true, fmt.Errorf("update run %s: %w", was.ID, w.err)
	}
	if !w.matched {
		return false, nil
	}
	s.raw.runs.put(run.Snapshot())
	return true, nil
}

// GetRun returns the run with the given id, or domain.ErrRunNotFound.
func (s *RunStore) GetRun(ctx context.Context, id string) (*domain.Run, error) {
	sel, err := s.raw.stmts.Get(ctx, selectRunSQL)
	if err != nil {
		return nil, fmt.Errorf("select run %s: %w", id, err)
	}
	return getRun(ctx, sel, id)
}

// getRun runs selectRunSQL prepared as sel.
func getRun(ctx context.Context, sel *sql.Stmt, id string) (*domain.Run, error) {
	var (
		row                   runRow
		created, started, fin dbTime
		prompt, compl, total  sql.NullInt64
		dur                   sql.NullInt64
		cost                  sql.NullFloat64
		stop, model           sql.NullString
	)
	err := sel.QueryRowContext(ctx, id).Scan(&row.ID, &row.Adapter, &row.Target, &row.SessionID, &row.Background, &created,
		&row.Status, &started, &fin, &row.ErrorCode, &row.ErrorMessage,
		&prompt, &compl, &total, &cost, &dur, &stop, &model)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("select run %s: %w", id, domain.ErrRunNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("select run %s: %w", id, err)
	}
	row.CreatedAt, row.StartedAt, row.FinishedAt = created.t, started.t, fin.t
	row.PromptTokens, row.CompletionTokens, row.TotalTokens = ptr(prompt.Int64, prompt.Valid), ptr(compl.Int64, compl.Valid), ptr(total.Int64, total.Valid)
	row.CostUSD, row.DurationMS = ptr(cost.Float64, cost.Valid), ptr(dur.Int64, dur.Valid)
	row.StopReason, row.Model = ptr(stop.String, stop.Valid), ptr(model.String, model.Valid)
	return toDomain(&row)
}

func ptr[T any](v T, ok bool) *T {
	if !ok {
		return nil
	}
	return &v
}

// dbTime scans a time column: a time.Time (PostgreSQL, and SQLite's driver
// for a TIMESTAMP column it can parse), the text bun writes, or NULL (the
// zero time).
type dbTime struct{ t time.Time }

func (d *dbTime) Scan(v any) error {
	switch v := v.(type) {
	case nil:
		d.t = time.Time{}
	case time.Time:
		d.t = v
	case string:
		return d.parse(v)
	case []byte:
		return d.parse(string(v))
	default:
		return fmt.Errorf("scan time: unsupported %T", v)
	}
	return nil
}

func (d *dbTime) parse(s string) error {
	for _, layout := range []string{sqliteTime, time.RFC3339Nano, "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999"} {
		if t, err := time.Parse(layout, s); err == nil {
			d.t = t
			return nil
		}
	}
	return fmt.Errorf("scan time: cannot parse %q", s)
}

// ListRuns returns the page f asks for of the runs matching it: newest
// first, ties on created_at broken by id, both descending
// (domain.RunKey), those after f.After when it is set, at most
// f.PageLimit().
func (s *RunStore) ListRuns(ctx context.Context, f domain.RunFilter) ([]*domain.Run, error) {
	var rows []runRow
	q := s.db.NewSelect().Model(&rows).OrderExpr("created_at DESC, id DESC").Limit(int64(f.PageLimit()))
	if f.Status != "" {
		q = q.Where("status = ?", string(f.Status))
	}
	if f.Adapter != "" {
		q = q.Where("adapter = ?", f.Adapter)
	}
	if a := f.After; a != nil {
		// The first term lets the created_at index bound the scan.
		created := s.raw.createdArg(a.CreatedAt)
		q = q.Where("created_at <= ?", created).Where("(created_at, id) < (?, ?)", created, a.ID)
	}
	if err := q.Scan(ctx); err != nil {
		return nil, fmt.Errorf("select runs: %w", err)
	}
	runs := make([]*domain.Run, 0, len(rows))
	for i := range rows {
		r, err := toDomain(&rows[i])
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// usageRow is one row of the UsageByAdapter aggregate.
type usageRow struct {
	Adapter          string  `bun:"adapter"`
	RunsTotal        int64   `bun:"runs_total"`
	Succeeded        int64   `bun:"succeeded"`
	Failed           int64   `bun:"failed"`
	Cancelled        int64   `bun:"cancelled"`
	Running          int64   `bun:"running"`
	PromptTokens     int64   `bun:"prompt_tokens"`
	CompletionTokens int64   `bun:"completion_tokens"`
	TotalTokens      int64   `bun:"total_tokens"`
	CostUSD          float64 `bun:"cost_usd"`
}

// UsageByAdapter returns one summary per adapter that has runs, ordered by
// adapter name. Counts use CASE, not SUM(boolean), which PostgreSQL
// refuses. Running counts queued and running runs; TotalTokens sums
// domain.Usage.Total, so a provider that reported no total still counts.
// Each row's numbers are summed within the bounds toRow writes: a row
// written before the store bounded them may hold anything (a count near
// the int64 maximum, a total that wrapped negative).
func (s *RunStore) UsageByAdapter(ctx context.Context) ([]domain.UsageSummary, error) {
	var rows []usageRow
	pg := s.raw.postgres
	prompt, completion := usagesql.Tokens("prompt_tokens", pg), usagesql.Tokens("completion_tokens", pg)
	err := s.db.NewSelect().Model((*runRow)(nil)).
		Column("adapter").
		ColumnExpr("COUNT(*) AS runs_total").
		ColumnExpr("SUM(CASE WHEN status = ? THEN 1 ELSE 0 END) AS succeeded", string(domain.RunSucceeded)).
		ColumnExpr("SUM(CASE WHEN status = ? THEN 1 ELSE 0 END) AS failed", string(domain.RunFailed)).
		ColumnExpr("SUM(CASE WHEN status = ? THEN 1 ELSE 0 END) AS cancelled", string(domain.RunCancelled)).
		ColumnExpr("SUM(CASE WHEN status IN (?, ?) THEN 1 ELSE 0 END) AS running", string(domain.RunQueued), string(domain.RunRunning)).
		ColumnExpr("COALESCE(SUM("+prompt+"), 0) AS prompt_tokens").
		ColumnExpr("COALESCE(SUM("+completion+"), 0) AS completion_tokens").
		ColumnExpr("COALESCE(SUM(CASE WHEN total_tokens > 0 THEN "+usagesql.Tokens("total_tokens", pg)+
			" ELSE COALESCE("+prompt+", 0) + COALESCE("+completion+", 0) END), 0) AS total_tokens").
		ColumnExpr("COALESCE(SUM("+usagesql.Cost("cost_usd", pg)+"), 0.0) AS cost_usd").
		Group("adapter").
		Order("adapter").
		Scan(ctx, &rows)
	if err != nil {
		return nil, fmt.Errorf("select usage: %w", err)
	}
	out := make([]domain.UsageSummary, len(rows))
	for i, r := range rows {
		out[i] = domain.UsageSummary(r)
	}
	return out, nil
}
