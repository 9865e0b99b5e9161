package memory

import (
	"context"
	"slices"
	"sync"
	"time"

	"iop/adapters/store/internal/chattail"
	"iop/domain"
	"iop/ports"
)

// sessionKey identifies a session within the node.
type sessionKey struct{ adapter, sessionID string }

type chatSession struct {
	target   string
	msgs     []domain.ChatMessage
	turns    int
	lastUsed time.Time
}

// ChatStore is a map-backed ports.ChatSessionStore.
type ChatStore struct {
	mu       sync.Mutex
	sessions map[sessionKey]*chatSession
}

var _ ports.ChatSessionStore = (*ChatStore)(nil)

// NewChatStore returns an empty ChatStore.
func NewChatStore() *ChatStore {
	return &ChatStore{sessions: map[sessionKey]*chatSession{}}
}

// LoadChat returns a copy of the session's messages in the order they were
// appended, bounded as ports.ChatSessionStore says; an unknown session has
// none.
func (s *ChatStore) LoadChat(_ context.Context, adapter, sessionID string, maxBytes int) ([]domain.ChatMessage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[sessionKey{adapter, sessionID}]
	if sess == nil {
		return []domain.ChatMessage{}, nil
	}
	msgs := sess.msgs
	if maxBytes <= 0 {
		return slices.Clone(msgs), nil
	}
	head := 0
	for head < len(msgs) && chattail.Head(msgs[head].Role) {
		head++
	}
	w := chattail.New(maxBytes)
	for i := len(msgs) - 1; i >= head; i-- {
		m := msgs[i]
		if !w.Step(int64(i), m.Role, chattail.Size(m.Role, m.Content, m.Raw)) {
			break
		}
	}
	tail := w.Cut(int64(head))
	out := append(slices.Clone(msgs[:head]), msgs[tail.Open:tail.OpenEnd]...)
	return append(out, msgs[tail.From:]...), nil
}

// AppendChat adds msgs after the session's last message, creating the
// session if needed. Appending no messages changes nothing.
func (s *ChatStore) AppendChat(_ context.Context, adapter, target, sessionID string, msgs []domain.ChatMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	now := storedTime(time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sessionKey{adapter, sessionID}
	sess := s.sessions[k]
	if sess == nil {
		sess = &chatSession{}
		s.sessions[k] = sess
	}
	sess.target, sess.lastUsed = target, now
	sess.msgs = append(sess.msgs, msgs...)
	for _, m := range msgs {
		if m.Reply {
			sess.turns++
		}
	}
	return nil
}

// DeleteChat removes the session's history and reports whether there was
// any; deleting an unknown session is not an error.
func (s *ChatStore) DeleteChat(_ context.Context, adapter, sessionID string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sessionKey{adapter, sessionID}
	_, found := s.sessions[k]
	delete(s.sessions, k)
	return found, nil
}

// ListChats returns the page q asks for of the chat sessions of adapter
// ("" means every adapter), newest first (domain.SessionQuery). Target is
// the one given with the most recent append; Turns counts the replies of
// completed runs.
func (s *ChatStore) ListChats(_ context.Context, adapter string, q domain.SessionQuery) ([]domain.SessionInfo, error) {
	s.mu.Lock()
	out := []domain.SessionInfo{}
	for k, sess := range s.sessions {
		if adapter == "" || k.adapter == adapter {
			out = append(out, domain.SessionInfo{
				Adapter: k.adapter, Target: sess.target, SessionID: k.sessionID, Turns: sess.turns, LastUsed: sess.lastUsed,
			})
		}
	}
	s.mu.Unlock()
	return domain.PageSessions(out, q), nil
}
