// Package responses is a stand-in OpenAI Responses API for tests: POST
// /v1/responses, streamed as the documented server-sent events
// (response.created, response.in_progress, response.output_item.added,
// reasoning summary deltas, response.output_text.delta,
// response.function_call_arguments.delta, response.output_item.done,
// response.completed carrying usage) or whole, as one response object.
// GET /v1/models lists the models replies name.
package responses

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"iop/test/standin"
)

// Reply, ToolCall and Usage are the shared script types.
type (
	Reply    = standin.Reply
	ToolCall = standin.ToolCall
	Usage    = standin.Usage
)

// Server is a running stand-in Responses API.
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

// Responses returns the POST /v1/responses requests received, in order.
func (s *Server) Responses() []standin.Request {
	return s.RequestsTo(http.MethodPost, "/v1/responses")
}

type handler struct{ ids atomic.Int64 }

func (h *handler) id(prefix string) string {
	return fmt.Sprintf("%s_standin%06d", prefix, h.ids.Add(1))
}

func errorType(status int) string {
	switch {
	case status == 401:
		return "invalid_api_key"
	case status == 429:
		return "rate_limit_exceeded"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

func fail(w http.ResponseWriter, status int, msg string) {
	standin.JSON(w, status, map[string]any{"error": map[string]any{
		"message": msg, "type": errorType(status), "param": nil, "code": nil,
	}})
}

func (h *handler) Serve(w http.ResponseWriter, r *http.Request, req standin.Request, next func() Reply, done <-chan struct{}) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		standin.JSON(w, 200, map[string]any{"object": "list", "data": []any{}})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/responses":
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
		resp := h.response(model, "completed")
		out, _ := h.items(rep)
		resp["output"] = out
		resp["usage"] = usage(rep.Usage)
		standin.JSON(w, 200, resp)
	default:
		fail(w, 404, "stand-in: no route "+r.Method+" "+r.URL.Path)
	}
}

func usage(u Usage) map[string]any {
	in := u.Input + u.CacheRead
	return map[string]any{
		"input_tokens":          in,
		"input_tokens_details":  map[string]any{"cached_tokens": u.CacheRead},
		"output_tokens":         u.Output,
		"output_tokens_details": map[string]any{"reasoning_tokens": u.Reasoning},
		"total_tokens":          in + u.Output,
	}
}

func (h *handler) response(model, status string) map[string]any {
	return map[string]any{
		"id": h.id("resp"), "object": "response", "created_at": time.Now().Unix(),
		"status": status, "model": model, "output": []any{}, "usage": nil,
		"error": nil, "incomplete_details": nil, "parallel_tool_calls": true,
	}
}

// item is one output item with the ids its events share.
type item struct {
	id, kind, text string
	tool           *ToolCall
	callID         string
}

// items returns the completed output items of rep, and their parts.
func (h *handler) items(rep Reply) ([]map[string]any, []item) {
	var its []item
	if rep.Thinking != "" {
		its = append(its, item{id: h.id("rs"), kind: "reasoning", text: rep.Thinking})
	}
	if rep.Text != "" {
		its = append(its, item{id: h.id("msg"), kind: "message", text: rep.Text})
	}
	if rep.Tool != nil {
		call := rep.Tool.ID
		if call == "" {
			call = h.id("call")
		}
		its = append(its, item{id: h.id("fc"), kind: "function_call", tool: rep.Tool, callID: call})
	}
	out := make([]map[string]any, len(its))
	for i, it := range its {
		out[i] = it.done()
	}
	return out, its
}

func args(t *ToolCall) string {
	if len(t.Input) == 0 {
		return "{}"
	}
	return string(t.Input)
}

func (it item) done() map[string]any {
	switch it.kind {
	case "reasoning":
		return map[string]any{"id": it.id, "type": "reasoning", "summary": []any{map[string]any{"type": "summary_text", "text": it.text}}}
	case "message":
		return map[string]any{"id": it.id, "type": "message", "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": it.text, "annotations": []any{}}}}
	}
	return map[string]any{"id": it.id, "type": "function_call", "status": "completed", "call_id": it.callID, "name": it.tool.Name, "arguments": args(it.tool)}
}

