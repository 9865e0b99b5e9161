package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"iop/adapters/store/internal/chattail"
	"iop/adapters/store/internal/sqltext"
	"iop/domain"
	"iop/ports"
)

// ChatStore keeps chat session histories in SQLite.
type ChatStore struct {
	db  *bun.DB
	raw *DB
}

var _ ports.ChatSessionStore = (*ChatStore)(nil)

// NewChatStore returns a ChatStore on db.
func NewChatStore(db *DB) *ChatStore {
	return &ChatStore{db: db.bun, raw: db}
}

// chatMessageRow is one message; seq numbers a session's messages from 1.
type chatMessageRow struct {
	bun.BaseModel `bun:"table:chat_messages"`

	Adapter   string `bun:"adapter,pk"`
	SessionID string `bun:"session_id,pk"`
	Seq       int64  `bun:"seq,pk"`
	Target    string `bun:"target,notnull"`
	Role      string `bun:"role,notnull"`
	Content   string `bun:"content,notnull"`
	// Raw is the message's JSON (domain.ChatMessage.Raw); '' in rows
	// stored before it was kept, which replay as role and content. No bun
	// default tag: with one, the multi-row insert of AppendChat stored ''.
	Raw string `bun:"raw,notnull"`
	// Reply marks a run's stored answer (domain.ChatMessage.Reply).
	Reply     bool      `bun:"reply,notnull"`
	CreatedAt time.Time `bun:"created_at,notnull"`
}

// chatSessionRow sums up one chat session, kept beside its messages by
// AppendChat, DeleteChat and Prune: ListChats reads a page of it through
// chat_sessions_used_idx instead of grouping every message of the
// store (a second for 300,000 messages, on the store's one connection).
// A database made before the table is filled from its messages when it is
// created (createSchema).
type chatSessionRow struct {
	bun.BaseModel `bun:"table:chat_sessions"`

	Adapter   string `bun:"adapter,pk"`
	SessionID string `bun:"session_id,pk"`
	Target    string `bun:"target,notnull"` // of the newest append
	Turns     int    `bun:"turns,notnull"`  // replies stored (domain.ChatMessage.Reply)
	// LastUsed is the newest append's time: the newest message's.
	LastUsed time.Time `bun:"last_used,notnull"`
}

// fillChatSessionsSQL sums up the sessions of chat_messages into a new
// chat_sessions table.
const fillChatSessionsSQL = "INSERT INTO chat_sessions (adapter, session_id, target, turns, last_used)" +
	" SELECT m.adapter, m.session_id," +
	" (SELECT l.target FROM chat_messages AS l WHERE l.adapter = m.adapter AND l.session_id = m.session_id ORDER BY l.seq DESC LIMIT 1)," +
	" SUM(CASE WHEN m.reply THEN 1 ELSE 0 END), MAX(m.created_at)" +
	" FROM chat_messages AS m GROUP BY m.adapter, m.session_id"

// chatMessageColumns are the columns added to chat_messages after its
// first release, with their definitions, for databases created before.
var chatMessageColumns = [][2]string{
	{"raw", "TEXT NOT NULL DEFAULT ''"},
	{"reply", "BOOLEAN NOT NULL DEFAULT FALSE"},
}

// chatMessageBackfill fills added columns for the rows already there: an
// older node counted every assistant message as a turn, and cannot tell
// replies from few-shot ones now, so the counts stay as they were.
var chatMessageBackfill = map[string]string{
	"reply": "UPDATE chat_messages SET reply = TRUE WHERE role = 'assistant'",
}

