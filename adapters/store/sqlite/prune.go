package sqlite

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"iop/domain"
	"iop/internal/every"
)

// DefaultRetention is how long the node keeps a finished run and an idle
// session when StartPruning is given no retention (the node config's
// store.retention default).
const DefaultRetention = 30 * 24 * time.Hour

// DefaultPruneInterval is how often StartPruning prunes after its first
// pass, at start.
const DefaultPruneInterval = time.Hour

// pruneChunk is the most rows one pruning statement deletes (of a chat
// session's messages, up to the next turn or model message: deleteChat),
// and the most chat sessions one look-up reads: on SQLite (one connection) a statement
// holds every reader and writer of the store until it ends, and 1,000 rows
// with their index entries take milliseconds, where all of a month's
// expired rows in one statement could hold up runs for seconds.
const pruneChunk = 1000

// PruneResult counts what one Prune deleted.
type PruneResult struct {
	Runs          int64 // finished runs
	ChatSessions  int64 // chat sessions forgotten (all their messages deleted)
	ChatMessages  int64 // the messages of those sessions
	AgentSessions int64 // CLI agent session mappings forgotten
}

// Empty reports whether nothing was deleted.
func (r PruneResult) Empty() bool { return r == PruneResult{} }

// inFlightSQL is true when the session of the row aliased x has a run
// queued or running: its session is in use, whatever its age. runs has no
// index on session_id; its status index finds the few unfinished runs.
const inFlightSQL = "EXISTS (SELECT 1 FROM runs AS r WHERE r.adapter = x.adapter AND r.session_id = x.session_id" +
	" AND r.status IN ('" + string(domain.RunQueued) + "', '" + string(domain.RunRunning) + "'))"

// Prune deletes what is older than cutoff:
//   - finished runs (succeeded, failed, cancelled) that finished before
//     cutoff; a queued or running run is kept however old;
//   - chat sessions whose newest message is older than cutoff (idle since),
//     all their messages: the session is forgotten, and its next turn
//     starts a new history;
//   - CLI agent session mappings last used before cutoff (the next turn
//     starts a new agent session).
//
// A session with a run queued or running is kept. Prune deletes in chunks
// of at most pruneChunk rows, each its own statement and transaction, so
// runs and turns take turns with it however much has expired; it returns
// what it deleted so far, with the error that stopped it.
func (db *DB) Prune(ctx context.Context, cutoff time.Time) (PruneResult, error) {
	return db.pruneChunks(ctx, cutoff, pruneChunk)
}

// pruneChunks is Prune with at most chunk rows per statement.
func (db *DB) pruneChunks(ctx context.Context, cutoff time.Time, chunk int) (PruneResult, error) {
	var res PruneResult
	var err error
	if res.Runs, err = db.pruneRuns(ctx, cutoff, chunk); err != nil {
		return res, fmt.Errorf("prune runs: %w", err)
	}
	if res.ChatSessions, res.ChatMessages, err = db.pruneChats(ctx, cutoff, chunk); err != nil {
		return res, fmt.Errorf("prune chat sessions: %w", err)
	}
	if res.AgentSessions, err = db.pruneAgentSessions(ctx, cutoff, chunk); err != nil {
		return res, fmt.Errorf("prune agent sessions: %w", err)
	}
	return res, nil
}

// statementTimeout bounds one pruning statement or look-up (the edge's
// prune bounds its statements alike).
const statementTimeout = time.Minute

