package exec

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
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

// The copies os/exec runs (io.Copy from the pipes) go through ReadFrom, with
// pooled buffers, and lose nothing however the reads are cut.
func TestWritersReadFromPipes(t *testing.T) {
	text := strings.Repeat("héllo wörld ", 9000) // > 3 chunks, multi-byte runes across reads
	sink := &runtimetest.Sink{}
	w := newDeltaWriter(sink)
	w.release(true)
	if n, err := io.Copy(w, iotest.HalfReader(strings.NewReader(text))); err != nil || n != int64(len(text)) {
		t.Fatalf("copy to deltaWriter = %d, %v", n, err)
	}
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	if got := sink.Text(); got != text {
		t.Errorf("deltas differ from the output (%d bytes, want %d)", len(got), len(text))
	}

	tb := newTailBuffer(16)
	if n, err := io.Copy(tb, iotest.OneByteReader(strings.NewReader(text+"the end"))); err != nil || n != int64(len(text)+7) {
		t.Fatalf("copy to tailBuffer = %d, %v", n, err)
	}
	if got, want := tb.String(), "o wörld the end"; got != want {
		t.Errorf("tail = %q, want %q", got, want)
	}
	empty := newTailBuffer(16)
	if _, err := io.Copy(empty, strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	if empty.buf != nil || empty.String() != "" {
		t.Errorf("an empty stderr allocated its tail (%d bytes) or kept %q", cap(empty.buf), empty.String())
	}
}

// BenchmarkOutputCopy copies one run's output as the exec adapter does —
// a short stdout line to delta events and an empty stderr to the tail —
// with the buffers allocated per run (before) against pooled ones.
func BenchmarkOutputCopy(b *testing.B) {
	out := "hello from the child\n"
	b.Run("buffers-per-run", func(b *testing.B) {
		b.ReportAllocs()
		reportCPU(b, func() {
			for b.Loop() {
				sink := &runtimetest.Sink{}
				w := newDeltaWriter(sink)
				w.release(true)
				buf := make([]byte, stdoutChunkSize) // the old ReadFrom's own buffer
				_, _ = io.CopyBuffer(struct{ io.Writer }{w}, strings.NewReader(out), buf)
				tail := &tailBuffer{max: stderrTailSize, buf: make([]byte, 0, stderrTailSize)}
				_, _ = io.Copy(struct{ io.Writer }{tail}, struct{ io.Reader }{strings.NewReader("")}) // io.Copy's own 32 KiB
				_ = w.flush()
			}
		})
	})
	b.Run("pooled", func(b *testing.B) {
		b.ReportAllocs()
		reportCPU(b, func() {
			for b.Loop() {
				sink := &runtimetest.Sink{}
				w := newDeltaWriter(sink)
				w.release(true)
				_, _ = io.Copy(w, struct{ io.Reader }{strings.NewReader(out)})
				_, _ = io.Copy(newTailBuffer(stderrTailSize), struct{ io.Reader }{strings.NewReader("")})
				_ = w.flush()
			}
		})
	})
}
