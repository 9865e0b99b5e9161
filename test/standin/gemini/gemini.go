// Package gemini is a stand-in Gemini API (generativelanguage, v1beta) for
// tests: POST /v1beta/models/{model}:generateContent answers whole, and
// :streamGenerateContent?alt=sse streams GenerateContentResponse chunks as
// server-sent events (thought parts, text parts, a functionCall part, the
// last chunk with finishReason and usageMetadata); :countTokens counts
// roughly. A request asking for JSON (generationConfig.responseMimeType
// application/json, as the Gemini CLI's model router does before every
// prompt) gets the Route reply instead of the scripted one, and does not
// count as a scripted request.
package gemini

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"iop/test/standin"
)

// Reply, ToolCall and Usage are the shared script types.
type (
	Reply    = standin.Reply
	ToolCall = standin.ToolCall
	Usage    = standin.Usage
)

// DefaultRoute is the router's answer unless Route sets another: the
// simple model is enough. It satisfies both of the CLI's classifiers (the
// model_choice one and the numerical complexity_score one).
var DefaultRoute = Reply{
	Text:  `{"reasoning":"a stand-in always picks flash","model_choice":"flash","complexity_reasoning":"a stand-in task is simple","complexity_score":1}`,
	Usage: Usage{Input: 7, Output: 3},
}

// Server is a running stand-in Gemini API.
type Server struct {
	*standin.Server
	h *handler
}

// Start starts one on 127.0.0.1; tb's cleanup closes it.
func Start(tb testing.TB) *Server {
	h := newHandler()
	return &Server{standin.Start(tb, h), h}
}

// Listen starts one on 127.0.0.1; Close stops it.
func Listen() (*Server, error) {
	h := newHandler()
	s, err := standin.Listen(h)
	if err != nil {
		return nil, err
	}
	return &Server{s, h}, nil
}

// Route sets the reply to JSON-mode (routing) requests.
func (s *Server) Route(r Reply) {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	s.h.route = r
}

// Calls returns the generateContent and streamGenerateContent requests
// received, in order; routing tells which asked for JSON.
func (s *Server) Calls() (calls []standin.Request, routing []bool) {
	for _, r := range s.Requests() {
		if _, method, ok := parsePath(r.Path); ok && r.Method == http.MethodPost && (method == "generateContent" || method == "streamGenerateContent") {
			calls = append(calls, r)
			routing = append(routing, wantsJSON(r))
		}
	}
	return calls, routing
}

type handler struct {
	ids   atomic.Int64
	mu    sync.Mutex
	route Reply
}

func newHandler() *handler { return &handler{route: DefaultRoute} }

func (h *handler) id() string { return fmt.Sprintf("standin%06d", h.ids.Add(1)) }

// parsePath splits /v1beta/models/{model}:{method}.
func parsePath(p string) (model, method string, ok bool) {
	for _, prefix := range []string{"/v1beta/models/", "/v1/models/", "/v1alpha/models/"} {
		if rest, found := strings.CutPrefix(p, prefix); found {
			i := strings.LastIndexByte(rest, ':')
			if i <= 0 {
				return "", "", false
			}
			return rest[:i], rest[i+1:], true
		}
	}
	return "", "", false
}

func wantsJSON(r standin.Request) bool {
	var body struct {
		GenerationConfig struct {
			ResponseMimeType string `json:"responseMimeType"`
		} `json:"generationConfig"`
	}
	_ = json.Unmarshal(r.Body, &body)
	return body.GenerationConfig.ResponseMimeType == "application/json"
}

func statusName(code int) string {
	switch code {
	case 400:
		return "INVALID_ARGUMENT"
	case 401:
		return "UNAUTHENTICATED"
	case 403:
		return "PERMISSION_DENIED"
	case 404:
		return "NOT_FOUND"
	case 429:
		return "RESOURCE_EXHAUSTED"
	case 503:
		return "UNAVAILABLE"
	}
	return "INTERNAL"
}

func fail(w http.ResponseWriter, status int, msg string) {
	standin.JSON(w, status, map[string]any{"error": map[string]any{"code": status, "message": msg, "status": statusName(status)}})
}

