package domain

import "time"

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
