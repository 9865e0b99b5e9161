// Package anthropic is a stand-in Anthropic Messages API for tests: POST
// /v1/messages (also with ?beta=true, as Claude Code sends it), streamed as
// the documented server-sent events message_start, content_block_start /
// content_block_delta / content_block_stop for thinking, text and tool_use
// blocks, message_delta with the stop reason and usage, message_stop; or
// whole, as one message object. HEAD / answers 200 (Claude Code's
// connectivity check) and /v1/messages/count_tokens counts roughly.
package anthropic

import (
	"encoding/json"
	"fmt"
	"net/http"
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

// Server is a running stand-in Messages API.
type Server struct {
	*standin.Server
}

// Start starts one on 127.0.0.1; tb's cleanup closes it.
func Start(tb testing.TB) *Server {
	return &Server{standin.Start(tb, &handler{})}
}

// Listen starts one on 127.0.0.1; Close stops it.
func Listen() (*Server, error) {
	s, err := standin.Listen(&handler{})
	if err != nil {
		return nil, err
	}
	return &Server{s}, nil
}

// Messages returns the POST /v1/messages requests received, in order.
func (s *Server) Messages() []standin.Request {
	return s.RequestsTo(http.MethodPost, "/v1/messages")
}

type handler struct{ ids atomic.Int64 }

func (h *handler) id(prefix string) string {
	return fmt.Sprintf("%s_standin%06d", prefix, h.ids.Add(1))
}

// errorType is the documented error type for an HTTP status.
func errorType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	return "api_error"
}

func fail(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("request-id", "req_standin")
	standin.JSON(w, status, map[string]any{
		"type":       "error",
		"error":      map[string]any{"type": errorType(status), "message": msg},
		"request_id": "req_standin",
	})
}

func (h *handler) Serve(w http.ResponseWriter, r *http.Request, req standin.Request, next func() Reply, done <-chan struct{}) {
	switch {
	case r.URL.Path == "/" && (r.Method == http.MethodHead || r.Method == http.MethodGet):
		w.WriteHeader(http.StatusOK)
	case r.URL.Path == "/v1/messages/count_tokens" && r.Method == http.MethodPost:
		standin.JSON(w, 200, map[string]any{"input_tokens": len(req.Body)/4 + 1})
	case r.URL.Path == "/v1/messages" && r.Method == http.MethodPost:
		var body struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		if err := json.Unmarshal(req.Body, &body); err != nil || body.Model == "" {
			fail(w, 400, "stand-in: the body must be a JSON object with a model")
			return
		}
		rep := next()
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
		model := rep.Model
		if model == "" {
			model = body.Model
		}
		if body.Stream {
			h.stream(w, r, done, rep, model)
			return
		}
		if !standin.Wait(r, done, rep.Delay) {
			return
		}
		standin.JSON(w, 200, h.message(rep, model))
	default:
		fail(w, 404, "stand-in: no route "+r.Method+" "+r.URL.Path)
	}
}

func stopReason(rep Reply) string {
	if rep.StopReason != "" {
		return rep.StopReason
	}
	if rep.Tool != nil {
		return "tool_use"
	}
	return "end_turn"
}

func (h *handler) toolID(t *ToolCall) string {
	if t.ID != "" {
		return t.ID
	}
	return h.id("toolu")
}

func input(t *ToolCall) json.RawMessage {
	if len(t.Input) == 0 {
		return json.RawMessage(`{}`)
	}
	return t.Input
}

func usage(u Usage) map[string]any {
	return map[string]any{
		"input_tokens":                u.Input,
		"cache_creation_input_tokens": u.CacheWrite,
		"cache_read_input_tokens":     u.CacheRead,
		"output_tokens":               u.Output,
	}
}

const signature = "c3RhbmQtaW4gc2lnbmF0dXJl" // any opaque base64 will do

// message is the non-streaming response.
func (h *handler) message(rep Reply, model string) map[string]any {
	content := []map[string]any{}
	if rep.Thinking != "" {
		content = append(content, map[string]any{"type": "thinking", "thinking": rep.Thinking, "signature": signature})
	}
	if rep.Text != "" {
		content = append(content, map[string]any{"type": "text", "text": rep.Text})
	}
	if rep.Tool != nil {
		content = append(content, map[string]any{"type": "tool_use", "id": h.toolID(rep.Tool), "name": rep.Tool.Name, "input": input(rep.Tool)})
	}
	return map[string]any{
		"id": h.id("msg"), "type": "message", "role": "assistant", "model": model,
		"content": content, "stop_reason": stopReason(rep), "stop_sequence": nil,
		"usage": usage(rep.Usage),
	}
}

