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

// ChatMessage is one message of a chat session's history.
type ChatMessage struct {
	Role    string
	Content string
}
