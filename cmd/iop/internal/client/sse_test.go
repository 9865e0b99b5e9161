package client

import (
	"errors"
	"io"
	"strings"
	"testing"
)

func TestSSEReader(t *testing.T) {
	long := strings.Repeat("x", 200<<10)
	stream := ": keep-alive\n\n" +
		"event: delta\ndata: {\"text\":\"a\"}\n\n" +
		"event: multi\r\ndata: line1\r\ndata: line2\r\n\r\n" +
		"data:no-space\n\n" +
		": comment between fields\nevent: big\nid: 7\nretry: 100\ndata: " + long + "\n\n" +
		"\n\n"
	r := NewSSEReader(strings.NewReader(stream))
	want := []Event{
		{Type: "delta", Data: `{"text":"a"}`},
		{Type: "multi", Data: "line1\nline2"},
		{Type: "message", Data: "no-space"},
		{Type: "big", Data: long, ID: "7"},
	}
	for i, w := range want {
		got, err := r.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if got != w {
			t.Fatalf("event %d = %+v, want %+v", i, trunc(got), trunc(w))
		}
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("end: %v, want EOF", err)
	}
}

func trunc(e Event) Event {
	if len(e.Data) > 40 {
		e.Data = e.Data[:40] + "…"
	}
	return e
}

func TestSSEReaderCutShort(t *testing.T) {
	for _, s := range []string{"event: delta\ndata: {}\n", "event: delta\ndata: {", "data: x"} {
		r := NewSSEReader(strings.NewReader(s))
		if _, err := r.Next(); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%q: %v, want ErrUnexpectedEOF", s, err)
		}
	}
}

// An event, or a line, over the reader's bound ends the stream with
// ErrEventTooLarge, before the line is all in memory; one at the bound
// passes.
func TestSSEReaderBound(t *testing.T) {
	line := "data: " + strings.Repeat("x", 100) + "\n"
	for _, c := range []struct {
		stream string
		ok     bool
	}{
		{"event: e\n" + line + "\n", true},
		{"event: e\n" + line + line + "\n", false},
		{": " + strings.Repeat("x", 300) + "\n\nevent: e\n\n", false},
		{"data: " + strings.Repeat("x", 1<<20) + "\n\n", false},
	} {
		r := NewSSEReader(strings.NewReader(c.stream))
		r.SetMax(200)
		_, err := r.Next()
		if c.ok != (err == nil) || !c.ok && !errors.Is(err, ErrEventTooLarge) {
			t.Errorf("%.40q: %v", c.stream, err)
		}
	}
}