// LoadChat returns the session's messages in the order they were appended,
// bounded as ports.ChatSessionStore says; an unknown session has none. A
// bounded load reads the head, then the messages' roles and sizes newest
// first a page at a time until the bound is met, or for a latest turn past
// it, until that turn's start (chattail), then the rows of the tail: the
// bodies of messages past the bound are never read.
func (s *ChatStore) LoadChat(ctx context.Context, adapter, sessionID string, maxBytes int) ([]domain.ChatMessage, error) {
	var rows []chatMessageRow
	q := s.db.NewSelect().Model(&rows).Where("adapter = ? AND session_id = ?", adapter, sessionID).Order("seq")
	if maxBytes > 0 {
		first, tail, err := s.tailStart(ctx, adapter, sessionID, maxBytes)
		if err != nil {
			return nil, err
		}
		q = q.WhereGroup(" AND ", func(q *bun.SelectQuery) *bun.SelectQuery {
			q = q.Where("seq < ?", first).WhereOr("seq >= ?", tail.From)
			if !tail.Whole() {
				q = q.WhereOr("seq >= ? AND seq < ?", tail.Open, tail.OpenEnd)
			}
			return q
		})
	}
	if err := q.Scan(ctx); err != nil {
		return nil, fmt.Errorf("select chat %s/%s: %w", adapter, sessionID, err)
	}
	msgs := make([]domain.ChatMessage, len(rows))
	for i, r := range rows {
		msgs[i] = domain.ChatMessage{Role: r.Role, Content: r.Content, Raw: r.Raw, Reply: r.Reply}
	}
	return msgs, nil
}

// tailPage is how many roles and sizes one query of tailStart reads.
const tailPage = 256

// tailStart returns where a bounded load's parts are: first, the oldest
// message after the session's head (its leading system/developer
// messages), and the tail's messages.
func (s *ChatStore) tailStart(ctx context.Context, adapter, sessionID string, maxBytes int) (first int64, tail chattail.Tail, err error) {
	err = s.db.NewSelect().Model((*chatMessageRow)(nil)).ColumnExpr("COALESCE(MIN(seq), 0)").
		Where("adapter = ? AND session_id = ? AND role NOT IN ('system', 'developer')", adapter, sessionID).
		Scan(ctx, &first)
	if err != nil {
		return 0, tail, fmt.Errorf("select chat %s/%s head: %w", adapter, sessionID, err)
	}
	if first == 0 {
		const end = 1 << 62
		return end, chattail.Tail{Open: end, OpenEnd: end, From: end}, nil // the head is all there is
	}
	w := chattail.New(maxBytes)
	before := int64(1 << 62)
	for {
		var page []struct {
			Seq  int64  `bun:"seq"`
			Role string `bun:"role"`
			Size int    `bun:"size"`
		}
		err := s.db.NewSelect().Model((*chatMessageRow)(nil)).Column("seq", "role").
			ColumnExpr("CASE WHEN raw <> '' THEN OCTET_LENGTH(raw) ELSE ? + OCTET_LENGTH(role) + OCTET_LENGTH(content) END AS size",
				chattail.Size("", "", "")).
			Where("adapter = ? AND session_id = ? AND seq >= ? AND seq < ?", adapter, sessionID, first, before).
			Order("seq DESC").Limit(tailPage).
			Scan(ctx, &page)
		if err != nil {
			return 0, tail, fmt.Errorf("select chat %s/%s sizes: %w", adapter, sessionID, err)
		}
		for _, m := range page {
			if !w.Step(m.Seq, m.Role, m.Size) {
				return first, w.Cut(first), nil
			}
		}
		if len(page) < tailPage {
			return first, w.Cut(first), nil
		}
		before = page[len(page)-1].Seq
	}
}

// AppendChat adds msgs after the session's last message, creating the
// session if needed. Appending no messages changes nothing.
func (s *ChatStore) AppendChat(ctx context.Context, adapter, target, sessionID string, msgs []domain.ChatMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	now := time.Now().UTC()
	return s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		var last int64
		err := tx.NewSelect().Model((*chatMessageRow)(nil)).
			ColumnExpr("COALESCE(MAX(seq), 0)").
			Where("adapter = ? AND session_id = ?", adapter, sessionID).
			Scan(ctx, &last)
		if err != nil {
			return fmt.Errorf("select chat %s/%s seq: %w", adapter, sessionID, err)
		}
		rows := make([]chatMessageRow, len(msgs))
		for i, m := range msgs {
			// A NUL in a message's text failed its turn's insert after the
			// model had answered; the JSON a turn replays (Raw) escapes it
			// and is kept as it is.
			rows[i] = chatMessageRow{
				Adapter: adapter, SessionID: sessionID, Seq: last + int64(i) + 1,
				Target: target, Role: sqltext.NoNUL(m.Role), Content: sqltext.NoNUL(m.Content), Raw: m.Raw, Reply: m.Reply, CreatedAt: now,
			}
		}
		if _, err := tx.NewInsert().Model(&rows).Exec(ctx); err != nil {
			return fmt.Errorf("insert chat %s/%s: %w", adapter, sessionID, err)
		}
		sum := &chatSessionRow{Adapter: adapter, SessionID: sessionID, Target: target, LastUsed: now}
		for _, m := range msgs {
			if m.Reply {
				sum.Turns++
			}
		}
		_, err = tx.NewInsert().Model(sum).
			On("CONFLICT (adapter, session_id) DO UPDATE").
			Set("target = EXCLUDED.target").
			Set("turns = ?TableAlias.turns + EXCLUDED.turns").
			Set("last_used = EXCLUDED.last_used").
			Exec(ctx)
		if err != nil {
			return fmt.Errorf("update chat %s/%s summary: %w", adapter, sessionID, err)
		}
		return nil
	})
}