func (h *handler) stream(w http.ResponseWriter, r *http.Request, done <-chan struct{}, rep Reply, model string) {
	w.Header().Set("request-id", "req_standin")
	st := standin.NewStream(w, r, done, rep.Delay)
	start := usage(rep.Usage)
	start["output_tokens"] = 1 // as the API does: the final count comes in message_delta
	ev := func(name string, v map[string]any) error {
		v["type"] = name
		return st.Event(name, v)
	}
	if ev("message_start", map[string]any{"message": map[string]any{
		"id": h.id("msg"), "type": "message", "role": "assistant", "model": model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": start,
	}}) != nil {
		return
	}
	if ev("ping", map[string]any{}) != nil {
		return
	}
	idx := 0
	block := func(cb map[string]any, deltas []map[string]any) error {
		if err := ev("content_block_start", map[string]any{"index": idx, "content_block": cb}); err != nil {
			return err
		}
		for _, d := range deltas {
			if err := ev("content_block_delta", map[string]any{"index": idx, "delta": d}); err != nil {
				return err
			}
		}
		err := ev("content_block_stop", map[string]any{"index": idx})
		idx++
		return err
	}
	if rep.Thinking != "" {
		var ds []map[string]any
		for _, p := range standin.Pieces(rep.Thinking) {
			ds = append(ds, map[string]any{"type": "thinking_delta", "thinking": p})
		}
		ds = append(ds, map[string]any{"type": "signature_delta", "signature": signature})
		if block(map[string]any{"type": "thinking", "thinking": "", "signature": ""}, ds) != nil {
			return
		}
	}
	if rep.Text != "" {
		pieces := standin.Pieces(rep.Text)
		if rep.StreamError != "" {
			if ev("content_block_start", map[string]any{"index": idx, "content_block": map[string]any{"type": "text", "text": ""}}) != nil {
				return
			}
			if ev("content_block_delta", map[string]any{"index": idx, "delta": map[string]any{"type": "text_delta", "text": pieces[0]}}) != nil {
				return
			}
			_ = st.Event("error", map[string]any{"type": "error", "error": map[string]any{"type": rep.StreamError, "message": "stand-in: the stream broke off"}})
			return
		}
		if rep.Hang {
			if ev("content_block_start", map[string]any{"index": idx, "content_block": map[string]any{"type": "text", "text": ""}}) != nil {
				return
			}
			if ev("content_block_delta", map[string]any{"index": idx, "delta": map[string]any{"type": "text_delta", "text": pieces[0]}}) != nil {
				return
			}
			_ = st.Hang()
			return
		}
		var ds []map[string]any
		for _, p := range pieces {
			ds = append(ds, map[string]any{"type": "text_delta", "text": p})
		}
		if block(map[string]any{"type": "text", "text": ""}, ds) != nil {
			return
		}
	} else if rep.Hang {
		_ = st.Hang()
		return
	}
	if rep.Tool != nil {
		in := string(input(rep.Tool))
		var ds []map[string]any
		for len(in) > 0 {
			n := min(len(in), 8)
			ds = append(ds, map[string]any{"type": "input_json_delta", "partial_json": in[:n]})
			in = in[n:]
		}
		if block(map[string]any{"type": "tool_use", "id": h.toolID(rep.Tool), "name": rep.Tool.Name, "input": map[string]any{}}, ds) != nil {
			return
		}
	}
	if ev("message_delta", map[string]any{
		"delta": map[string]any{"stop_reason": stopReason(rep), "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": rep.Usage.Output},
	}) != nil {
		return
	}
	_ = ev("message_stop", map[string]any{})
}

// Text returns the text of the last user turn of a Messages request: its
// string content, or its last text block (Claude Code puts its system
// reminders in blocks before the prompt).
func Text(r standin.Request) string {
	var body struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(r.Body, &body) != nil {
		return ""
	}
	for i := len(body.Messages) - 1; i >= 0; i-- {
		m := body.Messages[i]
		if m.Role != "user" {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			return s
		}
		var blocks []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		_ = json.Unmarshal(m.Content, &blocks)
		for j := len(blocks) - 1; j >= 0; j-- {
			if blocks[j].Type == "text" {
				return blocks[j].Text
			}
		}
		return ""
	}
	return ""
}
