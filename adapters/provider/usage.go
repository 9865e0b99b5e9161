package provider

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"unicode"

	"iop/domain"
)

// UsageScanner watches a response body as it streams past and remembers the
// last token usage it reports: OpenAI SSE (`data: {..."usage":{...}}`, the
// include_usage chunk whatever its choices), Ollama NDJSON (the final
// `"done":true` line) or a plain JSON body (OpenAI or Ollama, streaming off).
// Anthropic Messages SSE (input tokens from message_start, output tokens and
// stop reason from message_delta) and OpenAI Responses SSE (the usage of
// response.completed) are read too. An Anthropic prompt counts its cached
// tokens too (input_tokens plus cache_creation_ and cache_read_input_tokens).
// It never changes the bytes; lines split across writes are reassembled.
//
// In a stream (SSE or NDJSON) it also notices the first error the provider
// reports inside the body (StreamError): Anthropic's `event: error`
// (`{"type":"error","error":{"type","message"}}`), an OpenAI-compatible
// `data: {"error":{…}}` chunk, the Responses API's `error` event and
// `response.failed`, an Ollama `{"error":"…"}` line.
//
// Memory is bounded: of a line longer than 1 MiB (an Ollama done line whose
// "context" holds a long conversation's tokens, a Responses API
// response.completed with a large output) only the first 4 KiB and the last
// 64 KiB are kept, and of a plain JSON body only the first 4 MiB and the
// last 64 KiB; the usage of either is then read from the tail (where OpenAI
// and Ollama put it) and the model from the head.
type UsageScanner struct {
	mu       sync.Mutex
	kind     int
	line     []byte
	tooLong  bool   // the current line is skipped: it cannot carry counts
	checked  bool   // the current line's start was checked
	long     bool   // the current line passed maxLine: head and tail are kept
	head     []byte // a long line's first maxHead bytes
	whole    []byte // JSON: the first maxWhole bytes
	tail     []byte // JSON: the last maxTail bytes, once whole is full; a long line's last ones
	overflow bool
	finished bool
	usage    *domain.Usage
	model    string
	// streamErr is the first error the stream reported; nil if none.
	streamErr *domain.ProviderStreamError
	// anthropic: the parts of an Anthropic prompt count, from message_start
	// and then any message_delta that restates them.
	anthropic anthropicInput
}

// anthropicInput is what Anthropic counts of a prompt: input_tokens is
// only what follows the last cache breakpoint, the rest is counted as
// written to or read from the prompt cache. Every prompt token the model
// read is their sum (as adapters/runtime/claudecode counts them).
type anthropicInput struct {
	Input       *count `json:"input_tokens"`
	CacheCreate *count `json:"cache_creation_input_tokens"`
	CacheRead   *count `json:"cache_read_input_tokens"`
}

// update takes the parts a message_delta states and reports whether it
// stated any. Its counts are cumulative, so a stated part replaces the
// earlier one; a 0 is taken for not stated (some compatible servers send
// "input_tokens":0 there), as a cumulative count never goes down.
func (a *anthropicInput) update(u anthropicInput) bool {
	stated := false
	for _, p := range []struct{ to, from **count }{{&a.Input, &u.Input}, {&a.CacheCreate, &u.CacheCreate}, {&a.CacheRead, &u.CacheRead}} {
		if *p.from != nil && **p.from > 0 {
			*p.to, stated = *p.from, true
		}
	}
	return stated
}

func (a anthropicInput) sum() int64 {
	var n int64
	for _, p := range []*count{a.Input, a.CacheCreate, a.CacheRead} {
		if p != nil {
			n = domain.AddTokens(n, int64(*p))
		}
	}
	return n
}

const (
	kindSSE = iota + 1
	kindNDJSON
	kindJSON
	maxLine  = 1 << 20
	maxHead  = 4 << 10
	maxWhole = 4 << 20
	maxTail  = 64 << 10
)

