package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"iop/application/edge"
	"iop/domain"
	"iop/internal/jsonwords"
	"iop/ports"
)

// createRunRequest is the body of POST /v1/runs.
type createRunRequest struct {
	Node       string          `json:"node"`
	Adapter    string          `json:"adapter"`
	Target     string          `json:"target"`
	Input      json.RawMessage `json:"input"`
	SessionID  string          `json:"session_id"`
	Background bool            `json:"background"`
	Options    json.RawMessage `json:"options"`
}

// decodeBody decodes a JSON body strictly into v, a pointer to a struct:
// unknown fields, fields not spelt exactly as documented or named twice
// (exactKeys), a body that is not an object, trailing data and bodies over
// maxBody are invalid requests.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return domain.Errorf(domain.CodeInvalidRequest, "request body exceeds %d bytes", tooBig.Limit)
		}
		return domain.Errorf(domain.CodeInvalidRequest, "request body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return domain.Errorf(domain.CodeInvalidRequest, "request body is empty")
		}
		return domain.Errorf(domain.CodeInvalidRequest, "request body: %s", jsonProblem(err))
	}
	// More is false before a stray '}' or ']' too: only the end of the
	// body ends it.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return domain.Errorf(domain.CodeInvalidRequest, "request body: unexpected data after the JSON object")
	}
	return exactKeys(body, v)
}

// exactKeys checks the top-level keys of body, a JSON value v decoded
// without error: body must be an object, and each key spelt as one of v's
// fields is (after JSON's escapes) and named once. encoding/json matches
// keys case-insensitively and keeps the last of a key named twice, so
// {"node":"a","NODE":"b"} and {"node":"a","node":"b"} ran on node b while
// whatever read the body as JSON before the edge (a proxy's rule, an audit
// log) saw node a.
func exactKeys(body []byte, v any) error {
	fields := jsonFieldsOf(reflect.TypeOf(v).Elem())
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		// Decoded without error: null, which leaves v as it was.
		return domain.Errorf(domain.CodeInvalidRequest, "request body: expected a JSON object, got null")
	}
	seen := make([]bool, len(fields))
	var skip json.RawMessage // reused: a value's bytes are only skipped
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return domain.Errorf(domain.CodeInvalidRequest, "request body: %s", jsonProblem(err))
		}
		key, _ := t.(string)
		at := slices.Index(fields, key)
		switch {
		case at < 0:
			i := slices.IndexFunc(fields, func(f string) bool { return strings.EqualFold(f, key) })
			return domain.Errorf(domain.CodeInvalidRequest, "request body: unknown field %q (did you mean %q? field names are case-sensitive)", key, fields[max(i, 0)])
		case seen[at]:
			return domain.Errorf(domain.CodeInvalidRequest, "request body: field %q is given twice", key)
		}
		seen[at] = true
		if err := dec.Decode(&skip); err != nil {
			return domain.Errorf(domain.CodeInvalidRequest, "request body: %s", jsonProblem(err))
		}
	}
	return nil
}

// fieldNames caches jsonFields by type: the few request types are read
// on every request.
var fieldNames sync.Map // reflect.Type -> []string

// jsonFieldsOf is jsonFields(t), computed once per type.
func jsonFieldsOf(t reflect.Type) []string {
	if f, ok := fieldNames.Load(t); ok {
		return f.([]string)
	}
	f, _ := fieldNames.LoadOrStore(t, jsonFields(t))
	return f.([]string)
}

// jsonFields are the JSON names of struct type t's fields.
func jsonFields(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case name == "":
			names = append(names, f.Name)
		default:
			names = append(names, name)
		}
	}
	return names
}

// runInput is a run's input as the node gets it: a JSON string is its text;
// a JSON object (such as {"messages":[…]}) is passed on as JSON.
func runInput(raw json.RawMessage) ([]byte, error) {
	t := bytes.TrimSpace(raw)
	switch {
	case len(t) == 0 || bytes.Equal(t, []byte("null")):
		return nil, nil
	case t[0] == '"':
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return nil, domain.Errorf(domain.CodeInvalidRequest, "input: %v", err)
		}
		return []byte(s), nil
	case t[0] == '{':
		return t, nil
	}
	return nil, domain.Errorf(domain.CodeInvalidRequest, "input must be a string or a JSON object")
}

