package sqlite

import "time"

// The prepared statements of the hot paths (a run's insert, select by id
// and update) live in DB.stmts (sqlprep.Cache): SQL that bun builds has
// every value spelled into its text, and SQLite's parse of it was about a
// fifth of the run store's CPU. They use $N placeholders, which both SQLite
// and PostgreSQL accept, numbered in order of appearance.

// sqliteTime is the text bun writes for a time on SQLite (UTC, microseconds,
// trailing zeros dropped, "+00:00"). The prepared statements write the same
// text, so rows sort by created_at the same whichever path wrote them.
const sqliteTime = "2006-01-02 15:04:05.999999-07:00"

// timeArg is t as a statement argument for the database's dialect; the zero
// time is NULL.
func (db *DB) timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	if db.postgres {
		return t.UTC()
	}
	return t.UTC().Format(sqliteTime)
}
