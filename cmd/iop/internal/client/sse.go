package client

import (
	"bufio"
	"errors"
	"io"
	"strings"
)

// Event is one server-sent event.
type Event struct {
	Type string // "message" when the stream names none
	Data string // data lines joined with "\n"
	ID   string
}

// SSEReader parses a text/event-stream body. Comments (keep-alives) are
// passed to OnComment's function, if any, and otherwise skipped, as are
// unknown fields; lines may end in "\n" or "\r\n" and have no length limit.
type SSEReader struct {
	r       *bufio.Reader
	comment func(string)
}

// OnComment makes fn see the text of each comment line (without the ":"
// and one space after it): the edge's event feed reports the events it
// dropped for a slow subscriber in one, ": dropped N events".
func (s *SSEReader) OnComment(fn func(string)) { s.comment = fn }

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// Next returns the next event; io.EOF when the stream ends cleanly between
// events and io.ErrUnexpectedEOF when it ends inside one.
func (s *SSEReader) Next() (Event, error) {
	var (
		ev      Event
		data    []string
		pending bool
	)
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && (pending || line != "") {
				return Event{}, io.ErrUnexpectedEOF
			}
			return Event{}, err
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if line == "" {
			if !pending {
				continue
			}
			ev.Data = strings.Join(data, "\n")
			if ev.Type == "" {
				ev.Type = "message"
			}
			return ev, nil
		}
		if text, ok := strings.CutPrefix(line, ":"); ok {
			if s.comment != nil {
				s.comment(strings.TrimPrefix(text, " "))
			}
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			ev.Type, pending = value, true
		case "data":
			data, pending = append(data, value), true
		case "id":
			ev.ID, pending = value, true
		}
	}
}