func (it item) added() map[string]any {
	switch it.kind {
	case "reasoning":
		return map[string]any{"id": it.id, "type": "reasoning", "summary": []any{}}
	case "message":
		return map[string]any{"id": it.id, "type": "message", "status": "in_progress", "role": "assistant", "content": []any{}}
	}
	return map[string]any{"id": it.id, "type": "function_call", "status": "in_progress", "call_id": it.callID, "name": it.tool.Name, "arguments": ""}
}

func (h *handler) stream(w http.ResponseWriter, r *http.Request, done <-chan struct{}, rep Reply, model string) {
	st := standin.NewStream(w, r, done, rep.Delay)
	seq := 0
	ev := func(name string, v map[string]any) error {
		v["type"] = name
		v["sequence_number"] = seq
		seq++
		return st.Event(name, v)
	}
	resp := h.response(model, "in_progress")
	if ev("response.created", map[string]any{"response": resp}) != nil || ev("response.in_progress", map[string]any{"response": resp}) != nil {
		return
	}
	out, its := h.items(rep)
	for i, it := range its {
		if ev("response.output_item.added", map[string]any{"output_index": i, "item": it.added()}) != nil {
			return
		}
		switch it.kind {
		case "reasoning":
			part := map[string]any{"item_id": it.id, "output_index": i, "summary_index": 0}
			with := func(k string, v any) map[string]any {
				m := map[string]any{k: v}
				for k, v := range part {
					m[k] = v
				}
				return m
			}
			if ev("response.reasoning_summary_part.added", with("part", map[string]any{"type": "summary_text", "text": ""})) != nil {
				return
			}
			for _, p := range standin.Pieces(it.text) {
				if ev("response.reasoning_summary_text.delta", with("delta", p)) != nil {
					return
				}
			}
			if ev("response.reasoning_summary_text.done", with("text", it.text)) != nil ||
				ev("response.reasoning_summary_part.done", with("part", map[string]any{"type": "summary_text", "text": it.text})) != nil {
				return
			}
		case "message":
			part := func() map[string]any {
				return map[string]any{"item_id": it.id, "output_index": i, "content_index": 0}
			}
			added := part()
			added["part"] = map[string]any{"type": "output_text", "text": "", "annotations": []any{}}
			if ev("response.content_part.added", added) != nil {
				return
			}
			for j, p := range standin.Pieces(it.text) {
				d := part()
				d["delta"] = p
				d["logprobs"] = []any{}
				if ev("response.output_text.delta", d) != nil {
					return
				}
				if j == 0 && rep.Hang {
					_ = st.Hang()
					return
				}
			}
			d := part()
			d["text"] = it.text
			d["logprobs"] = []any{}
			if ev("response.output_text.done", d) != nil {
				return
			}
			pd := part()
			pd["part"] = map[string]any{"type": "output_text", "text": it.text, "annotations": []any{}}
			if ev("response.content_part.done", pd) != nil {
				return
			}
		case "function_call":
			a := args(it.tool)
			for len(a) > 0 {
				n := min(len(a), 8)
				if ev("response.function_call_arguments.delta", map[string]any{"item_id": it.id, "output_index": i, "delta": a[:n]}) != nil {
					return
				}
				a = a[n:]
			}
			if ev("response.function_call_arguments.done", map[string]any{"item_id": it.id, "output_index": i, "arguments": args(it.tool)}) != nil {
				return
			}
		}
		if ev("response.output_item.done", map[string]any{"output_index": i, "item": out[i]}) != nil {
			return
		}
	}
	if rep.Hang && rep.Text == "" {
		_ = st.Hang()
		return
	}
	resp["status"] = "completed"
	resp["output"] = out
	resp["usage"] = usage(rep.Usage)
	_ = ev("response.completed", map[string]any{"response": resp})
}
