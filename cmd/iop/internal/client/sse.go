package client

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
)

// MaxEvent bounds one event of a stream, and one line of it (a comment
// included), in bytes: 16 MiB. The edge's run and feed events are far
// smaller: a node splits a run's output into deltas of at most 16 KiB of
// text and cuts an event's metadata at 32 KiB (application/node), so one
// event is at most a few hundred KiB of JSON even with every byte escaped.
// A node command's streamed result may be as large as a node-link frame
// (transport.max_frame_size, at most 64 MiB): that stream reads up to
// MaxAnswer. An unbounded line from a hostile or broken server grew the
// CLI's memory without limit (a 200 MB line took 420 MB).
var MaxEvent = 16 << 20

// ErrEventTooLarge ends a stream holding an event, or a line, over the
// reader's bound.
var ErrEventTooLarge = errors.New("event too large")

// Event is one server-sent event.
type Event struct {
	Type string // "message" when the stream names none
	Data string // data lines joined with "\n"
	ID   string
}

// SSEReader parses a text/event-stream body. Comments (keep-alives) are
// passed to OnComment's function, if any, and otherwise skipped, as are
// unknown fields; lines may end in "\n" or "\r\n". An event (or a line)
// over the reader's bound (MaxEvent, unless SetMax changes it) ends the
// stream with an error wrapping ErrEventTooLarge.
type SSEReader struct {
	r       *bufio.Reader
	comment func(string)
	max     int
}

// SetMax bounds each event, and each line, at n bytes.
func (s *SSEReader) SetMax(n int) { s.max = n }

// OnComment makes fn see the text of each comment line (without the ":"
// and one space after it): the edge's event feed reports the events it
// dropped for a slow subscriber in one, ": dropped N events".
func (s *SSEReader) OnComment(fn func(string)) { s.comment = fn }

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{r: bufio.NewReaderSize(r, 64<<10), max: MaxEvent}
}

// Next returns the next event; io.EOF when the stream ends cleanly between
// events and io.ErrUnexpectedEOF when it ends inside one.
func (s *SSEReader) Next() (Event, error) {
	var (
		ev      Event
		data    []string
		pending bool
		size    int // bytes of the event's lines so far
	)
	for {
		line, err := s.readLine(s.max - size)
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
		size += len(line)
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

// readLine reads one line, its end included, refusing one longer than
// limit bytes before it is all in memory.
func (s *SSEReader) readLine(limit int) (string, error) {
	var buf []byte
	for {
		frag, err := s.r.ReadSlice('\n')
		if len(buf)+len(frag) > limit {
			return "", fmt.Errorf("%w: an event or line over %s from the edge (not an iop edge's stream)", ErrEventTooLarge, sizeText(s.max))
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if buf == nil {
				return string(frag), err // a line that fit the reader's buffer: one copy
			}
			return string(append(buf, frag...)), err
		}
		buf = append(buf, frag...)
	}
}

// sizeText renders a bound in bytes for an error: "16 MiB", "1 KiB",
// "100 bytes".
func sizeText(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