// DeleteChat removes the session's history and reports whether there was
// any; deleting an unknown session is not an error.
func (s *ChatStore) DeleteChat(ctx context.Context, adapter, sessionID string) (found bool, err error) {
	err = s.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		found = false
		for _, model := range []any{(*chatMessageRow)(nil), (*chatSessionRow)(nil)} {
			res, err := tx.NewDelete().Model(model).Where("adapter = ? AND session_id = ?", adapter, sessionID).Exec(ctx)
			if err != nil {
				return fmt.Errorf("delete chat %s/%s: %w", adapter, sessionID, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return fmt.Errorf("delete chat %s/%s: %w", adapter, sessionID, err)
			}
			found = found || n > 0
		}
		return nil
	})
	return found && err == nil, err
}

// ListChats returns the page q asks for of the chat sessions of adapter
// ("" means every adapter), newest first (domain.SessionQuery), from
// chat_sessions. Target is the one given with the most recent append;
// Turns counts the replies of completed runs.
func (s *ChatStore) ListChats(ctx context.Context, adapter string, q domain.SessionQuery) ([]domain.SessionInfo, error) {
	var rows []chatSessionRow
	sel := s.raw.sessionPage(s.db.NewSelect().Model(&rows), "last_used", adapter, q)
	if err := sel.Scan(ctx); err != nil {
		return nil, fmt.Errorf("select chats: %w", err)
	}
	out := make([]domain.SessionInfo, len(rows))
	for i, r := range rows {
		out[i] = domain.SessionInfo{
			Adapter: r.Adapter, Target: r.Target, SessionID: r.SessionID, Turns: r.Turns, LastUsed: r.LastUsed.UTC(),
		}
	}
	return out, nil
}

// sessionPage narrows sel, a select of a table keyed by adapter and
// session_id with the time column used, to the page q asks for of
// adapter's sessions ("" means every adapter): listing order
// (domain.SessionKey) is used DESC, adapter DESC, session_id DESC. For one
// adapter, as every adapter lists its own, an index on (adapter, used,
// session_id) serves it backwards from the cursor, so a page reads only
// its rows; every adapter's at once (tests, tools) is sorted whole.
func (db *DB) sessionPage(sel *bun.SelectQuery, used, adapter string, q domain.SessionQuery) *bun.SelectQuery {
	sel = sel.OrderExpr(used + " DESC, adapter DESC, session_id DESC").Limit(int64(q.PageLimit()))
	a := q.After
	if adapter == "" {
		if a != nil {
			sel = sel.Where("("+used+", adapter, session_id) < (?, ?, ?)", db.timeArg(a.LastUsed), a.Adapter, a.SessionID)
		}
		return sel
	}
	sel = sel.Where("adapter = ?", adapter)
	switch {
	case a == nil:
	case a.Adapter == adapter:
		sel = sel.Where("("+used+", session_id) < (?, ?)", db.timeArg(a.LastUsed), a.SessionID)
	case a.Adapter > adapter: // adapter's sessions used at the cursor's time come after it
		sel = sel.Where(used+" <= ?", db.timeArg(a.LastUsed))
	default:
		sel = sel.Where(used+" < ?", db.timeArg(a.LastUsed))
	}
	return sel
}