// jsonProblem words a decoding error in the caller's terms (the field and
// the JSON type expected), never in Go's.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		want := jsonwords.Kind(te.Type)
		if te.Field == "" {
			return fmt.Sprintf("expected %s, got %s", want, jsonwords.WithArticle(te.Value))
		}
		return fmt.Sprintf("%s: expected %s, got %s", te.Field, want, jsonwords.WithArticle(te.Value))
	case errors.As(err, &se):
		return fmt.Sprintf("invalid JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the JSON ends too early"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// isObjectOrNull reports whether raw is absent, null or a JSON object.
func isObjectOrNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null")) || t[0] == '{'
}

func (s *Server) handleCreateRun(w http.ResponseWriter, r *http.Request) {
	var req createRunRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if !isObjectOrNull(req.Options) {
		writeError(w, domain.Errorf(domain.CodeInvalidRequest, "options must be a JSON object"))
		return
	}
	var opts []byte
	if t := bytes.TrimSpace(req.Options); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		opts = t
	}
	input, err := runInput(req.Input)
	if err != nil {
		writeError(w, err)
		return
	}
	rh, err := s.deps.Submit.Handle(r.Context(), edge.SubmitRun{
		Node: req.Node, Adapter: req.Adapter, Target: req.Target, Input: input,
		SessionID: req.SessionID, Background: req.Background, Options: opts,
	})
	if err != nil {
		writeError(w, err)
		return
	}
	if rh.Background {
		w.Header().Set(headerRunID, rh.RunID)
		w.Header().Set(headerNode, rh.Node)
		writeJSON(w, http.StatusAccepted, map[string]string{"run_id": rh.RunID, "node": rh.Node})
		return
	}
	s.streamRun(w, r, rh)
}

// streamRun relays a foreground run as SSE. This goroutine is the handle's
// one consumer: it calls Next itself (no pump goroutine, so an event costs
// no hand-off between goroutines), bounded by a wait context per keep-alive
// period, and Close runs after it is done. A client that leaves (or a
// server that stops) closes the handle, which cancels the run on its node.
func (s *Server) streamRun(w http.ResponseWriter, r *http.Request, rh *edge.RunHandle) {
	ctx, cancel := s.streamContext(r)
	defer cancel()
	defer func() {
		// A run not over yet is cancelled for what cut its stream: the
		// edge's stop (its caller is told shutting_down), or else its
		// caller going away.
		if s.shuttingDown(r) {
			rh.CloseFor(edge.CancelEdgeStopping)
			return
		}
		rh.Close()
	}()

	// The headers go out with the first event (the run's start, at hand),
	// or alone before the first wait.
	sse := s.openSSE(w, map[string]string{"X-IOP-Run-ID": rh.RunID, "X-IOP-Node": rh.Node})
	var lastSeq uint64
	for {
		wait, stopWait := context.WithTimeout(ctx, s.keepAlive())
		quiet := s.relayRunEvents(ctx, wait, r, sse, rh, &lastSeq)
		stopWait()
		if !quiet || sse.keepAlive() != nil {
			return
		}
	}
}

