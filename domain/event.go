package domain

import "time"

// EventType is the kind of a run event.
type EventType string

const (
	EventStart          EventType = "start"
	EventDelta          EventType = "delta"
	EventReasoningDelta EventType = "reasoning_delta"
	EventMetadata       EventType = "metadata"
	EventComplete       EventType = "complete"
	EventError          EventType = "error"
	EventCancelled      EventType = "cancelled"
)

// Terminal reports whether an event of this type ends its run.
func (t EventType) Terminal() bool {
	return t == EventComplete || t == EventError || t == EventCancelled
}

// Valid reports whether t is one of the known event types.
func (t EventType) Valid() bool {
	switch t {
	case EventStart, EventDelta, EventReasoningDelta, EventMetadata, EventComplete, EventError, EventCancelled:
		return true
	}
	return false
}

// Usage is what a run or a tunnel consumed, as far as the provider reported it.
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
	TotalTokens      int64
	CostUSD          float64
	DurationMS       int64
	StopReason       string
	Model            string
}

// Total returns TotalTokens, or the sum of prompt and completion tokens when
// the provider did not report a total (saturating: see AddTokens).
func (u Usage) Total() int64 {
	if u.TotalTokens > 0 {
		return u.TotalTokens
	}
	return AddTokens(u.PromptTokens, u.CompletionTokens)
}

// ErrorInfo is the code and message carried by an error event.
type ErrorInfo struct {
	Code    string
	Message string
}

// RunEvent is one step of a run's stream. Seq increases by one per event of a
// run, starting at 1; the node assigns it.
type RunEvent struct {
	RunID    string
	Seq      uint64
	Type     EventType
	Text     string
	Usage    *Usage
	Error    *ErrorInfo
	Time     time.Time
	Metadata []byte // JSON object, for EventMetadata and structured extras
}

// ErrorEvent builds an error event for runID from err.
func ErrorEvent(runID string, err error) RunEvent {
	return RunEvent{RunID: runID, Type: EventError, Error: &ErrorInfo{Code: CodeOf(err), Message: MessageOf(err)}}
}