// NewUsageScanner picks the format from the response content type; with an
// unknown content type it watches nothing and Usage returns nil.
func NewUsageScanner(contentType string) *UsageScanner {
	ct := strings.ToLower(contentType)
	s := &UsageScanner{}
	switch {
	case strings.Contains(ct, "text/event-stream"):
		s.kind = kindSSE
	case strings.Contains(ct, "ndjson"):
		s.kind = kindNDJSON
	case strings.Contains(ct, "json"):
		s.kind = kindJSON
	}
	return s
}

// Write feeds body bytes to the scanner. It never fails.
func (s *UsageScanner) Write(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.kind {
	case kindSSE, kindNDJSON:
		for len(p) > 0 {
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				s.addLine(p)
				return
			}
			s.addLine(p[:i])
			switch {
			case s.long:
				s.parseLong()
			case !s.tooLong:
				s.handleLine(s.line)
			}
			s.line, s.tooLong, s.checked, s.long = s.line[:0], false, false, false
			s.head, s.tail = s.head[:0], s.tail[:0]
			p = p[i+1:]
		}
	case kindJSON:
		if room := maxWhole - len(s.whole); !s.overflow && room >= len(p) {
			s.whole = append(s.whole, p...)
			return
		}
		s.overflow = true
		s.keepTail(p)
	}
}

// keepTail appends p to tail, which keeps at least its last maxTail bytes
// and at most twice that: it is cut back only when it has doubled, so a
// long body costs one copy of each byte, not one per write (lastTail is
// what is read).
func (s *UsageScanner) keepTail(p []byte) {
	if len(p) >= maxTail {
		s.tail = append(s.tail[:0], p[len(p)-maxTail:]...)
		return
	}
	s.tail = append(s.tail, p...)
	if len(s.tail) > 2*maxTail {
		s.tail = append(s.tail[:0], s.lastTail()...)
	}
}

// lastTail is the last maxTail bytes kept, however the body was split.
func (s *UsageScanner) lastTail() []byte {
	return s.tail[max(len(s.tail)-maxTail, 0):]
}

func (s *UsageScanner) addLine(p []byte) {
	if s.tooLong {
		return
	}
	if s.long {
		s.keepTail(p)
		return
	}
	if len(s.line)+len(p) > maxLine {
		// Too long to keep: its head (the type, the model) and its tail
		// (the counts) are enough to read.
		s.head = append(s.head[:0], s.line[:min(len(s.line), maxHead)]...)
		s.head = append(s.head, p[:min(len(p), maxHead-len(s.head))]...)
		if known, ok := s.startShows(s.head); !known || !ok {
			s.tooLong, s.line = true, s.line[:0] // not a line that counts, or a megabyte of blanks
			return
		}
		s.long = true
		s.keepTail(s.line)
		s.keepTail(p)
		s.line = s.line[:0]
		return
	}
	s.line = append(s.line, p...)
	// A line that cannot be one parse reads (an SSE "data: {" line, an
	// NDJSON object) is skipped as soon as its start shows it, rather than
	// copied up to maxLine: a bulk body with no newlines was copying a
	// megabyte per response here (a sixth of the node's CPU relaying it).
	if !s.checked {
		if known, ok := s.startShows(s.line); known {
			s.checked = true
			if !ok {
				s.tooLong, s.line = true, s.line[:0]
			}
		}
	}
}

// startShows reports whether the start of a line, b, shows yet whether the
// line can carry counts (known), and if so whether it can (ok).
func (s *UsageScanner) startShows(b []byte) (known, ok bool) {
	start := bytes.TrimLeftFunc(b, unicode.IsSpace)
	want := []byte("{")
	if s.kind == kindSSE {
		want = []byte("data:")
	}
	if len(start) < len(want) {
		return false, false
	}
	return true, bytes.HasPrefix(start, want)
}

func (s *UsageScanner) handleLine(line []byte) {
	line = bytes.TrimSpace(line)
	if s.kind == kindSSE {
		if !bytes.HasPrefix(line, []byte("data:")) {
			return // event:, id:, retry:, ": keep-alive" comments
		}
		line = bytes.TrimSpace(line[len("data:"):])
	}
	s.parse(line)
}

