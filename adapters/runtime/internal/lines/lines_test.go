package lines_test

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"iop/adapters/runtime/internal/lines"
)

func readAll(t *testing.T, r *lines.Reader) []string {
	t.Helper()
	var out []string
	for {
		l, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(l))
	}
}

func TestLinesAcrossOneByteReads(t *testing.T) {
	in := "{\"a\":\"é😀\"}\r\n\nsecond\nlast without newline"
	r := lines.NewReader(iotest.OneByteReader(strings.NewReader(in)), 0)
	got := readAll(t, r)
	want := []string{`{"a":"é😀"}`, "", "second", "last without newline"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestTooLongLinesAreSkipped(t *testing.T) {
	long := strings.Repeat("x", 200<<10)
	r := lines.NewReader(strings.NewReader("a\n"+long+"\nb\n"+long), 100<<10)
	got := readAll(t, r)
	if strings.Join(got, "|") != "a|b" {
		t.Fatalf("got %d lines %.20q", len(got), got)
	}
	if r.Skipped() != 2 {
		t.Errorf("Skipped = %d, want 2", r.Skipped())
	}
}

func TestReadErrorIsReturned(t *testing.T) {
	boom := errors.New("boom")
	r := lines.NewReader(io.MultiReader(strings.NewReader("a\nb"), iotest.ErrReader(boom)), 0)
	if l, err := r.Next(); err != nil || string(l) != "a" {
		t.Fatalf("first = %q, %v", l, err)
	}
	if l, err := r.Next(); err != nil || string(l) != "b" {
		t.Fatalf("partial line before the error = %q, %v", l, err)
	}
	if _, err := r.Next(); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
}

// A tail cut inside a rune drops that rune's remaining bytes; other bytes
// that are not UTF-8 become U+FFFD.
func TestValidText(t *testing.T) {
	for in, want := range map[string]string{
		"\xa9 caf\xe9":      " caf\uFFFD", // the end of "é" (c3 a9), then Latin-1
		"\x80\x80\x80x":     "x",
		"\x80\x80\x80\x80x": "\uFFFDx", // four continuation bytes are not one rune's end
		"plain":             "plain",
	} {
		if got := lines.ValidText([]byte(in)); got != want {
			t.Errorf("ValidText(%q) = %q, want %q", in, got, want)
		}
	}
}
