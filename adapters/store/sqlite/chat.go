package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"iop/adapters/store/internal/chattail"
	"iop/domain"
	"iop/ports"
)

// ChatStore keeps chat session histories in SQLite.
type ChatStore struct {
	db *bun.DB
}

var _ ports.ChatSessionStore = (*ChatStore)(nil)

// NewChatStore returns a ChatStore on db.
func NewChatStore(db *DB) *ChatStore {
	return &ChatStore{db: db.bun}
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
			rows[i] = chatMessageRow{
				Adapter: adapter, SessionID: sessionID, Seq: last + int64(i) + 1,
				Target: target, Role: m.Role, Content: m.Content, Raw: m.Raw, Reply: m.Reply, CreatedAt: now,
			}
		}
		if _, err := tx.NewInsert().Model(&rows).Exec(ctx); err != nil {
			return fmt.Errorf("insert chat %s/%s: %w", adapter, sessionID, err)
		}
		return nil
	})
}

// DeleteChat removes the session's history; deleting an unknown session is not an error.
func (s *ChatStore) DeleteChat(ctx context.Context, adapter, sessionID string) error {
	_, err := s.db.NewDelete().Model((*chatMessageRow)(nil)).
		Where("adapter = ? AND session_id = ?", adapter, sessionID).
		Exec(ctx)
	if err != nil {
		return fmt.Errorf("delete chat %s/%s: %w", adapter, sessionID, err)
	}
	return nil
}

// chatSessionRow is one row of the ListChats aggregate.
type chatSessionRow struct {
	Adapter   string    `bun:"adapter"`
	SessionID string    `bun:"session_id"`
	Target    string    `bun:"target"`
	Turns     int       `bun:"turns"`
	LastUsed  time.Time `bun:"last_used"`
}

// ListChats describes the chat sessions of adapter ("" means every adapter),
// ordered by adapter and session id. Target is the one given with the most
// recent append; Turns counts the replies of completed runs.
func (s *ChatStore) ListChats(ctx context.Context, adapter string) ([]domain.SessionInfo, error) {
	var rows []chatSessionRow
	q := s.db.NewSelect().TableExpr("chat_messages AS m").
		Column("m.adapter", "m.session_id").
		ColumnExpr("(SELECT l.target FROM chat_messages AS l"+
			" WHERE l.adapter = m.adapter AND l.session_id = m.session_id ORDER BY l.seq DESC LIMIT 1) AS target").
		ColumnExpr("SUM(CASE WHEN m.reply THEN 1 ELSE 0 END) AS turns").
		ColumnExpr("MAX(m.created_at) AS last_used").
		Group("m.adapter", "m.session_id").
		Order("m.adapter", "m.session_id")
	if adapter != "" {
		q = q.Where("m.adapter = ?", adapter)
	}
	if err := q.Scan(ctx, &rows); err != nil {
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