// count is a number a provider reports (a token count, Ollama's duration
// in nanoseconds), read as domain.ParseCount reads it (the openai runtime
// adapter too): anything odd is 0, never an error, which made the whole
// line fail to decode, and with it every count it carried.
type count int64

func (c *count) UnmarshalJSON(b []byte) error {
	*c = count(domain.ParseCount(b))
	return nil
}

// usageCounts accepts the Chat Completions names, the Responses API ones
// and Anthropic's (whose prompt count is split in parts, see
// anthropicInput; the Responses API's input_tokens already includes its
// cached tokens and it has no cache_* fields).
type usageCounts struct {
	PromptTokens     count `json:"prompt_tokens"`
	CompletionTokens count `json:"completion_tokens"`
	TotalTokens      count `json:"total_tokens"`
	OutputTokens     count `json:"output_tokens"`
	anthropicInput
}

func (c usageCounts) toDomain() *domain.Usage {
	u := &domain.Usage{PromptTokens: int64(c.PromptTokens), CompletionTokens: int64(c.CompletionTokens), TotalTokens: int64(c.TotalTokens)}
	if u.PromptTokens == 0 {
		u.PromptTokens = c.sum()
	}
	if u.CompletionTokens == 0 {
		u.CompletionTokens = int64(c.OutputTokens)
	}
	if u.TotalTokens == 0 {
		u.TotalTokens = domain.AddTokens(u.PromptTokens, u.CompletionTokens)
	}
	return u
}

type usageDoc struct {
	Type  string       `json:"type"`
	Model string       `json:"model"`
	Usage *usageCounts `json:"usage"`
	// Anthropic Messages: message_start carries the input count in
	// message.usage, message_delta the (cumulative) output count and the
	// stop reason; a whole (non-streamed) message has "stop_reason".
	Message    json.RawMessage `json:"message"`
	Delta      json.RawMessage `json:"delta"`
	StopReason string          `json:"stop_reason"`
	// Responses API events nest the usage; Ollama's /api/generate uses
	// "response" for text, so it is decoded only when it is an object.
	Response json.RawMessage `json:"response"`
	// An error stated in a stream: an object (Anthropic, OpenAI) or a
	// string (Ollama); the Responses API's error event has its code at the
	// top level (and its message in "message", see Message).
	Error json.RawMessage `json:"error"`
	Code  json.RawMessage `json:"code"`
	// Ollama native: counts on the final done line (and on /api/embed).
	Done            bool   `json:"done"`
	DoneReason      string `json:"done_reason"`
	PromptEvalCount *count `json:"prompt_eval_count"`
	EvalCount       *count `json:"eval_count"`
	TotalDuration   count  `json:"total_duration"`
}