// relayRunEvents relays rh's events until wait (a keep-alive period of ctx)
// ends, which it reports as quiet; false means the stream is over. Events
// already queued are written together and flushed once (at most
// runEventBurst at a time); the stream is flushed before every wait, so an
// event never waits for the next one. The terminal event is left for the
// server to flush as the handler returns (see below).
func (s *Server) relayRunEvents(ctx, wait context.Context, r *http.Request, sse *sseWriter, rh *edge.RunHandle, lastSeq *uint64) (quiet bool) {
	for n := 0; ; n++ {
		ev, err := rh.Next(ports.ReadyOnly)
		if err != nil || n == runEventBurst {
			if sse.unflushed && sse.flush() != nil {
				return false
			}
			n = 0
		}
		if err != nil {
			if ev, err = rh.Next(wait); err != nil {
				if ctx.Err() == nil && wait.Err() != nil {
					return true
				}
				s.endRunStream(r, sse, rh, *lastSeq) // the caller left, the server stops, or the stream ended
				return false
			}
		}
		*lastSeq = ev.Seq
		if err := sse.writeRunEvent(rh.Node, ev); err != nil {
			return false
		}
		if ev.Type.Terminal() {
			// Not flushed here: the handler returns at once and the server
			// sends what is buffered together with the response's end (the
			// chunked terminator), one write instead of two per run.
			return false
		}
	}
}

// runEventBurst is the most events written before a flush.
const runEventBurst = 16

// endRunStream tells a caller still connected why its stream ends early.
func (s *Server) endRunStream(r *http.Request, sse *sseWriter, rh *edge.RunHandle, lastSeq uint64) {
	if !s.shuttingDown(r) {
		return
	}
	ev := domain.RunEvent{RunID: rh.RunID, Seq: lastSeq + 1, Type: domain.EventError,
		Error: &domain.ErrorInfo{Code: domain.CodeShuttingDown, Message: "the edge is shutting down; the run is cancelled"}}
	_ = sse.eventJSON(string(ev.Type), toRunEventJSON(rh.Node, ev))
}

func (s *Server) handleNodeRun(w http.ResponseWriter, r *http.Request) {
	raw, err := s.deps.GetRun.Handle(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeRawJSON(w, http.StatusOK, raw)
}

type nodeErrorJSON struct {
	Node    string `json:"node"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

type runListJSON struct {
	Runs   []json.RawMessage `json:"runs"`
	Errors []nodeErrorJSON   `json:"errors,omitempty"`
}

func (s *Server) handleListRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var limit int
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, domain.Errorf(domain.CodeInvalidRequest, "limit must be a non-negative integer, not %q", v))
			return
		}
		limit = n
	}
	list, err := s.deps.ListRuns.Handle(r.Context(), edge.ListRuns{Node: q.Get("node"), Status: q.Get("status"), Limit: limit})
	if err != nil {
		writeError(w, err)
		return
	}
	out := runListJSON{Runs: list.Runs}
	for _, f := range list.Failures {
		out.Errors = append(out.Errors, nodeErrorJSON{Node: f.Node, Code: domain.CodeOf(f.Err), Message: domain.MessageOf(f.Err)})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleCancelRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	node, err := s.deps.Cancel.Handle(r.Context(), id)
	if node != "" {
		w.Header().Set(headerNode, node)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"run_id": id, "node": node, "status": "cancelling"})
}

func (s *Server) handleEndSession(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cmd := edge.TerminateSession{Node: q.Get("node"), Adapter: q.Get("adapter"), Target: q.Get("target"), SessionID: r.PathValue("session_id")}
	if cmd.Adapter == "" {
		writeError(w, domain.Errorf(domain.CodeInvalidRequest, "query parameter adapter is required"))
		return
	}
	if err := s.deps.Terminate.Handle(r.Context(), cmd); err != nil {
		writeError(w, err)
		return
	}
	node := cmd.Node
	if node == "" {
		// The use case picked the only connected node; name it if that is
		// still unambiguous.
		if nodes := s.deps.Registry.ListAs(domain.PrincipalFrom(r.Context())); len(nodes) == 1 {
			node = nodes[0].ID
		}
	}
	writeJSON(w, http.StatusOK, struct {
		SessionID  string `json:"session_id"`
		Node       string `json:"node,omitempty"`
		Adapter    string `json:"adapter"`
		Target     string `json:"target,omitempty"`
		Terminated bool   `json:"terminated"`
	}{cmd.SessionID, node, cmd.Adapter, cmd.Target, true})
}
