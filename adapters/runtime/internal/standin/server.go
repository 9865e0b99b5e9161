package standin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// Request is what a stand-in server received.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Raw    []byte
	Body   map[string]json.RawMessage // Raw decoded, when it is a JSON object
}

// Server is a stand-in upstream that records every request and answers
// with a handler. It is closed when the test ends.
type Server struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []Request
}

// NewServer starts a stand-in answering with handle; the request body has
// been read (and recorded) before handle runs.
func NewServer(t *testing.T, handle http.HandlerFunc) *Server {
	t.Helper()
	s := &Server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		req := Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Raw: raw}
		_ = json.Unmarshal(raw, &req.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, req)
		s.mu.Unlock()
		handle(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// Request returns the i-th request received (from 0).
func (s *Server) Request(t *testing.T, i int) Request {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= len(s.reqs) {
		t.Fatalf("the stand-in received %d requests, want more than %d", len(s.reqs), i)
	}
	return s.reqs[i]
}

// Count returns how many requests were received.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}