func (s *UsageScanner) parse(b []byte) {
	if len(b) == 0 || b[0] != '{' {
		return // includes "[DONE]"
	}
	// Most stream lines are token deltas that carry no counts: decoding each
	// one was a visible share of the node's CPU per tunnel. A line is decoded
	// when it names a field that counts, or names the model while the model
	// is still unknown (the model does not change within one response).
	// A stream's error is looked for until one is seen; "error" appears
	// unescaped only as a key or a whole value, never inside text.
	if !mayCount(b) && (s.model != "" || !bytes.Contains(b, modelKey)) && !s.mayFail(b) {
		return
	}
	var d usageDoc
	if json.Unmarshal(b, &d) != nil {
		return
	}
	if s.streamErr == nil && s.kind != kindJSON {
		s.streamErr = streamError(d.Error, d.Type, d.Code, d.Message)
	}
	if d.Model != "" {
		s.model = d.Model
	}
	if len(d.Response) > 0 && d.Response[0] == '{' {
		var r struct {
			Model string          `json:"model"`
			Usage *usageCounts    `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(d.Response, &r) == nil {
			if r.Model != "" {
				s.model = r.Model
			}
			if r.Usage != nil {
				d.Usage = r.Usage
			}
			if d.Type == "response.failed" && s.streamErr == nil && s.kind != kindJSON {
				s.streamErr = errorValue(r.Error)
			}
		}
	}
	switch d.Type {
	case "message_start":
		var m struct {
			Model string       `json:"model"`
			Usage *usageCounts `json:"usage"`
		}
		if len(d.Message) > 0 && d.Message[0] == '{' && json.Unmarshal(d.Message, &m) == nil {
			if m.Model != "" {
				s.model = m.Model
			}
			if m.Usage != nil {
				s.usage = m.Usage.toDomain()
				s.anthropic = m.Usage.anthropicInput
			}
		}
		return
	case "message_delta":
		if d.Usage == nil {
			return
		}
		u := domain.Usage{}
		if s.usage != nil {
			u = *s.usage
		}
		if s.anthropic.update(d.Usage.anthropicInput) {
			u.PromptTokens = s.anthropic.sum()
		}
		u.CompletionTokens = int64(d.Usage.OutputTokens)
		u.TotalTokens = domain.AddTokens(u.PromptTokens, u.CompletionTokens)
		var delta struct {
			StopReason string `json:"stop_reason"`
		}
		if len(d.Delta) > 0 && d.Delta[0] == '{' && json.Unmarshal(d.Delta, &delta) == nil && delta.StopReason != "" {
			u.StopReason = delta.StopReason
		}
		s.usage = &u
		return
	}
	switch {
	case d.Usage != nil:
		s.usage = d.Usage.toDomain()
		if d.StopReason != "" {
			s.usage.StopReason = d.StopReason
		}
	case d.PromptEvalCount != nil || d.EvalCount != nil:
		var p, c int64
		if d.PromptEvalCount != nil {
			p = int64(*d.PromptEvalCount)
		}
		if d.EvalCount != nil {
			c = int64(*d.EvalCount)
		}
		s.usage = &domain.Usage{PromptTokens: p, CompletionTokens: c, TotalTokens: domain.AddTokens(p, c),
			DurationMS: int64(d.TotalDuration) / 1e6, StopReason: d.DoneReason}
	}
}

// countKeys are the fields parse takes counts from.
var modelKey = []byte(`"model"`)

var errorKey = []byte(`"error"`)

// mayFail reports whether a stream line may state an error not seen yet.
func (s *UsageScanner) mayFail(b []byte) bool {
	return s.streamErr == nil && s.kind != kindJSON && bytes.Contains(b, errorKey)
}

// streamError is the error a line states, if any: a top-level "error" (an
// object with type or code and message, or Ollama's string), or the
// Responses API's error event ({"type":"error","code","message"}).
// (Its parts are passed rather than the doc, which would then escape.)
func streamError(errValue json.RawMessage, typ string, code, message json.RawMessage) *domain.ProviderStreamError {
	if e := errorValue(errValue); e != nil {
		return e
	}
	if typ != "error" {
		return nil
	}
	e := domain.ProviderStreamError{Type: jsonString(code), Message: jsonString(message)}
	if e.Type == "" {
		e.Type = "error"
	}
	e = e.Bounded()
	return &e
}

// errorValue reads an "error" value: a string (Ollama) or an object with
// "type" or "code" and "message" (Anthropic, OpenAI). null, absent or
// anything else is no error. (Nothing is allocated for no error: most
// lines that reach it have none.)
func errorValue(raw json.RawMessage) *domain.ProviderStreamError {
	if len(raw) == 0 || (raw[0] != '"' && raw[0] != '{') {
		return nil
	}
	var typ, msg string
	if raw[0] == '"' {
		if json.Unmarshal(raw, &msg) != nil {
			return nil
		}
	} else {
		var o struct {
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
			Message json.RawMessage `json:"message"`
		}
		if json.Unmarshal(raw, &o) != nil {
			return nil
		}
		typ, msg = o.Type, jsonString(o.Message)
		if typ == "" {
			typ = jsonString(o.Code)
		}
	}
	e := domain.ProviderStreamError{Type: typ, Message: msg}.Bounded()
	if e.Type == "" && e.Message == "" {
		e.Message = "the provider reported an error"
	}
	return &e
}

// jsonString is raw as text: a string's value, a number's digits; "" for
// anything else.
func jsonString(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	if raw[0] == '"' {
		var v string
		if json.Unmarshal(raw, &v) == nil {
			return v
		}
		return ""
	}
	if raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9') {
		return string(raw)
	}
	return ""
}

var countKeys = [][]byte{[]byte(`"usage"`), []byte(`"prompt_eval_count"`), []byte(`"eval_count"`), []byte(`"response"`)}

func mayCount(b []byte) bool {
	for _, k := range countKeys {
		if bytes.Contains(b, k) {
			return true
		}
	}
	return false
}

// Usage returns the last usage seen, with the model when known; nil if none.
// Call it once the body has been read to the end.
func (s *UsageScanner) Usage() *domain.Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finish()
	if s.usage == nil {
		return nil
	}
	u := *s.usage
	u.Model = s.model
	return &u
}

// StreamError returns the first error the provider reported inside a
// stream (SSE or NDJSON), nil if none. Call it once the body has been read
// to the end (or as far as it went).
func (s *UsageScanner) StreamError() *domain.ProviderStreamError {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finish()
	if s.streamErr == nil {
		return nil
	}
	e := *s.streamErr
	return &e
}

// finish reads what is left of the body (a final line without a newline, a
// JSON body) once; then the buffers are let go.
func (s *UsageScanner) finish() {
	if !s.finished {
		s.finished = true
		switch {
		case s.kind == kindJSON && !s.overflow:
			s.parse(bytes.TrimSpace(s.whole))
		case s.kind == kindJSON:
			s.parseTail()
		case s.long:
			s.parseLong() // a final line without a newline
		case len(s.line) > 0 && !s.tooLong:
			s.handleLine(s.line) // a final line without a newline
		}
		s.whole, s.tail, s.line, s.head = nil, nil, nil, nil
	}
}

// parseTail reads the usage of a JSON body too large to keep whole: the
// last "usage" object, or Ollama's counts, from the tail; the model from
// the head.
func (s *UsageScanner) parseTail() {
	var m string
	if valueAfter(s.whole, "model", &m) {
		s.model = m
	}
	if u := usageFromTail(s.lastTail()); u != nil {
		s.usage = u
	}
}

// parseLong reads a stream line too long to keep (see maxLine) as parseTail
// reads a large JSON body: the model from its head unless known, the usage
// from its tail, with Ollama's stop reason (before its "context") and
// duration (after it).
func (s *UsageScanner) parseLong() {
	var m string
	if s.model == "" && valueAfter(s.head, "model", &m) {
		s.model = m
	}
	tail := s.lastTail()
	u := usageFromTail(tail)
	if u == nil {
		return
	}
	var reason string
	var took count
	if valueAfter(s.head, "done_reason", &reason) {
		u.StopReason = reason
	}
	if valueAfter(tail, "total_duration", &took) {
		u.DurationMS = int64(took) / 1e6
	}
	s.usage = u
}

// usageFromTail is the last "usage" object of tail, or Ollama's counts in
// it; nil if it has neither.
func usageFromTail(tail []byte) *domain.Usage {
	var c *usageCounts
	if valueAfter(tail, "usage", &c) {
		if c == nil {
			return nil // "usage": null (a queued response, a chunk before the last): none reported
		}
		return c.toDomain()
	}
	var p, e count
	okP := valueAfter(tail, "prompt_eval_count", &p)
	okE := valueAfter(tail, "eval_count", &e)
	if okP || okE {
		return &domain.Usage{PromptTokens: int64(p), CompletionTokens: int64(e), TotalTokens: domain.AddTokens(int64(p), int64(e))}
	}
	return nil
}

// valueAfter decodes into v the JSON value that follows the last occurrence
// of the object key `"key":` in b. It reports whether that worked.
func valueAfter(b []byte, key string, v any) bool {
	pat := []byte(`"` + key + `"`)
	for end := len(b); ; {
		i := bytes.LastIndex(b[:end], pat)
		if i < 0 {
			return false
		}
		end = i
		rest := bytes.TrimLeft(b[i+len(pat):], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		if json.NewDecoder(bytes.NewReader(rest[1:])).Decode(v) == nil {
			return true
		}
	}
}
