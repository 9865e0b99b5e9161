// Package standin is the shared core of the stand-in model APIs under
// test/standin/<vendor>: a loopback HTTP server that records every request
// it receives, raw, and answers each model request with a scripted Reply
// (text, thinking, a tool call, usage, a delay, a hang, or an HTTP failure).
// The vendor packages turn a Reply into their own documented wire format;
// they are what the real agent CLIs talk to in the end-to-end tests, so
// that no test reaches past loopback.
package standin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// Reply is what a stand-in answers to one model request.
type Reply struct {
	Text     string    // the answer, streamed in small pieces
	Thinking string    // reasoning before the answer ("" for none)
	Tool     *ToolCall // a tool call after the text (nil for none)
	Usage    Usage
	// Model is the model the reply names; "" names the requested one.
	Model string
	// StopReason overrides the vendor's natural stop reason.
	StopReason string
	// Delay pauses before every streamed piece (and before a whole reply).
	Delay time.Duration
	// Hang makes a streamed reply stop after its first text piece and wait
	// until the client goes away (or the server closes).
	Hang bool
	// StreamError makes a streamed reply end after its first text piece
	// with an error event of this type (e.g. "overloaded_error"), as an
	// API that fails mid-answer does; the anthropic stand-in only.
	StreamError string
	// Status, when non-zero, fails the request with this HTTP status and
	// the vendor's error body carrying Error.
	Status int
	Error  string
}

// ToolCall is a tool the model asks the client to run.
type ToolCall struct {
	ID    string          // "" for a generated one
	Name  string          // the tool's name as the client declared it
	Input json.RawMessage // the arguments, a JSON object
}

// Usage is the token accounting a reply reports.
type Usage struct {
	Input      int // prompt tokens not read from a cache
	Output     int
	CacheRead  int // prompt tokens read from a cache
	CacheWrite int // prompt tokens written to a cache (Anthropic)
	Reasoning  int // of Output, spent thinking (reported where the vendor does)
}

// Request is one request as received.
type Request struct {
	Method string
	Path   string
	Query  string // raw query, without '?'
	Header http.Header
	Body   []byte
	// JSON is Body decoded, when it is a JSON object.
	JSON map[string]json.RawMessage
	// At is when it arrived.
	At time.Time
}

// Field decodes the top-level JSON field name into v; false if absent or
// not decodable.
func (r Request) Field(name string, v any) bool {
	raw, ok := r.JSON[name]
	return ok && json.Unmarshal(raw, v) == nil
}

// Script picks the reply to the n-th model request (n counts from 0 over
// the requests this server passed to the script).
type Script func(n int, r Request) Reply

// Handler serves one vendor's API: next returns the scripted reply for a
// model request (and counts it); requests are recorded before Serve runs.
type Handler interface {
	Serve(w http.ResponseWriter, r *http.Request, req Request, next func() Reply, done <-chan struct{})
}

// Server is a running stand-in.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:port (no trailing slash).
	URL string

	srv  *http.Server
	ln   net.Listener
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	mu     sync.Mutex
	reqs   []Request
	queue  []Reply
	def    Reply
	script Script
	n      int
}

// Start starts h on 127.0.0.1 on a free port; tb's cleanup closes it.
func Start(tb testing.TB, h Handler) *Server {
	tb.Helper()
	s, err := Listen(h)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Listen starts h on 127.0.0.1 on a free port; Close stops it.
func Listen(h Handler) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + ln.Addr().String(), ln: ln, done: make(chan struct{}), def: Reply{Text: "ok", Usage: Usage{Input: 10, Output: 1}}}
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serve(h, w, r) }),
		ReadHeaderTimeout: 10 * time.Second,
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

func (s *Server) serve(h Handler, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	req := Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: body, At: time.Now()}
	_ = json.Unmarshal(body, &req.JSON)
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	h.Serve(w, r, req, func() Reply { return s.next(req) }, s.done)
}

func (s *Server) next(req Request) Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.n
	s.n++
	if s.script != nil {
		return s.script(n, req)
	}
	if len(s.queue) > 0 {
		r := s.queue[0]
		s.queue = s.queue[1:]
		return r
	}
	return s.def
}

// Close stops the server: hanging replies end, connections are closed.
func (s *Server) Close() {
	s.once.Do(func() {
		close(s.done)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			_ = s.srv.Close()
		}
		s.wg.Wait()
	})
}

// Reply sets the answer to every model request not otherwise scripted.
func (s *Server) Reply(r Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.def = r
}

// Queue adds replies for the next model requests, one each, in order;
// once they are used up the Reply default answers.
func (s *Server) Queue(rs ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, rs...)
}

// Script makes f pick every reply (Queue and Reply are then ignored).
func (s *Server) Script(f Script) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = f
}

// Requests returns every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// RequestsTo returns the requests received with method on path, in order.
func (s *Server) RequestsTo(method, path string) []Request {
	var out []Request
	for _, r := range s.Requests() {
		if r.Method == method && r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// ModelRequests returns how many requests were answered from the script.
func (s *Server) ModelRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// Pieces splits text into the pieces a streamed reply sends: a few runes
// each, never cutting a rune. Joined, they are text.
func Pieces(text string) []string {
	var out []string
	for text != "" {
		n, i := 0, 0
		for i < len(text) && n < 4 {
			_, size := utf8.DecodeRuneInString(text[i:])
			i += size
			n++
		}
		out = append(out, text[:i])
		text = text[i:]
	}
	return out
}

// Stream writes server-sent events and flushes after each.
type Stream struct {
	w     http.ResponseWriter
	f     http.Flusher
	ctx   context.Context
	done  <-chan struct{}
	delay time.Duration
}

// ErrGone is returned once the client or the server has gone.
var ErrGone = errors.New("standin: client gone")

// NewStream starts an SSE response (200, text/event-stream).
func NewStream(w http.ResponseWriter, r *http.Request, done <-chan struct{}, delay time.Duration) *Stream {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	st := &Stream{w: w, f: f, ctx: r.Context(), done: done, delay: delay}
	st.flush()
	return st
}

func (st *Stream) flush() {
	if st.f != nil {
		st.f.Flush()
	}
}

// Event writes one event: "event: name" (omitted when name is "") and
// "data: " + v as JSON, after the stream's delay.
func (st *Stream) Event(name string, v any) error {
	if err := st.Pause(st.delay); err != nil {
		return err
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var b strings.Builder
	if name != "" {
		b.WriteString("event: " + name + "\n")
	}
	b.WriteString("data: " + string(data) + "\n\n")
	if _, err := io.WriteString(st.w, b.String()); err != nil {
		return ErrGone
	}
	st.flush()
	return nil
}

// Pause waits d, or returns ErrGone if the client or server goes first.
func (st *Stream) Pause(d time.Duration) error {
	if d <= 0 {
		select {
		case <-st.ctx.Done():
			return ErrGone
		case <-st.done:
			return ErrGone
		default:
			return nil
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-st.ctx.Done():
		return ErrGone
	case <-st.done:
		return ErrGone
	}
}

// Hang waits until the client or the server goes, and returns ErrGone.
func (st *Stream) Hang() error {
	select {
	case <-st.ctx.Done():
	case <-st.done:
	}
	return ErrGone
}

// Wait pauses d before a whole (non-streamed) reply; false if the client
// or server went first.
func Wait(r *http.Request, done <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	case <-done:
		return false
	}
}

// JSON writes v as a JSON response with status.
func JSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
