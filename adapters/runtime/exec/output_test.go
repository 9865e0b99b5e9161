package exec

import (
	"strings"
	"testing"
	"unicode/utf8"

	"iop/adapters/runtime/runtimetest"
)

func TestCompleteLen(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"abc", 3},
		{"a\xe2\x82\xac", 4},     // complete €
		{"a\xe2\x82", 1},         // € missing its last byte
		{"a\xe2", 1},             // € missing two bytes
		{"a\xf0\x9f\x98", 1},     // 😀 missing its last byte
		{"a\xf0\x9f\x98\x80", 5}, // complete 😀
		{"a\x82\x82\x82", 4},     // stray continuation bytes are not held back
		{"a\xff", 2},             // invalid byte is not held back
	}
	for _, tt := range tests {
		if got := completeLen([]byte(tt.in)); got != tt.want {
			t.Errorf("completeLen(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestDeltaWriterNeverSplitsRunes(t *testing.T) {
	const text = "héllo € 😀 ok"
	for size := 1; size <= 5; size++ {
		sink := &runtimetest.Sink{}
		w := newDeltaWriter(sink)
		w.release(true)
		for b := []byte(text); len(b) > 0; {
			n := min(size, len(b))
			if _, err := w.Write(b[:n]); err != nil {
				t.Fatal(err)
			}
			b = b[n:]
		}
		if err := w.flush(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range sink.Events() {
			if !utf8.ValidString(ev.Text) || strings.ContainsRune(ev.Text, utf8.RuneError) {
				t.Errorf("size %d: delta %q splits a rune", size, ev.Text)
			}
		}
		if got := sink.Text(); got != text {
			t.Errorf("size %d: text = %q, want %q", size, got, text)
		}
	}
}

func TestDeltaWriterReplacesInvalidBytes(t *testing.T) {
	sink := &runtimetest.Sink{}
	w := newDeltaWriter(sink)
	w.release(true)
	if _, err := w.Write([]byte("a\xffb\xe2")); err != nil {
		t.Fatal(err)
	}
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	if got, want := sink.Text(), "a\uFFFDb\uFFFD"; got != want {
		t.Errorf("text = %q, want %q", got, want)
	}
}

func TestTailBufferKeepsLastBytes(t *testing.T) {
	tb := newTailBuffer(8)
	for _, s := range []string{"abc", "defg", "hij", " kl "} {
		if _, err := tb.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := tb.String(), "ghij kl"; got != want {
		t.Errorf("tail = %q, want %q", got, want)
	}
	if _, err := tb.Write([]byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	if got, want := tb.String(), "23456789"; got != want {
		t.Errorf("tail = %q, want %q", got, want)
	}
	if cap(tb.buf) != 8 {
		t.Errorf("buffer grew to %d bytes", cap(tb.buf))
	}
}