// pruneExec runs one pruning statement and returns the rows it deleted.
func (db *DB) pruneExec(ctx context.Context, query string, args ...any) (int64, error) {
	sctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	res, err := db.bun.ExecContext(sctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// deleteChunks runs query, a DELETE of at most chunk rows whose last
// argument is chunk, until a statement deletes fewer, and returns the rows
// deleted in all.
func (db *DB) deleteChunks(ctx context.Context, chunk int, query string, args ...any) (int64, error) {
	args = append(args, chunk)
	var total int64
	for {
		n, err := db.pruneExec(ctx, query, args...)
		total += n
		if err != nil || n < int64(chunk) {
			return total, err
		}
	}
}

// pruneRuns deletes finished runs that finished before cutoff. A run
// finishes after it is created, so "created before cutoff" adds nothing to
// the condition but lets SQLite walk runs_created_at_idx over the expired
// rows only; finished_at has no index of its own (an index written once
// per run for an hourly prune). The status is checked with NOT IN, which
// no index serves: with IN (the finished statuses) SQLite chose
// runs_status_idx, and the last chunk of every pass then walked all the
// runs retained. A run in flight has no finished_at, so the check only
// states the rule. A chunk is picked by SQLite's rowid (the table's own
// b-tree key), on PostgreSQL by the primary key.
func (db *DB) pruneRuns(ctx context.Context, cutoff time.Time, chunk int) (int64, error) {
	key := "rowid"
	if db.postgres {
		key = "id"
	}
	cut := db.timeArg(cutoff)
	query := "DELETE FROM runs WHERE " + key + " IN (SELECT " + key + " FROM runs" +
		" WHERE created_at < ? AND finished_at < ? AND status NOT IN (?, ?) LIMIT ?)"
	return db.deleteChunks(ctx, chunk, query, cut, cut, string(domain.RunQueued), string(domain.RunRunning))
}

// chatSessionPage is one session of a page pruneChats reads.
type chatSessionPage struct {
	Adapter   string `bun:"adapter"`
	SessionID string `bun:"session_id"`
	Expired   int    `bun:"expired"` // 1 or 0: a CASE, portable as an integer
}

// pruneChats forgets the chat sessions idle since before cutoff. It walks
// the sessions a page of chunk at a time in key order (the primary key's
// index, without reading message bodies), each page's newest messages
// looked up by key, then deletes the expired sessions' messages, oldest
// first, at most chunk per statement. A message appended after the page
// was read (a turn that began meanwhile) is newer than cutoff and stays,
// and so does what is left of its session (deleteChat); such a turn may
// find its session's older history gone, whole turns of it, as an idle
// session's next turn does.
func (db *DB) pruneChats(ctx context.Context, cutoff time.Time, chunk int) (sessions, messages int64, err error) {
	cut := db.timeArg(cutoff)
	var after *chatSessionPage
	for {
		page, err := db.chatPage(ctx, cut, after, chunk)
		if err != nil {
			return sessions, messages, err
		}
		for _, s := range page {
			if s.Expired == 0 {
				continue
			}
			n, err := db.deleteChat(ctx, s.Adapter, s.SessionID, cut, chunk)
			messages += n
			if n > 0 {
				sessions++
				if serr := db.syncChatSession(ctx, s.Adapter, s.SessionID); err == nil {
					err = serr
				}
			}
			if err != nil {
				return sessions, messages, err
			}
		}
		if len(page) < chunk {
			// Summaries with no messages left (a database an older node
			// wrote to after this one made the table) go once they expire.
			_, err := db.deleteChunks(ctx, chunk, "DELETE FROM chat_sessions WHERE (adapter, session_id) IN"+
				" (SELECT x.adapter, x.session_id FROM chat_sessions AS x WHERE x.last_used < ? AND NOT EXISTS"+
				" (SELECT 1 FROM chat_messages AS m WHERE m.adapter = x.adapter AND m.session_id = x.session_id) LIMIT ?)", cut)
			return sessions, messages, err
		}
		after = &page[len(page)-1]
	}
}

// chatPage returns up to n sessions after the one given (all from the
// start when nil), in key order, each marked expired when its newest
// message is older than cut and it has no run in flight.
func (db *DB) chatPage(ctx context.Context, cut any, after *chatSessionPage, n int) ([]chatSessionPage, error) {
	where, args := "", []any{}
	if after != nil {
		where = " WHERE (adapter, session_id) > (?, ?)"
		args = append(args, after.Adapter, after.SessionID)
	}
	query := "SELECT x.adapter, x.session_id, CASE WHEN m.created_at < ? AND NOT " + inFlightSQL + " THEN 1 ELSE 0 END AS expired" +
		" FROM (SELECT adapter, session_id, MAX(seq) AS seq FROM chat_messages" + where +
		" GROUP BY adapter, session_id ORDER BY adapter, session_id LIMIT ?) AS x" +
		" JOIN chat_messages AS m ON m.adapter = x.adapter AND m.session_id = x.session_id AND m.seq = x.seq" +
		" ORDER BY x.adapter, x.session_id"
	args = append([]any{cut}, append(args, n)...)
	sctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	var page []chatSessionPage
	if err := db.bun.NewRaw(query, args...).Scan(sctx, &page); err != nil {
		return nil, err
	}
	return page, nil
}

// longTurn is how many chunks' worth of a session's messages (by seq)
// deleteChat looks through for the start of a turn before it cuts a chunk
// inside one (one long agent turn: a user message, then thousands of tool
// calls and results).
const longTurn = 10

// chatCut returns where deleteChat's next statement cuts a session: it
// deletes the messages before seq before but the one at keep (0: none).
// Looked up in two statements, each walking the session's index once or
// over a few messages: PostgreSQL inlined one statement's derived tables
// and walked the session from its start for each bound it tested.
func (db *DB) chatCut(ctx context.Context, adapter, sessionID string, chunk int) (before, keep int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	var seqs []int64
	if err := db.bun.NewRaw(chatChunkQuery, adapter, sessionID, chunk-1).Scan(ctx, &seqs); err != nil {
		return 0, 0, err
	}
	all := int64(1) << 62
	if len(seqs) < 2 {
		return all, 0, nil // at most a chunk left
	}
	c, n := seqs[0], seqs[1] // the chunk's last message and the one after it
	var cut struct {
		Turn  *int64 `bun:"u"`
		Model *int64 `bun:"m"`
		Open  *int64 `bun:"o"`
	}
	if err := db.bun.NewRaw(chatCutQuery, adapter, sessionID, c, c+(longTurn-1)*int64(chunk), adapter, sessionID, n,
		adapter, sessionID, adapter, sessionID, n).Scan(ctx, &cut); err != nil {
		return 0, 0, err
	}
	switch {
	case cut.Turn != nil:
		return *cut.Turn, 0, nil
	case cut.Model != nil && cut.Open != nil:
		return *cut.Model, *cut.Open, nil
	case cut.Model != nil:
		return *cut.Model, 0, nil
	}
	return all, 0, nil
}

// chatChunkQuery looks up the seq of a session's message at an offset
// and of the one after it.
const chatChunkQuery = "SELECT seq FROM chat_messages WHERE adapter = ? AND session_id = ? ORDER BY seq LIMIT 2 OFFSET ?"

// chatCutQuery looks up where a turn starts after a chunk, within a bound,
// where the model's first message after the one after the chunk is, and
// the user message before that.
const chatCutQuery = "SELECT (SELECT u.seq FROM chat_messages AS u WHERE u.adapter = ? AND u.session_id = ? AND u.role = 'user'" +
	" AND u.seq > ? AND u.seq <= ? ORDER BY u.seq LIMIT 1) AS u, " + chatModelQuery + " AS m," +
	" (SELECT o.seq FROM chat_messages AS o WHERE o.adapter = ? AND o.session_id = ? AND o.role = 'user' AND o.seq < " + chatModelQuery +
	" ORDER BY o.seq DESC LIMIT 1) AS o"

const chatModelQuery = "(SELECT a.seq FROM chat_messages AS a WHERE a.adapter = ? AND a.session_id = ? AND a.role = 'assistant'" +
	" AND a.seq > ? ORDER BY a.seq LIMIT 1)"

// deleteChat deletes the session's messages older than cut, oldest first,
// a chunk of at least chunk messages per statement, up to the start of a
// turn (a user message) within longTurn chunks. Past that, inside one long
// turn, it deletes up to the model's next message (an assistant message:
// its tool calls' results follow it, so none is left without its call)
// but keeps the turn's user message, so what is left is the turn's opening
// and its newest tool-call groups, as a replay trims a turn too long to
// send (adapters/runtime/internal/chat). The statement that finds neither
// after the chunk (or a turn beyond longTurn chunks and no assistant
// message before it, which a provider's tool loop never stores) deletes
// the rest. What is left between statements is
// thus whole turns, or such a turn: a turn that loads the history then
// replays no tool result without its call.
//
// Each statement checks again that no run of the session is queued or
// running: one that started after chatPage found the session idle (the
// pass deleting other sessions meanwhile) replays the history, which
// stays, all of it or what is not yet deleted. Each checks too that the
// session is still idle (its newest message older than cut, as chatPage
// found it): a turn that started and ended in between (its run finished,
// so the first check passes) appended to the history it replayed, which
// stays with what it appended. The cut is looked up before each statement
// (chatCut); what happens in between only appends to the session, after
// the cut, or deletes all of it, and the delete's checks then find it
// used again.
func (db *DB) deleteChat(ctx context.Context, adapter, sessionID string, cut any, chunk int) (int64, error) {
	const query = "DELETE FROM chat_messages WHERE adapter = ? AND session_id = ? AND created_at < ? AND seq < ? AND seq <> ?" +
		" AND NOT EXISTS (SELECT 1 FROM runs AS r WHERE r.adapter = ? AND r.session_id = ? AND r.status IN (?, ?))" +
		" AND (SELECT l.created_at FROM chat_messages AS l WHERE l.adapter = ? AND l.session_id = ? ORDER BY l.seq DESC LIMIT 1) < ?"
	var total int64
	for {
		before, keep, err := db.chatCut(ctx, adapter, sessionID, chunk)
		if err != nil {
			return total, err
		}
		n, err := db.pruneExec(ctx, query, adapter, sessionID, cut, before, keep,
			adapter, sessionID, string(domain.RunQueued), string(domain.RunRunning), adapter, sessionID, cut)
		total += n
		if err != nil || n < int64(chunk) {
			return total, err
		}
	}
}

// syncChatSession brings the summary of a session whose old messages
// pruneChats deleted in line with what is left: gone with the last
// message, else its turns counted again (a turn appended while the prune
// ran keeps the session, and its summary counted the deleted replies).
func (db *DB) syncChatSession(ctx context.Context, adapter, sessionID string) error {
	if _, err := db.pruneExec(ctx, "DELETE FROM chat_sessions WHERE adapter = ? AND session_id = ? AND NOT EXISTS"+
		" (SELECT 1 FROM chat_messages AS m WHERE m.adapter = ? AND m.session_id = ?)", adapter, sessionID, adapter, sessionID); err != nil {
		return err
	}
	_, err := db.pruneExec(ctx, "UPDATE chat_sessions SET turns = (SELECT COUNT(*) FROM chat_messages AS m"+
		" WHERE m.adapter = chat_sessions.adapter AND m.session_id = chat_sessions.session_id AND m.reply)"+
		" WHERE adapter = ? AND session_id = ?", adapter, sessionID)
	return err
}

// pruneAgentSessions deletes the agent session mappings last used before
// cutoff whose session has no run in flight (one row per session, so a
// chunk of rows is a chunk of sessions).
func (db *DB) pruneAgentSessions(ctx context.Context, cutoff time.Time, chunk int) (int64, error) {
	query := "DELETE FROM agent_sessions WHERE (adapter, session_id) IN (SELECT x.adapter, x.session_id FROM agent_sessions AS x" +
		" WHERE x.updated_at < ? AND NOT " + inFlightSQL + " LIMIT ?)"
	return db.deleteChunks(ctx, chunk, query, db.timeArg(cutoff))
}

// pruner is the goroutine StartPruning starts.
type pruner struct {
	mu   sync.Mutex
	stop context.CancelFunc
	done chan struct{}
}

// StartPruning prunes what is older than retention (see Prune) now and
// every interval, in the background, until StopPruning or Close. A zero
// retention is DefaultRetention, a negative one keeps everything (nothing
// is started); a non-positive interval is DefaultPruneInterval. Each pass
// that deleted something logs one line at info; a failed pass logs a
// warning and the next one tries again. Starting it twice is a no-op.
func (db *DB) StartPruning(retention, interval time.Duration, log *slog.Logger) {
	if retention == 0 {
		retention = DefaultRetention
	}
	if retention < 0 {
		return
	}
	if interval <= 0 {
		interval = DefaultPruneInterval
	}
	if log == nil {
		log = slog.Default()
	}
	db.pruner.mu.Lock()
	defer db.pruner.mu.Unlock()
	if db.pruner.stop != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	db.pruner.stop, db.pruner.done = cancel, done
	go func() {
		defer close(done)
		db.prunePeriodically(ctx, retention, interval, log)
	}()
}

// StopPruning stops the goroutine StartPruning started, cancelling a pass
// under way, and waits for it to end. Without one it does nothing.
func (db *DB) StopPruning() {
	db.pruner.mu.Lock()
	stop, done := db.pruner.stop, db.pruner.done
	db.pruner.stop, db.pruner.done = nil, nil
	db.pruner.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-done
}

func (db *DB) prunePeriodically(ctx context.Context, retention, interval time.Duration, log *slog.Logger) {
	every.Run(ctx, interval, func(ctx context.Context) {
		res, err := db.Prune(ctx, time.Now().Add(-retention))
		attrs := []any{"runs", res.Runs, "chat_sessions", res.ChatSessions, "chat_messages", res.ChatMessages,
			"agent_sessions", res.AgentSessions, "retention", retention}
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("node store prune failed", append(attrs, "err", err)...)
		case err == nil && !res.Empty():
			// The file shrinks by what the prune freed.
			freed, rerr := db.Reclaim(ctx)
			attrs = append(attrs, "reclaimed_bytes", freed)
			if rerr != nil && ctx.Err() == nil {
				log.Warn("node store pruned; giving the freed pages back failed", append(attrs, "err", rerr)...)
				break
			}
			log.Info("node store pruned", attrs...)
		}
	})
}