func (h *handler) Serve(w http.ResponseWriter, r *http.Request, req standin.Request, next func() Reply, done <-chan struct{}) {
	model, method, ok := parsePath(r.URL.Path)
	if !ok || r.Method != http.MethodPost {
		fail(w, 404, "stand-in: no route "+r.Method+" "+r.URL.Path)
		return
	}
	if req.JSON == nil {
		fail(w, 400, "stand-in: the body must be a JSON object")
		return
	}
	model = strings.TrimPrefix(model, "models/")
	switch method {
	case "countTokens":
		standin.JSON(w, 200, map[string]any{"totalTokens": len(req.Body)/4 + 1})
		return
	case "generateContent", "streamGenerateContent":
	default:
		fail(w, 404, "stand-in: no method "+method)
		return
	}
	var rep Reply
	if wantsJSON(req) {
		h.mu.Lock()
		rep = h.route
		h.mu.Unlock()
	} else {
		rep = next()
	}
	if rep.Status != 0 {
		if !standin.Wait(r, done, rep.Delay) {
			return
		}
		msg := rep.Error
		if msg == "" {
			msg = http.StatusText(rep.Status)
		}
		fail(w, rep.Status, msg)
		return
	}
	if rep.Model != "" {
		model = rep.Model
	}
	if method == "streamGenerateContent" {
		h.stream(w, r, done, rep, model)
		return
	}
	if !standin.Wait(r, done, rep.Delay) {
		return
	}
	var parts []map[string]any
	if rep.Thinking != "" {
		parts = append(parts, map[string]any{"text": rep.Thinking, "thought": true})
	}
	if rep.Text != "" {
		parts = append(parts, map[string]any{"text": rep.Text})
	}
	if rep.Tool != nil {
		parts = append(parts, call(rep.Tool))
	}
	standin.JSON(w, 200, h.chunk(parts, finish(rep), usage(rep.Usage), model))
}

func finish(rep Reply) string {
	if rep.StopReason != "" {
		return rep.StopReason
	}
	return "STOP"
}

func call(t *ToolCall) map[string]any {
	args := t.Input
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	fc := map[string]any{"name": t.Name, "args": args}
	if t.ID != "" {
		fc["id"] = t.ID
	}
	return map[string]any{"functionCall": fc}
}

// usage is usageMetadata: thoughts are counted apart from candidates.
func usage(u Usage) map[string]any {
	prompt := u.Input + u.CacheRead
	cand := u.Output - u.Reasoning
	m := map[string]any{
		"promptTokenCount":     prompt,
		"candidatesTokenCount": cand,
		"totalTokenCount":      prompt + u.Output,
	}
	if u.CacheRead > 0 {
		m["cachedContentTokenCount"] = u.CacheRead
	}
	if u.Reasoning > 0 {
		m["thoughtsTokenCount"] = u.Reasoning
	}
	return m
}

func (h *handler) chunk(parts []map[string]any, finishReason string, usage map[string]any, model string) map[string]any {
	cand := map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "index": 0}
	if parts == nil {
		cand["content"] = map[string]any{"role": "model", "parts": []any{}}
	}
	if finishReason != "" {
		cand["finishReason"] = finishReason
	}
	c := map[string]any{"candidates": []any{cand}, "modelVersion": model, "responseId": h.id()}
	if usage != nil {
		c["usageMetadata"] = usage
	}
	return c
}

func (h *handler) stream(w http.ResponseWriter, r *http.Request, done <-chan struct{}, rep Reply, model string) {
	st := standin.NewStream(w, r, done, rep.Delay)
	send := func(parts ...map[string]any) error { return st.Event("", h.chunk(parts, "", nil, model)) }
	for _, p := range standin.Pieces(rep.Thinking) {
		if send(map[string]any{"text": p, "thought": true}) != nil {
			return
		}
	}
	pieces := standin.Pieces(rep.Text)
	for i, p := range pieces {
		if i == len(pieces)-1 && rep.Tool == nil && !rep.Hang {
			break // the last piece goes with the finish reason
		}
		if send(map[string]any{"text": p}) != nil {
			return
		}
		if rep.Hang {
			_ = st.Hang()
			return
		}
	}
	if rep.Hang {
		_ = st.Hang()
		return
	}
	var last []map[string]any
	if rep.Tool != nil {
		last = append(last, call(rep.Tool))
	} else if len(pieces) > 0 {
		last = append(last, map[string]any{"text": pieces[len(pieces)-1]})
	}
	_ = st.Event("", h.chunk(last, finish(rep), usage(rep.Usage), model))
}

// Text returns the last text part of the last user turn of a request's
// contents.
func Text(r standin.Request) string {
	var body struct {
		Contents []struct {
			Role  string `json:"role"`
			Parts []struct {
				Text string `json:"text"`
			} `json:"parts"`
		} `json:"contents"`
	}
	_ = json.Unmarshal(r.Body, &body)
	for i := len(body.Contents) - 1; i >= 0; i-- {
		if c := body.Contents[i]; c.Role == "user" {
			for j := len(c.Parts) - 1; j >= 0; j-- {
				if c.Parts[j].Text != "" {
					return c.Parts[j].Text
				}
			}
		}
	}
	return ""
}
