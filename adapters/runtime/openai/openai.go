// Package openai is the runtime adapter for OpenAI-compatible chat
// completion servers: vLLM, llama.cpp, LM Studio, OpenRouter, OpenAI itself,
// Ollama's /v1.
//
// A run is one POST {base_url}{path_prefix, default /v1}/chat/completions
// with "stream": true and "stream_options": {"include_usage": true}. The
// model is the run's target, else the adapter's first configured model. The
// input is the user message as text, or {"messages":[…]} (see package chat).
// The run options, a JSON object, are merged into the request body
// (temperature, max_tokens, tools, …), except "model", "messages", "stream"
// and "stream_options", which the adapter sets (keys equal to these in any
// case, such as "Model", are dropped too); "n" (in any case), if a number,
// must be 1
// (a run carries one answer), else the run is refused with invalid_request. When api_key_env is set and
// that environment variable is not empty, its value is sent as
// "Authorization: Bearer …"; it appears nowhere else.
//
// The answer is server-sent events. Lines starting with ":" are comments and
// are ignored, as are "id:" and "retry:" lines, and "event:" lines but for
// an event named "error", which fails the run with the message its data
// carries; the "data:" lines of an event are joined and decoded as a chunk. delta.reasoning, else
// delta.reasoning_content (some servers send the same text in both),
// becomes a reasoning_delta event, delta.content a delta event (as an
// array of parts, as Mistral's reasoning models send it, its "text" parts
// are the delta and its "thinking" parts reasoning),
// delta.tool_calls a metadata event {"tool_calls":[…]} (the fragments as
// the server sent them). "data: [DONE]" ends the stream with
// the complete event, whose usage comes from the last chunk carrying
// "usage" (prompt, completion and total tokens), the last finish_reason, the
// model the server reported, and the wall-clock duration of the request. A
// stream that ends without [DONE] still completes if a finish_reason was
// seen, and is a provider_error otherwise (an answer that holds no event
// stream at all, such as a proxy's HTML login page, names its content type
// and begins with its first bytes). Each field of a chunk is read on
// its own, so one of an unexpected type loses nothing else; token counts
// may be floats or strings. A server that ignores "stream"
// and answers with one JSON completion is read the same way; JSON of
// another shape (no "choices" array and no "error") is a provider_error
// quoting its start.
//
// Errors carry the provider's own message: a data chunk with an "error"
// object (sent mid-stream with status 200), an "error: {…}" line (how
// llama.cpp's server reports a failure mid-stream, before its [DONE]) or a
// non-2xx response become an
// error event with code model_not_found (HTTP 404, error code
// "model_not_found" or a message saying "not found"), else provider_error
// (including 429, and a 404 with no error object that names no model:
// base_url or path_prefix reaches no such endpoint); a failure to
// connect is provider_unreachable; a configured timeout that expires is an
// error event with code timeout. Cancelling ctx aborts the request, which
// closes the connection; Execute then returns ctx.Err().
//
// Sessions behave as for the ollama adapter: history is sent before the
// run's messages, and a completed run appends them (as given) and the reply:
// the concatenated content with the tool calls of the stream, whose
// delta.tool_calls fragments are merged by index (id, type and function
// name from the first fragment, the arguments concatenated, those a server
// sends as JSON rather than as a string of it taken as their text; a
// call's other fields, such as Gemini's "extra_content" with its thought
// signature, kept as the server first sent each; a fragment with
// the index of a call that has another id starts a new call; at most 128
// calls and 1 MiB in all, else provider_error; a run without a session
// keeps no calls and has no such bound). A reply with tool calls is stored
// with the reasoning the server streamed as reasoning_content (up to 1 MiB
// of it): DeepSeek's and Kimi's thinking models refuse a later request
// whose tool-calling assistant message lacks it. Reasoning streamed as
// reasoning (which Groq refuses back) and a reply without tool calls are
// stored without.
package openai

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"iop/adapters/runtime/internal/chat"
	"iop/adapters/runtime/internal/lines"
	"iop/adapters/runtime/internal/runlimit"
	"iop/adapters/runtime/internal/upstream"
	"iop/domain"
	"iop/ports"
)

