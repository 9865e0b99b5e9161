package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// sseWriter writes server-sent events, flushing after each one. Each write
// must complete within idle (when positive), so a client that stops reading
// ends the stream with an error instead of blocking it forever.
type sseWriter struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	idle time.Duration
}

// startSSE sends the stream's headers (plus any extra ones) and flushes
// them, so the client learns at once that the stream is open. Every write
// of the stream, this one included, is bounded by the server's
// WriteIdleTimeout.
func (srv *Server) startSSE(w http.ResponseWriter, extra map[string]string) (*sseWriter, error) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	for k, v := range extra {
		h.Set(k, v)
	}
	s := &sseWriter{w: w, rc: http.NewResponseController(w), idle: srv.WriteIdleTimeout}
	s.deadline()
	w.WriteHeader(http.StatusOK)
	return s, s.rc.Flush()
}

// deadline gives the next write idle to complete.
func (s *sseWriter) deadline() {
	if s.idle > 0 {
		_ = s.rc.SetWriteDeadline(time.Now().Add(s.idle))
	}
}

// event writes one event. data may hold newlines; each line becomes its own
// "data:" field, which SSE readers join back with "\n".
func (s *sseWriter) event(typ string, data []byte) error {
	var b bytes.Buffer
	b.WriteString("event: ")
	b.WriteString(oneLine(typ))
	b.WriteByte('\n')
	for line := range bytes.SplitSeq(bytes.TrimRight(data, "\r\n"), []byte("\n")) {
		b.WriteString("data: ")
		b.Write(bytes.TrimSuffix(line, []byte("\r")))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	s.deadline()
	if _, err := s.w.Write(b.Bytes()); err != nil {
		return err
	}
	return s.rc.Flush()
}

// eventJSON writes one event whose data is v as JSON.
func (s *sseWriter) eventJSON(typ string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.event(typ, b)
}

// comment writes a comment line, which SSE readers ignore.
func (s *sseWriter) comment(text string) error {
	s.deadline()
	if _, err := s.w.Write([]byte(": " + oneLine(text) + "\n\n")); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sseWriter) keepAlive() error { return s.comment("keep-alive") }

func oneLine(s string) string {
	return strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
}

// wantsSSE reports whether the request accepts an event stream.
func wantsSSE(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(v, "text/event-stream") {
			return true
		}
	}
	return false
}
