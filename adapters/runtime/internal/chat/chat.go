// Package chat holds what the ollama and openai runtime adapters share about
// conversations: turning a run's input into chat messages, run options, the
// model choice, and sessions kept in a ports.ChatSessionStore.
//
// A run's input is either plain text, sent as one user message, or a JSON
// object with a "messages" array, whose entries are sent upstream exactly as
// given (so images, tool calls and the like pass through). In a session the
// new messages follow the stored history. A session stores each message's
// JSON as given and replays it exactly in later turns (tool_call_id,
// tool_name, images and all), and stores the reply with the tool calls the
// model made (and, if the adapter gives it, the reasoning that led to them:
// Reply.Reasoning), so a tool-using conversation stays valid turn after
// turn. It
// also keeps each message's text (for a content array, the text parts
// joined) for reading the history. At most the adapter's max_history_bytes
// (DefaultMaxHistoryBytes unless configured) of history is replayed (see
// trim).
package chat

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"iop/domain"
	"iop/ports"
)

// Turn is the messages one run adds to a conversation.
type Turn struct {
	Send   []json.RawMessage    // as sent upstream
	Record []domain.ChatMessage // as stored in the session
}

// ParseInput reads a run's input as described in the package doc. Empty
// input, an empty "messages" array, or entries without a string "role" are
// invalid_request errors.
func ParseInput(input []byte) (Turn, error) {
	trimmed := bytes.TrimSpace(input)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		var obj map[string]json.RawMessage
		if json.Unmarshal(trimmed, &obj) == nil {
			if raw, ok := obj["messages"]; ok {
				return parseMessages(raw)
			}
		}
	}
	if len(trimmed) == 0 {
		return Turn{}, domain.Errorf(domain.CodeInvalidRequest, "the run input is empty: send the user message as text, or {\"messages\":[…]}")
	}
	text := string(input)
	msg, _ := json.Marshal(wireMessage{Role: "user", Content: text})
	return Turn{Send: []json.RawMessage{msg}, Record: []domain.ChatMessage{{Role: "user", Content: text, Raw: string(msg)}}}, nil
}

type wireMessage struct {
	Role      string            `json:"role"`
	Content   string            `json:"content"`
	ToolCalls []json.RawMessage `json:"tool_calls,omitempty"`
}