// reserved are the body keys run options cannot override, in any case:
// a server decoding with Go's encoding/json matches keys case-insensitively
// (the last match wins), so "Model" or "MESSAGES" would override them too.
var reserved = []string{"model", "messages", "stream", "stream_options"}

// dropReserved deletes from opts every key that is a reserved key in any case.
func dropReserved(opts map[string]json.RawMessage) {
	for k := range opts {
		if slices.ContainsFunc(reserved, func(r string) bool { return strings.EqualFold(k, r) }) {
			delete(opts, k)
		}
	}
}

// checkChoices applies oneChoice to every key that is "n" in any case ("N"
// reaches a case-insensitive server as n).
func checkChoices(opts map[string]json.RawMessage) error {
	for k, v := range opts {
		if strings.EqualFold(k, "n") {
			if err := oneChoice(k, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// Adapter runs chat completions against one server. It is safe for
// concurrent use.
type Adapter struct {
	name           string
	url            string
	apiKeyEnv      string
	models         []string
	maxConcurrency int
	timeout        time.Duration
	hc             *http.Client
	sessions       *chat.Sessions
}

var (
	_ ports.RuntimeAdapter    = (*Adapter)(nil)
	_ ports.RunAdmitter       = (*Adapter)(nil)
	_ ports.SessionTerminator = (*Adapter)(nil)
	_ ports.SessionLister     = (*Adapter)(nil)
	_ io.Closer               = (*Adapter)(nil)
)

// Option changes how New builds the adapter.
type Option func(*Adapter)

// WithHTTPClient makes the adapter use hc instead of a client of its own.
func WithHTTPClient(hc *http.Client) Option {
	return func(a *Adapter) { a.hc = hc }
}

// New builds an openai adapter. cfg.BaseURL is the server root (for example
// http://127.0.0.1:8000); cfg.PathPrefix replaces "/v1" ("/" for none).
// chats keeps sessions (nil: the adapter keeps none). Errors are
// domain.ErrConfig.
func New(cfg domain.AdapterConfig, chats ports.ChatSessionStore, opts ...Option) (*Adapter, error) {
	u, err := url.Parse(cfg.BaseURL)
	if cfg.BaseURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, domain.Errorf(domain.CodeConfigError, "openai adapter %q: base_url %q must be an http(s) URL such as http://127.0.0.1:8000", cfg.Name, domain.RedactURL(cfg.BaseURL))
	}
	if cfg.MaxConcurrency < 0 || cfg.Timeout < 0 {
		return nil, domain.Errorf(domain.CodeConfigError, "openai adapter %q: max_concurrency and timeout must not be negative", cfg.Name)
	}
	if err := domain.CheckMaxHistoryBytes(cfg.Name, cfg.MaxHistoryBytes); err != nil {
		return nil, err
	}
	prefix := cmp.Or(cfg.PathPrefix, "/v1")
	prefix = "/" + strings.Trim(prefix, "/")
	if prefix == "/" {
		prefix = ""
	}
	a := &Adapter{
		name:           cfg.Name,
		url:            strings.TrimSuffix(cfg.BaseURL, "/") + prefix + "/chat/completions",
		apiKeyEnv:      cfg.APIKeyEnv,
		models:         append([]string(nil), cfg.Models...),
		maxConcurrency: cmp.Or(cfg.MaxConcurrency, domain.DefaultMaxConcurrency),
		timeout:        cfg.Timeout,
		sessions:       chat.NewSessions(chats, cfg.Name, cfg.MaxHistoryBytes),
	}
	for _, o := range opts {
		o(a)
	}
	if a.hc == nil {
		a.hc = upstream.NewClient()
	}
	return a, nil
}

// Capabilities reports the configured concurrency and sessions (when a
// store was given). The adapter serves no node commands.
func (a *Adapter) Capabilities() domain.Capabilities {
	return domain.Capabilities{MaxConcurrency: a.maxConcurrency, Sessions: a.sessions.Enabled()}
}

// Close drops idle connections to the server.
func (a *Adapter) Close() error {
	a.hc.CloseIdleConnections()
	return nil
}

// TerminateSession forgets a session's history; a session without one is
// session_not_found.
func (a *Adapter) TerminateSession(ctx context.Context, _ string, sessionID string) error {
	return a.sessions.Terminate(ctx, sessionID)
}

// ListSessions returns the page q asks for of the adapter's sessions.
func (a *Adapter) ListSessions(ctx context.Context, q domain.SessionQuery) ([]domain.SessionInfo, error) {
	return a.sessions.List(ctx, q)
}

// Admit refuses, before the node acknowledges the run, a run Execute would
// refuse for its own content: no model (no target and no models
// configured), input that is empty or holds bad messages, options that are
// no JSON object or ask for other than one choice (checkChoices). Its caller
// gets an honest refusal rather than a started run that fails.
func (a *Adapter) Admit(req domain.RunRequest) error {
	p, err := a.sessions.Check(req, a.models)
	if err != nil {
		return err
	}
	return checkChoices(p.Options)
}

// Execute runs one chat turn as the package doc describes. Invalid input,
// options or a missing model are returned as invalid_request errors before
// anything is sent; upstream failures are error events; a cancelled ctx
// returns ctx.Err(); a failing sink returns its error.
func (a *Adapter) Execute(ctx context.Context, req domain.RunRequest, sink ports.EventSink) error {
	prep, err := a.sessions.Prepare(ctx, req, a.models)
	if err != nil {
		return err
	}
	model, body, turn, msgs := prep.Model, prep.Options, prep.Turn, prep.Messages
	dropReserved(body)
	if err := checkChoices(body); err != nil {
		return err
	}
	payload, err := json.Marshal(struct {
		Model         string            `json:"model"`
		Messages      []json.RawMessage `json:"messages"`
		Stream        bool              `json:"stream"`
		StreamOptions map[string]bool   `json:"stream_options"`
	}{model, msgs, true, map[string]bool{"include_usage": true}})
	if err != nil {
		return fmt.Errorf("encode chat request: %w", err)
	}
	if len(body) > 0 {
		extra, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode chat request: %w", err)
		}
		// The options follow the fixed keys.
		payload = chat.AppendFields(payload, extra)
	}
	header := http.Header{"Accept": {"text/event-stream"}}
	if auth := upstream.Bearer(a.apiKeyEnv); auth != "" {
		header.Set("Authorization", auth)
	}

	limit := runlimit.New(ctx, a.timeout)
	defer limit.Stop()
	started := time.Now()
	resp, err := upstream.Do(limit.Context(), a.hc, http.MethodPost, a.url, payload, header)
	if err != nil {
		return limit.Fail(sink, "chat completion", err)
	}
	defer resp.Body.Close()

	s := &stream{sink: sink, model: model, keepCalls: req.SessionID != "", ctype: resp.Header.Get("Content-Type")}
	if ct, _, _ := mime.ParseMediaType(s.ctype); ct == "application/json" {
		err = s.readWhole(resp.Body)
	} else {
		err = s.readSSE(resp.Body)
	}
	var ue *upstreamErr
	switch {
	case errors.As(err, &ue):
		// What a 200 answer said is quoted in the message, and a server
		// may echo the key it was sent there as in a 401.
		return limit.Fail(sink, "chat completion", upstream.WithoutCredentials(ue.err, resp.Request))
	case err != nil && errors.Is(err, errReading):
		return limit.Fail(sink, "chat completion", upstream.TransportError(limit.Context(), err))
	case err != nil:
		return err // the sink's
	}
	if err := a.sessions.Commit(ctx, sink, model, req.SessionID, turn, s.sessionReply()); err != nil {
		return err
	}
	u := s.usage
	u.DurationMS = time.Since(started).Milliseconds()
	u.StopReason, u.Model = s.finish, s.model
	if u.TotalTokens == 0 {
		u.TotalTokens = domain.AddTokens(u.PromptTokens, u.CompletionTokens) // saturating: the server's counts may be absurd
	}
	return sink.Emit(domain.RunEvent{Type: domain.EventComplete, Usage: &u})
}

// oneChoice refuses an "n" option (named key, as the caller spelt it) asking for more (or fewer) than one
// choice: a run's events and a session's stored reply carry one answer, and
// the choices' deltas and tool-call fragments would be joined into one
// (their choice index is not in the events). A value that is not a number
// is the server's to judge.
func oneChoice(key string, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var n float64
	if json.Unmarshal(raw, &n) != nil {
		// A number in a string: servers that validate loosely (vLLM's
		// pydantic) take "2" for 2; other text is the server's to refuse.
		var text string
		if json.Unmarshal(raw, &text) != nil {
			return nil
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
		if err != nil {
			return nil
		}
		n = f
	}
	if n == 1 {
		return nil
	}
	return domain.Errorf(domain.CodeInvalidRequest, "option %q is %v: a run carries one answer (its events have no choice index), so %s must be 1; send one run per answer", key, n, key)
}

// errReading marks a failure to read the response body.
var errReading = errors.New("read response")

// upstreamErr is a failure the server reported, or a stream cut short.
type upstreamErr struct{ err error }

func (e *upstreamErr) Error() string { return e.err.Error() }

// chunk is one streamed chat.completion.chunk, or a whole chat.completion.
// Its fields are decoded one by one (see field, message and tokens): servers
// differ in the types they send, and one field the adapter cannot read as it
// expects must not lose the chunk's other content.
type chunk struct {
	Model   json.RawMessage `json:"model"`
	Choices json.RawMessage `json:"choices"`
	Usage   json.RawMessage `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

type choice struct {
	Delta   json.RawMessage `json:"delta"`
	Message json.RawMessage `json:"message"`
	Finish  json.RawMessage `json:"finish_reason"`
}

// typedChunk is a chunk decoded in one pass, its choices and their
// messages with it, as nearly every chunk can be. A chunk of another shape
// anywhere (choices that are no array, a delta that is no object) fails
// that pass and is read a level at a time (chunk, handle), which keeps the
// rest of it: read so, each chunk cost three decodes of the same bytes.
type typedChunk struct {
	Model   json.RawMessage `json:"model"`
	Choices []typedChoice   `json:"choices"`
	Usage   json.RawMessage `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

type typedChoice struct {
	Delta   *message        `json:"delta"` // nil when null or absent
	Message *message        `json:"message"`
	Finish  json.RawMessage `json:"finish_reason"`
}

type message struct {
	Content          json.RawMessage `json:"content"`
	Reasoning        json.RawMessage `json:"reasoning"`
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
}

// present reports whether raw holds a value other than null.
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// text returns raw as a string, or "" when it holds no string.
func text(raw json.RawMessage) string {
	// raw comes from a decoded document, so it is valid JSON: a string
	// without escapes whose bytes are valid UTF-8 is its bytes between the
	// quotes, which Unmarshal would only copy (most of a stream's fields).
	if n := len(raw); n >= 2 && raw[0] == '"' && bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw[1:n-1]) {
		return string(raw[1 : n-1])
	}
	var s string
	if present(raw) && json.Unmarshal(raw, &s) == nil {
		return s
	}
	return ""
}

// contentParts reads a message content: a string is answer text; an array
// of parts (as Mistral's reasoning models stream it) gives the text of its
// "text" parts as answer and of its "thinking" parts (a string, or text
// parts of their own) as reasoning. Other parts carry no text.
func contentParts(raw json.RawMessage) (answer, thinking string) {
	if !present(raw) {
		return "", ""
	}
	if s := text(raw); s != "" || raw[0] == '"' {
		return s, ""
	}
	var parts []struct {
		Type     string          `json:"type"`
		Text     json.RawMessage `json:"text"`
		Thinking json.RawMessage `json:"thinking"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return "", ""
	}
	var a, t strings.Builder
	for _, p := range parts {
		switch p.Type {
		case "text":
			a.WriteString(text(p.Text))
		case "thinking":
			if s := text(p.Thinking); s != "" {
				t.WriteString(s)
				continue
			}
			in, _ := contentParts(p.Thinking)
			t.WriteString(in)
		}
	}
	return a.String(), t.String()
}

// tokens reads a token count as domain.ParseCount does (3, 3.0, 3e2, "3");
// anything else, or a negative count, is 0.
func tokens(raw json.RawMessage) int64 {
	if !present(raw) {
		return 0
	}
	return max(domain.ParseCount(raw), 0)
}

// stream turns chunks into events and remembers what the complete event needs.
type stream struct {
	sink  ports.EventSink
	model string
	reply strings.Builder
	// calls collects the reply's tool calls for a session's history only
	// (keepCalls): a run without one relays them and keeps nothing, so no
	// bound on them can fail it.
	calls     toolCalls
	keepCalls bool
	// reasoning is the reply's reasoning, kept for a session's history
	// (keepCalls) up to maxKeptReasoning, which a reply with tool calls is
	// stored with, in the field the server sent it in (reasoningField).
	reasoning      strings.Builder
	reasoningField string
	usage          domain.Usage
	finish         string
	done           bool
	ctype          string // the response's content type
}

// readSSE reads server-sent events until [DONE]. It returns nil when the
// stream completed, an *upstreamErr for a reported or premature end, an
// error wrapping errReading when the body failed, or the sink's error.
func (s *stream) readSSE(body io.Reader) error {
	head := &prefix{max: 512}
	r := lines.NewReader(io.TeeReader(body, head), 0)
	var data []byte
	pending := false
	event := ""  // the current event's name
	sse := false // whether any line was one of an event stream
	for !s.done {
		line, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %w", errReading, err)
		}
		switch {
		case len(line) == 0:
			if pending {
				if err := s.dispatch(event, data); err != nil {
					return err
				}
				data, pending = data[:0], false
			}
			event = ""
		case line[0] == ':':
			sse = true
		case bytes.HasPrefix(line, []byte("event:")):
			sse, event = true, string(bytes.TrimSpace(line[len("event:"):]))
		case bytes.HasPrefix(line, []byte("error:")):
			// llama.cpp's server sends a failure after the stream started
			// as a field of its own, "error: {code, message, type}", and
			// then data: [DONE] as after any stream: the run failed.
			return &upstreamErr{eventError(bytes.TrimSpace(line[len("error:"):]))}
		case bytes.HasPrefix(line, []byte("data:")):
			v := bytes.TrimPrefix(line[len("data:"):], []byte(" "))
			if len(data)+1+len(v) > lines.DefaultMax {
				// An event that never ends (data lines and no blank line)
				// must not grow the node's memory without bound.
				return &upstreamErr{domain.Errorf(domain.CodeProviderError, "the server sent an event of more than %d bytes", lines.DefaultMax)}
			}
			if pending {
				data = append(data, '\n')
			}
			data, pending, sse = append(data, v...), true, true
		}
	}
	if pending && !s.done {
		if err := s.dispatch(event, data); err != nil {
			return err
		}
	}
	if !s.done && s.finish == "" {
		if !sse {
			// No event stream at all (a proxy's login page, a captive
			// portal, an HTML error page sent with 200): say what came.
			if len(head.b) == 0 {
				return &upstreamErr{domain.Errorf(domain.CodeProviderError, "the server answered with an empty body (content type %q), not an event stream", s.ctype)}
			}
			return &upstreamErr{domain.Errorf(domain.CodeProviderError, "the server answered with %q, not an event stream: %s", s.ctype, upstream.Snippet(head.b, 200))}
		}
		return &upstreamErr{domain.Errorf(domain.CodeProviderError, "the server's stream ended before [DONE]")}
	}
	return nil
}

// prefix keeps the first max bytes written to it.
type prefix struct {
	b   []byte
	max int
}

func (p *prefix) Write(b []byte) (int, error) {
	if n := p.max - len(p.b); n > 0 {
		p.b = append(p.b, b[:min(n, len(b))]...)
	}
	return len(b), nil
}

// eventError is the failure an SSE event named "error", or an "error:"
// line (llama.cpp), reports: the message of the error object its data
// holds (under "error", or the data itself), or its text.
func eventError(data []byte) error {
	if len(data) == 0 {
		return domain.Errorf(domain.CodeProviderError, "the server reported an error mid-stream without a message")
	}
	if !json.Valid(data) {
		return upstream.ProviderError(upstream.Snippet(data, 1024), "")
	}
	var c chunk
	if json.Unmarshal(data, &c) == nil && present(c.Error) {
		return upstream.ProviderError(upstream.ErrorField(c.Error))
	}
	return upstream.ProviderError(upstream.ErrorField(data))
}

// readWhole reads a non-streamed JSON completion.
func (s *stream) readWhole(body io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(body, maxWholeResponse+1))
	if err != nil {
		return fmt.Errorf("%w: %w", errReading, err)
	}
	if len(b) > maxWholeResponse {
		return &upstreamErr{domain.Errorf(domain.CodeProviderError, "the server's response is larger than %d bytes", maxWholeResponse)}
	}
	// A body that is no completion (an HTML page with a JSON content
	// type, or JSON of another shape: a gateway's {"detail": …}, [], {})
	// is the server failing, not a run that completed with nothing, as in
	// the streamed path. One pass: Unmarshal reports every input that is
	// not JSON (an empty one too) as a syntax error, JSON that is no
	// object as a type error.
	var c chunk
	if err := json.Unmarshal(bytes.TrimSpace(b), &c); err != nil {
		if errors.As(err, new(*json.SyntaxError)) {
			return &upstreamErr{domain.Errorf(domain.CodeProviderError, "the server's response is not JSON: %s", upstream.Snippet(b, 200))}
		}
		return notCompletion(b)
	}
	if !present(c.Error) && !bytes.HasPrefix(c.Choices, []byte("[")) {
		return notCompletion(b)
	}
	if err := s.handle(&c); err != nil {
		return err
	}
	s.done = true
	return nil
}

// notCompletion is the failure of a non-streamed answer that is JSON but
// no chat completion: an object without a "choices" array (and without an
// "error"), or no object at all. It quotes the start of what came.
func notCompletion(b []byte) error {
	return &upstreamErr{domain.Errorf(domain.CodeProviderError,
		"the server's response is not a chat completion (no \"choices\" array): %s", upstream.Snippet(b, 200))}
}

// maxWholeResponse bounds a non-streamed completion.
const maxWholeResponse = 64 << 20

func (s *stream) dispatch(event string, data []byte) error {
	data = bytes.TrimSpace(data)
	if event == "error" {
		return &upstreamErr{eventError(data)}
	}
	if string(data) == "[DONE]" {
		s.done = true
		return nil
	}
	if len(data) == 0 {
		return nil
	}
	var tc typedChunk
	if json.Unmarshal(data, &tc) == nil {
		return s.handleTyped(&tc)
	}
	var c chunk
	if json.Unmarshal(data, &c) != nil {
		return nil // not a chunk: skipped
	}
	return s.handle(&c)
}

// handleTyped is handle for a chunk decoded in one pass.
func (s *stream) handleTyped(c *typedChunk) error {
	if present(c.Error) {
		return chunkError(c.Error)
	}
	if m := text(c.Model); m != "" {
		s.model = m
	}
	for _, ch := range c.Choices {
		m := ch.Delta
		if m == nil {
			m = ch.Message
		}
		if m != nil {
			if err := s.emitMessage(m); err != nil {
				return err
			}
		}
		if f := text(ch.Finish); f != "" {
			s.finish = f
		}
	}
	s.readUsage(c.Usage)
	return nil
}

// handle turns one parsed chunk into events.
func (s *stream) handle(c *chunk) error {
	if present(c.Error) {
		return chunkError(c.Error)
	}
	if m := text(c.Model); m != "" {
		s.model = m
	}
	var choices []choice
	if present(c.Choices) {
		_ = json.Unmarshal(c.Choices, &choices) // no array of choices: none
	}
	for _, ch := range choices {
		raw := ch.Delta
		if !present(raw) {
			raw = ch.Message
		}
		var m message
		if present(raw) && json.Unmarshal(raw, &m) == nil {
			if err := s.emitMessage(&m); err != nil {
				return err
			}
		}
		if f := text(ch.Finish); f != "" {
			s.finish = f
		}
	}
	s.readUsage(c.Usage)
	return nil
}

// chunkError is the failure a chunk's "error" object reports.
func chunkError(raw json.RawMessage) error {
	msg, code := upstream.ErrorField(raw)
	return &upstreamErr{upstream.ProviderError(msg, code)}
}

// readUsage keeps the counts of a chunk's "usage", if it has one.
func (s *stream) readUsage(raw json.RawMessage) {
	if !present(raw) {
		return
	}
	var u struct {
		PromptTokens     json.RawMessage `json:"prompt_tokens"`
		CompletionTokens json.RawMessage `json:"completion_tokens"`
		TotalTokens      json.RawMessage `json:"total_tokens"`
	}
	if json.Unmarshal(raw, &u) == nil {
		s.usage.PromptTokens, s.usage.CompletionTokens, s.usage.TotalTokens = tokens(u.PromptTokens), tokens(u.CompletionTokens), tokens(u.TotalTokens)
	}
}

func (s *stream) emitMessage(m *message) error {
	content, thinking := contentParts(m.Content)
	// One field or the other: vLLM about 0.11 to 0.15 copies the reasoning
	// into both, and joining them would double the text.
	if s.keepCalls {
		s.keepReasoning(m)
	}
	if r := cmp.Or(text(m.Reasoning), text(m.ReasoningContent)) + thinking; r != "" {
		if err := s.sink.Emit(domain.RunEvent{Type: domain.EventReasoningDelta, Text: r}); err != nil {
			return err
		}
	}
	if content != "" {
		s.reply.WriteString(content)
		if err := s.sink.Emit(domain.RunEvent{Type: domain.EventDelta, Text: content}); err != nil {
			return err
		}
	}
	if present(m.ToolCalls) {
		if s.keepCalls {
			if err := s.calls.add(m.ToolCalls); err != nil {
				return err
			}
		}
		meta, _ := json.Marshal(map[string]json.RawMessage{"tool_calls": m.ToolCalls})
		if err := s.sink.Emit(domain.RunEvent{Type: domain.EventMetadata, Metadata: meta}); err != nil {
			return err
		}
	}
	return nil
}

// maxKeptReasoning bounds the reasoning a session run keeps for its reply
// (stream.reasoning): what comes past it is not kept.
const maxKeptReasoning = chat.MaxToolCallBytes

// keepReasoning adds m's reasoning_content to what the reply is stored
// with: DeepSeek and Kimi refuse a tool-calling assistant message without
// it (vLLM sends the same text in reasoning too). A reasoning field alone
// (OpenRouter's, Ollama's /v1, Groq's) is not kept: no server is known to
// need it back, and some refuse it in a request ("property 'reasoning' is
// unsupported").
func (s *stream) keepReasoning(m *message) {
	r := text(m.ReasoningContent)
	if r == "" {
		return
	}
	s.reasoningField = "reasoning_content"
	if n := maxKeptReasoning - s.reasoning.Len(); n > 0 {
		if len(r) > n {
			r = strings.ToValidUTF8(r[:n], "")
		}
		s.reasoning.WriteString(r)
	}
}

// sessionReply is what a session stores of the reply: its content, its
// tool calls and, for a reply with tool calls, its reasoning.
func (s *stream) sessionReply() chat.Reply {
	reply := chat.Reply{Content: s.reply.String(), ToolCalls: s.calls.merged()}
	if len(reply.ToolCalls) > 0 {
		reply.Reasoning, reply.ReasoningField = s.reasoning.String(), s.reasoningField
	}
	return reply
}

// maxToolCalls and maxToolCallBytes bound what a stream's tool-call
// fragments may accumulate to: the calls are kept for the session history
// and must not grow the node's memory without bound.
const (
	maxToolCalls     = 128
	maxToolCallBytes = chat.MaxToolCallBytes
)

// toolCalls merges the streamed fragments of the reply's tool calls: the
// first fragment of a call (by index) brings its id, type and function
// name, the following ones pieces of its arguments. A fragment whose index
// is that of a call with another id starts a new call only when it is a
// call's first fragment, bringing a function name too: Ollama's /v1 gives
// every parallel call of a turn index 0, each whole with an id of its own,
// while other servers (Poolside, vLLM's early harmony streaming,
// mlx-openai-server) give each fragment of one call an id of its own.
type toolCalls struct {
	calls   []*toolCall // in the order they started
	byIndex map[int]int // the server's index → the latest call given it
	size    int
}

type toolCall struct {
	id, typ, name string
	args          strings.Builder
	// extra holds the call's other fields, as the server first sent each
	// (Gemini's "extra_content", its thought signature, which must come
	// back with the call), to be stored with it.
	extra map[string]json.RawMessage
}

// callFields are the fields of a streamed tool call the merge reads; any
// other is kept as sent (toolCall.extra).
var callFields = map[string]bool{"index": true, "id": true, "type": true, "function": true}

type toolCallFragment struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
		// Arguments is a string of JSON in OpenAI's API; some servers
		// send the JSON itself (see arguments).
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// arguments returns the fragment's piece of its call's arguments: the
// string, or, from a server that sends them as JSON rather than as a
// string of it (llama.cpp's server for a while, ggml-org/llama.cpp#20198;
// TGI's whole answers), that JSON as its text, which is what the API
// expects back in the history.
func (f toolCallFragment) arguments() string {
	raw := f.Function.Arguments
	if !present(raw) {
		return ""
	}
	if raw[0] == '"' {
		return text(raw)
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

// add merges one delta's tool_calls. Calls without an index (a
// non-streamed message, some servers' streams) are told apart by id: a new
// id is a new call, no id continues the last one.
func (tc *toolCalls) add(raw json.RawMessage) error {
	var frags []toolCallFragment
	var fields []map[string]json.RawMessage
	if json.Unmarshal(raw, &frags) != nil || json.Unmarshal(raw, &fields) != nil {
		return nil // not tool calls we can read: passed on in metadata only
	}
	for k, f := range frags {
		i := tc.slot(f)
		args := f.arguments()
		tc.size += len(f.ID) + len(f.Type) + len(f.Function.Name) + len(args)
		for name, v := range fields[k] {
			if !callFields[name] && present(v) {
				tc.size += len(name) + len(v)
			}
		}
		if i >= maxToolCalls || tc.size > maxToolCallBytes {
			return &upstreamErr{domain.Errorf(domain.CodeProviderError, "the server's tool calls exceed %d calls or %d bytes", maxToolCalls, maxToolCallBytes)}
		}
		if i == len(tc.calls) {
			tc.calls = append(tc.calls, &toolCall{})
			if f.Index != nil {
				if tc.byIndex == nil {
					tc.byIndex = map[int]int{}
				}
				tc.byIndex[*f.Index] = i
			}
		}
		c := tc.calls[i]
		c.id = cmp.Or(c.id, f.ID)
		c.typ = cmp.Or(c.typ, f.Type)
		c.name = cmp.Or(c.name, f.Function.Name)
		c.args.WriteString(args)
		for name, v := range fields[k] {
			if callFields[name] || !present(v) || c.extra[name] != nil {
				continue
			}
			if c.extra == nil {
				c.extra = map[string]json.RawMessage{}
			}
			c.extra[name] = v
		}
	}
	return nil
}

// slot returns the call f belongs to; len(tc.calls) for a new one.
func (tc *toolCalls) slot(f toolCallFragment) int {
	if f.Index != nil {
		i, ok := tc.byIndex[*f.Index]
		if !ok || (f.ID != "" && f.Function.Name != "" && tc.calls[i].id != "" && tc.calls[i].id != f.ID) {
			return len(tc.calls)
		}
		return i
	}
	if f.ID == "" && len(tc.calls) > 0 {
		return len(tc.calls) - 1
	}
	for i, c := range tc.calls {
		if c.id == f.ID {
			return i
		}
	}
	return len(tc.calls)
}

// merged returns the complete calls, as the API expects them in an
// assistant message of the history.
func (tc *toolCalls) merged() []json.RawMessage {
	var out []json.RawMessage
	for _, c := range tc.calls {
		type function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		}
		b, _ := json.Marshal(struct {
			ID       string   `json:"id"`
			Type     string   `json:"type"`
			Function function `json:"function"`
		}{c.id, cmp.Or(c.typ, "function"), function{c.name, c.args.String()}})
		if len(c.extra) > 0 {
			// The other fields follow the merged ones.
			extra, _ := json.Marshal(c.extra) // raw values decoded before: cannot fail
			b = chat.AppendFields(b, extra)
		}
		out = append(out, b)
	}
	return out
}
