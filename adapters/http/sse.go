package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"iop/adapters/internal/deadline"
	"iop/domain"
)

// sseWriter writes server-sent events, flushing after each one (or, through
// write and flush, after a burst). Each write, or burst of writes up to its
// flush, must complete within the write idle timeout (when positive; at
// least three quarters of it, see deadline), so a client that stops
// reading ends the stream with an error instead of blocking it forever.
// One goroutine writes.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// wd is the write deadline, WriteIdleTimeout ahead (see deadline).
	wd  deadline.Lazy
	buf []byte       // the event being written, reused
	js  bytes.Buffer // the JSON of the event being written, reused
	enc *json.Encoder
	jsb []byte // a run event's JSON, reused
	// unflushed: written (headers or events) but not yet flushed.
	unflushed bool
}

// startSSE sends the stream's headers (plus any extra ones) and flushes
// them, so the client learns at once that the stream is open. Every write
// of the stream, this one included, is bounded by the server's
// WriteIdleTimeout.
func (srv *Server) startSSE(w http.ResponseWriter, extra map[string]string) (*sseWriter, error) {
	s := srv.openSSE(w, extra)
	return s, s.flush()
}

// openSSE is startSSE without the flush: for a stream whose first event is
// at hand, so headers and event go out in one write.
func (srv *Server) openSSE(w http.ResponseWriter, extra map[string]string) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	for k, v := range extra {
		h.Set(k, v)
	}
	s := &sseWriter{w: w, rc: http.NewResponseController(w), wd: deadline.Quarter(srv.WriteIdleTimeout), unflushed: true}
	s.deadline()
	w.WriteHeader(http.StatusOK)
	return s
}

// deadline gives the next write at least three quarters of the write idle
// timeout, and at most all of it, to complete: the deadline is moved only
// once a quarter of the timeout has passed since it was last set, not for
// every burst (each move is a runtime timer update; a short run has three
// bursts or more).
func (s *sseWriter) deadline() {
	if t, due := s.wd.Next(time.Now()); due {
		_ = s.rc.SetWriteDeadline(t)
	}
}

// event writes one event and flushes it. data may hold line ends (LF, CRLF
// or a lone CR, all three ends of a line to an SSE reader); each line
// becomes its own "data:" field, which SSE readers join back with "\n".
func (s *sseWriter) event(typ string, data []byte) error {
	if err := s.write(typ, data); err != nil {
		return err
	}
	return s.flush()
}

// write writes one event without flushing it (see event).
func (s *sseWriter) write(typ string, data []byte) error {
	b := append(s.buf[:0], "event: "...)
	b = append(b, oneLine(typ)...)
	b = append(b, '\n')
	data = bytes.TrimRight(data, "\r\n")
	if bytes.IndexByte(data, '\r') < 0 {
		for line := range bytes.SplitSeq(data, []byte("\n")) {
			b = append(b, "data: "...)
			b = append(b, line...)
			b = append(b, '\n')
		}
	} else {
		// A CR within the data (JSON allows it as whitespace, a node's
		// command result may hold one) sent as it is would end the field
		// there for the reader, which would then read half of it.
		for {
			i := bytes.IndexAny(data, "\r\n")
			if i < 0 {
				b = append(append(append(b, "data: "...), data...), '\n')
				break
			}
			b = append(append(append(b, "data: "...), data[:i]...), '\n')
			if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
				i++
			}
			data = data[i+1:]
		}
	}
	b = append(b, '\n')
	s.buf = b // the ResponseWriter copied it: reused for the next event
	if !s.unflushed {
		s.deadline() // at most one per burst: the writes up to the flush share it
	}
	s.unflushed = true
	_, err := s.w.Write(b)
	return err
}

// flush sends what was written.
func (s *sseWriter) flush() error {
	s.unflushed = false
	return s.rc.Flush()
}

// eventJSON writes one event whose data is v as JSON and flushes it.
func (s *sseWriter) eventJSON(typ string, v any) error {
	if err := s.writeJSON(typ, v); err != nil {
		return err
	}
	return s.flush()
}

// writeJSON is eventJSON without the flush. The JSON is json.Marshal's.
func (s *sseWriter) writeJSON(typ string, v any) error {
	if s.enc == nil {
		s.enc = json.NewEncoder(&s.js)
	}
	s.js.Reset()
	if err := s.enc.Encode(v); err != nil { // Marshal's bytes and a newline, which write trims
		return err
	}
	return s.write(typ, s.js.Bytes())
}

// writeRunEvent is writeJSON of toRunEventJSON(node, ev), formatted
// without reflection (appendRunEventJSON; the same bytes).
func (s *sseWriter) writeRunEvent(node string, ev domain.RunEvent) error {
	js, err := appendRunEventJSON(s.jsb[:0], node, ev)
	s.jsb = js
	if err != nil {
		return err
	}
	return s.write(string(ev.Type), js)
}

// comment writes a comment line, which SSE readers ignore.
func (s *sseWriter) comment(text string) error {
	s.deadline()
	if _, err := s.w.Write([]byte(": " + oneLine(text) + "\n\n")); err != nil {
		return err
	}
	return s.flush()
}

func (s *sseWriter) keepAlive() error { return s.comment("keep-alive") }

func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
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
