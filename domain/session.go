package domain

import (
	"cmp"
	"slices"
	"time"
)

// SessionInfo describes one logical session kept by a runtime adapter.
type SessionInfo struct {
	Adapter   string
	Target    string
	SessionID string
	Turns     int
	LastUsed  time.Time
	// AgentSessionID is the CLI agent's own session/thread id, when it has one.
	AgentSessionID string
}

// SessionKey is where a session stands in a session listing: newest
// first by LastUsed, ties broken by adapter, then session id, both
// descending (as runs are listed: newest first, ties by id descending).
type SessionKey struct {
	LastUsed  time.Time
	Adapter   string
	SessionID string
}

// Key is s's place in a session listing.
func (s SessionInfo) Key() SessionKey {
	return SessionKey{LastUsed: s.LastUsed, Adapter: s.Adapter, SessionID: s.SessionID}
}

// Before reports whether k comes before o in a session listing.
func (k SessionKey) Before(o SessionKey) bool { return k.Compare(o) < 0 }

// Compare orders session keys as a listing does (Before): negative when k
// comes before o.
func (k SessionKey) Compare(o SessionKey) int {
	if c := o.LastUsed.Compare(k.LastUsed); c != 0 {
		return c
	}
	if c := cmp.Compare(o.Adapter, k.Adapter); c != 0 {
		return c
	}
	return cmp.Compare(o.SessionID, k.SessionID)
}

// Page sizes of a session listing (the session_list command).
const (
	DefaultSessionPage = 100
	MaxSessionPage     = 1000
)

// SessionQuery asks a store or an adapter for one page of its sessions, in
// listing order (SessionKey): at most Limit of them, those after After
// when it is set (see PageLimit).
type SessionQuery struct {
	Limit int
	After *SessionKey
}

// PageLimit is how many sessions q asks for: Limit, MaxSessionPage when it
// is not positive, and at most one more than MaxSessionPage (what
// session_list asks each adapter for, to tell whether more follow a page).
func (q SessionQuery) PageLimit() int {
	if q.Limit <= 0 {
		return MaxSessionPage
	}
	return min(q.Limit, MaxSessionPage+1)
}

// PageSessions returns the page q asks for of all: in listing order, those
// after q.After, at most q.PageLimit(). all is reordered.
func PageSessions(all []SessionInfo, q SessionQuery) []SessionInfo {
	slices.SortFunc(all, func(a, b SessionInfo) int { return a.Key().Compare(b.Key()) })
	if q.After != nil {
		after := *q.After
		i, _ := slices.BinarySearchFunc(all, after, func(s SessionInfo, k SessionKey) int {
			if k.Before(s.Key()) { // s comes after k
				return 1
			}
			return -1
		})
		all = all[i:]
	}
	return all[:min(len(all), q.PageLimit())]
}

// AgentSession is what a node keeps about one session of a CLI agent
// (claude-code, codex, gemini).
type AgentSession struct {
	AgentID string // the agent's own session or thread id
	Turns   int    // turns the agent completed in the session
	// Totals is the agent's own running token count for its session as it
	// last reported it. Codex reports a thread's cumulative usage at the
	// end of every turn, so a turn's usage is the difference.
	Totals AgentTotals
}

// AgentTotals are running token counts.
type AgentTotals struct {
	Input  int64 // prompt tokens, cached ones included
	Cached int64
	Output int64
}

// ChatMessage is one message of a chat session's history.
type ChatMessage struct {
	Role    string
	Content string // the text content, for reading the history
	// Raw is the message's JSON as sent upstream and replayed in later
	// turns, so tool calls, tool_call_id and the like survive. Empty for
	// messages stored before it was kept: those replay as role and Content.
	Raw string
	// Reply marks an assistant message a completed run stored as its
	// answer; session_list counts these as turns (not few-shot assistant
	// messages of an input).
	Reply bool
}
