package provider

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"

	"iop/domain"
)

// UsageScanner watches a response body as it streams past and remembers the
// last token usage it reports: OpenAI SSE (`data: {..."usage":{...}}`),
// Ollama NDJSON (the final `"done":true` line) or a plain JSON body. It
// never changes the bytes; lines split across chunks are reassembled.
type UsageScanner struct {
	mu      sync.Mutex
	kind    int
	line    []byte
	whole   []byte
	usage   *domain.Usage
	model   string
	tooLong bool
}

const (
	kindSSE = iota + 1
	kindNDJSON
	kindJSON
	maxLine  = 1 << 20
	maxWhole = 4 << 20
)

// NewUsageScanner picks the format from the response content type.
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

// Write feeds body bytes to the scanner.
func (s *UsageScanner) Write(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.kind {
	case kindSSE, kindNDJSON:
		for len(p) > 0 {
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				if len(s.line)+len(p) > maxLine {
					s.tooLong = true
				} else {
					s.line = append(s.line, p...)
				}
				return
			}
			if !s.tooLong {
				s.line = append(s.line, p[:i]...)
				s.handleLine(s.line)
			}
			s.line, s.tooLong = s.line[:0], false
			p = p[i+1:]
		}
	case kindJSON:
		if len(s.whole)+len(p) <= maxWhole {
			s.whole = append(s.whole, p...)
		}
	}
}

func (s *UsageScanner) handleLine(line []byte) {
	line = bytes.TrimRight(line, "\r")
	if s.kind == kindSSE {
		if !bytes.HasPrefix(line, []byte("data:")) {
			return
		}
		line = bytes.TrimSpace(line[len("data:"):])
		if bytes.Equal(line, []byte("[DONE]")) {
			return
		}
	}
	s.parse(line)
}

type usageDoc struct {
	Model string `json:"model"`
	Usage *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	} `json:"usage"`
	// Ollama native
	Done            bool   `json:"done"`
	DoneReason      string `json:"done_reason"`
	PromptEvalCount int64  `json:"prompt_eval_count"`
	EvalCount       int64  `json:"eval_count"`
	TotalDuration   int64  `json:"total_duration"`
}

func (s *UsageScanner) parse(b []byte) {
	if len(b) == 0 || b[0] != '{' {
		return
	}
	var d usageDoc
	if json.Unmarshal(b, &d) != nil {
		return
	}
	if d.Model != "" {
		s.model = d.Model
	}
	switch {
	case d.Usage != nil:
		s.usage = &domain.Usage{PromptTokens: d.Usage.PromptTokens, CompletionTokens: d.Usage.CompletionTokens, TotalTokens: d.Usage.TotalTokens}
	case d.Done && (d.PromptEvalCount > 0 || d.EvalCount > 0):
		s.usage = &domain.Usage{PromptTokens: d.PromptEvalCount, CompletionTokens: d.EvalCount, TotalTokens: d.PromptEvalCount + d.EvalCount,
			DurationMS: d.TotalDuration / 1e6, StopReason: d.DoneReason}
	}
}

// Usage returns the last usage seen, with the model when known; nil if none.
func (s *UsageScanner) Usage() *domain.Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kind == kindJSON && s.usage == nil && len(s.whole) > 0 {
		s.parse(bytes.TrimSpace(s.whole))
		s.whole = nil
	}
	if s.kind != kindJSON && len(s.line) > 0 && !s.tooLong {
		s.handleLine(s.line) // a final line without a newline
		s.line = s.line[:0]
	}
	if s.usage == nil {
		return nil
	}
	u := *s.usage
	u.Model = s.model
	return &u
}