func parseMessages(raw json.RawMessage) (Turn, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return Turn{}, domain.Errorf(domain.CodeInvalidRequest, "input \"messages\" must be an array of messages: %v", err)
	}
	if len(list) == 0 {
		return Turn{}, domain.Errorf(domain.CodeInvalidRequest, "input \"messages\" is empty")
	}
	var t Turn
	for i, m := range list {
		var head struct {
			Role    *string         `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(m, &head); err != nil || head.Role == nil || *head.Role == "" {
			return Turn{}, domain.Errorf(domain.CodeInvalidRequest, "input message #%d needs a string \"role\"", i+1)
		}
		t.Send = append(t.Send, m)
		// Compacted, so what is stored (and counted against the history
		// bound) carries no indentation; the message itself is unchanged.
		var compact bytes.Buffer
		_ = json.Compact(&compact, m) // m was just decoded: valid JSON
		t.Record = append(t.Record, domain.ChatMessage{Role: *head.Role, Content: contentText(head.Content), Raw: compact.String()})
	}
	return t, nil
}

// contentText returns a message content as text: a string as is, the text
// parts of an array of content parts joined, anything else as its JSON.
func contentText(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "text" {
				b.WriteString(p.Text)
			}
		}
		return b.String()
	}
	return string(raw)
}

// ParseOptions reads a run's options, which must be a JSON object (or
// absent). Errors are invalid_request.
func ParseOptions(raw []byte) (map[string]json.RawMessage, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return map[string]json.RawMessage{}, nil
	}
	var opts map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &opts); err != nil || opts == nil {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "run options must be a JSON object")
	}
	return opts, nil
}

// Model picks the model of a run: its target, else the adapter's first
// configured model. Neither is an invalid_request error.
func Model(adapter, target string, models []string) (string, error) {
	if target != "" {
		return target, nil
	}
	if len(models) > 0 && models[0] != "" {
		return models[0], nil
	}
	return "", domain.Errorf(domain.CodeInvalidRequest, "adapter %q: the run names no target (model) and the adapter has no models configured", adapter)
}

// Sessions keeps the conversations of one adapter instance.
type Sessions struct {
	store      ports.ChatSessionStore
	adapter    string
	maxHistory int
}

// NewSessions keeps sessions for adapter in store; a nil store means the
// adapter keeps none. A turn replays at most maxHistoryBytes of a session's
// history; 0 means DefaultMaxHistoryBytes. The caller checks the bound
// (domain.CheckMaxHistoryBytes).
func NewSessions(store ports.ChatSessionStore, adapter string, maxHistoryBytes int) *Sessions {
	if maxHistoryBytes <= 0 {
		maxHistoryBytes = DefaultMaxHistoryBytes
	}
	return &Sessions{store: store, adapter: adapter, maxHistory: maxHistoryBytes}
}

// Enabled reports whether there is a store to keep sessions in.
func (s *Sessions) Enabled() bool { return s.store != nil }

// Messages returns what to send for turn t: the stored history of sessionID
// (none when sessionID is empty) followed by the turn's own messages.
func (s *Sessions) Messages(ctx context.Context, sessionID string, t Turn) ([]json.RawMessage, error) {
	if sessionID == "" {
		return t.Send, nil
	}
	if s.store == nil {
		return nil, domain.Errorf(domain.CodeSessionUnsupported, "adapter %q has no session store", s.adapter)
	}
	history, err := s.store.LoadChat(ctx, s.adapter, sessionID, s.maxHistory)
	if err != nil {
		return nil, fmt.Errorf("load session %q: %w", sessionID, err)
	}
	out := make([]json.RawMessage, 0, len(history)+len(t.Send))
	for _, m := range history {
		out = append(out, wire(m))
	}
	return append(trim(history, out, s.maxHistory), t.Send...), nil
}

// DefaultMaxHistoryBytes bounds the stored history a turn replays (the JSON
// of its messages) unless the adapter's max_history_bytes says otherwise: a
// session that outgrew it keeps going on its latest turns instead of failing
// every turn once past the model's context.
const DefaultMaxHistoryBytes = domain.DefaultMaxHistoryBytes

// MaxToolCallBytes bounds the tool calls a session run's reply may collect
// for the history (Reply.ToolCalls).
const MaxToolCallBytes = 1 << 20

// trim drops whole turns, oldest first, from a session's history (msgs, as
// wire holds them) until what follows its leading system or developer
// messages fits in max bytes: those are always kept, besides the bound (as
// the stores' bounded load counts). A turn starts at a user message, so an
// assistant message's tool calls and the tool messages that answer them go
// together; the latest turn is always kept, which the new messages may
// answer (tool results).
//
// A latest turn that alone is past the bound — an agent's tool loop driven
// through runs: one user message, then turn after turn of tool results and
// the model's next calls — loses its oldest tool-call groups as well: a
// group runs from an assistant message to the next one, so it holds the
// calls and every tool message answering them (a conversation the provider
// took answers an assistant message's calls before the next one). The
// turn's opening (its user message, up to its first assistant message) is
// kept, so what is sent still starts with the user's request, and so is its
// newest group, whose calls the new messages may answer.
//
// A bounded load (chattail) returns at least what trim keeps of the whole
// history, so trim of it keeps the same.
func trim(history []domain.ChatMessage, msgs []json.RawMessage, max int) []json.RawMessage {
	head := 0 // the leading instructions: system (or, for newer OpenAI models, developer) messages
	for head < len(history) && (history[head].Role == "system" || history[head].Role == "developer") {
		head++
	}
	total := 0 // of the history after them: they are sent besides the bound
	for _, m := range msgs[head:] {
		total += len(m)
	}
	if total <= max {
		return msgs
	}
	last := head // where the latest turn starts
	for i := head + 1; i < len(history); i++ {
		if history[i].Role == "user" {
			last = i
		}
	}
	from := head // the first message kept after the head
	for from < last && total > max {
		next := from + 1
		for next < last && history[next].Role != "user" {
			next++
		}
		for _, m := range msgs[from:next] {
			total -= len(m)
		}
		from = next
	}
	if total <= max || from != last || last == len(history) || history[last].Role != "user" {
		return append(msgs[:head:head], msgs[from:]...)
	}
	// The latest turn alone is past the bound: drop its oldest groups.
	open := last + 1 // where its first group starts
	for open < len(history) && history[open].Role != "assistant" {
		open++
	}
	group := open
	for group < len(history) && total > max {
		next := group + 1
		for next < len(history) && history[next].Role != "assistant" {
			next++
		}
		if next == len(history) {
			break // the newest group stays
		}
		for _, m := range msgs[group:next] {
			total -= len(m)
		}
		group = next
	}
	out := append(msgs[:head:head], msgs[last:open]...)
	return append(out, msgs[group:]...)
}

// wire returns a stored message as sent upstream: its JSON as given, or,
// for a message stored before that was kept, its role and text.
func wire(m domain.ChatMessage) json.RawMessage {
	if m.Raw != "" {
		return json.RawMessage(m.Raw)
	}
	b, _ := json.Marshal(wireMessage{Role: m.Role, Content: m.Content}) // strings only: cannot fail
	return b
}

// Reply is the assistant's answer to a turn.
type Reply struct {
	Content string
	// ToolCalls are the complete tool calls the model made, each a JSON
	// object as the upstream API expects them back in the history.
	ToolCalls []json.RawMessage
	// Reasoning, when ReasoningField names a field, is stored in it with
	// the reply: some servers refuse an assistant message with tool calls
	// that lacks the reasoning which led to them (DeepSeek's and Kimi's
	// reasoning_content).
	Reasoning, ReasoningField string
}

// Commit appends a completed turn to sessionID: the turn's messages, then
// the assistant's reply with its tool calls, which the caller's tool
// messages of the next turn answer. It does nothing for runs outside a
// session. It first makes the run's end final through sink (a
// ports.Finisher) and writes nothing when the run is being cancelled
// meanwhile: that error is returned, and the run ends cancelled without
// the turn in its history.
func (s *Sessions) Commit(ctx context.Context, sink ports.EventSink, target, sessionID string, t Turn, reply Reply) error {
	if sessionID == "" || s.store == nil {
		return nil
	}
	if f, ok := sink.(ports.Finisher); ok {
		if err := f.Finish(); err != nil {
			return err
		}
	}
	raw, err := json.Marshal(wireMessage{Role: "assistant", Content: reply.Content, ToolCalls: reply.ToolCalls})
	if err != nil {
		return fmt.Errorf("encode session %q reply: %w", sessionID, err)
	}
	if reply.ReasoningField != "" && reply.Reasoning != "" {
		field, _ := json.Marshal(map[string]string{reply.ReasoningField: reply.Reasoning}) // strings only: cannot fail
		raw = AppendFields(raw, field)
	}
	msgs := append(append([]domain.ChatMessage(nil), t.Record...), domain.ChatMessage{Role: "assistant", Content: reply.Content, Raw: string(raw), Reply: true})
	if err := s.store.AppendChat(ctx, s.adapter, target, sessionID, msgs); err != nil {
		return fmt.Errorf("save session %q: %w", sessionID, err)
	}
	return nil
}

// Terminate forgets sessionID; a session with no history is
// session_not_found.
func (s *Sessions) Terminate(ctx context.Context, sessionID string) error {
	if s.store == nil {
		return domain.Errorf(domain.CodeSessionUnsupported, "adapter %q keeps no sessions", s.adapter)
	}
	found, err := s.store.DeleteChat(ctx, s.adapter, sessionID)
	if err != nil {
		return err
	}
	if !found {
		return domain.Errorf(domain.CodeSessionNotFound, "adapter %q has no session %q", s.adapter, sessionID)
	}
	return nil
}

// List returns the page q asks for of the adapter's sessions.
func (s *Sessions) List(ctx context.Context, q domain.SessionQuery) ([]domain.SessionInfo, error) {
	if s.store == nil {
		return []domain.SessionInfo{}, nil
	}
	return s.store.ListChats(ctx, s.adapter, q)
}

// Prepared is a chat turn ready to send.
type Prepared struct {
	Model    string
	Options  map[string]json.RawMessage // the run's options, not yet filtered
	Turn     Turn
	Messages []json.RawMessage // the session's history, then the turn
}

// Check reads a run's model, options and input as Prepare does, without
// loading its session (Messages stays nil): what an adapter's Admit checks
// so that such a run is refused before it starts. Bad input, options or a
// missing model are invalid_request errors.
func (s *Sessions) Check(req domain.RunRequest, models []string) (Prepared, error) {
	var p Prepared
	var err error
	if p.Model, err = Model(s.adapter, req.Target, models); err != nil {
		return Prepared{}, err
	}
	if p.Options, err = ParseOptions(req.Options); err != nil {
		return Prepared{}, err
	}
	if p.Turn, err = ParseInput(req.Input); err != nil {
		return Prepared{}, err
	}
	return p, nil
}

// Prepare reads a run's model, options and input (Check) and loads its
// session's history. Bad input, options or a missing model are
// invalid_request errors.
func (s *Sessions) Prepare(ctx context.Context, req domain.RunRequest, models []string) (Prepared, error) {
	p, err := s.Check(req, models)
	if err != nil {
		return Prepared{}, err
	}
	if p.Messages, err = s.Messages(ctx, req.SessionID, p.Turn); err != nil {
		return Prepared{}, err
	}
	return p, nil
}

// AppendFields returns JSON object obj with the fields of JSON object more
// after its own. Both are encoding/json's (nothing after the closing brace);
// obj's array may be reused.
func AppendFields(obj, more []byte) []byte {
	switch {
	case len(more) <= 2: // {}
		return obj
	case len(obj) <= 2:
		return append(obj[:0:0], more...)
	}
	return append(append(obj[:len(obj)-1], ','), more[1:]...)
}
