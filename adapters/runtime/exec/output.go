package exec

import (
	"errors"
	"io"
	"strings"
	"sync"
	"unicode/utf8"

	"iop/adapters/runtime/internal/lines"
	"iop/domain"
	"iop/ports"
)

const (
	stdoutChunkSize = 32 << 10 // bytes per stdout read, so at most per delta
	stderrTailSize  = 4 << 10  // bytes of stderr kept for the error message
)

// chunks holds the read buffers of the output copies (stdoutChunkSize
// bytes): a run's output is copied into a fresh string for its event, so
// the buffer can serve the next run instead of being garbage after each.
var chunks = sync.Pool{New: func() any { b := make([]byte, stdoutChunkSize); return &b }}

// readChunks reads r into a pooled buffer until EOF or an error, passing
// every read to write; it returns the bytes read and the first error
// (io.EOF is not one). Not io.CopyBuffer: given the child's *os.File pipe,
// that hands the copy to the file's WriteTo, which allocates its own
// 32 KiB buffer.
func readChunks(r io.Reader, write func([]byte) error) (int64, error) {
	bp := chunks.Get().(*[]byte)
	defer chunks.Put(bp)
	buf := *bp
	var total int64
	for {
		n, err := r.Read(buf)
		total += int64(n)
		if n > 0 {
			if werr := write(buf[:n]); werr != nil {
				return total, werr
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// errDiscarded ends the stdout copy when the run was abandoned before its
// output could be sent.
var errDiscarded = errors.New("exec: run abandoned before output")

// deltaWriter turns the command's stdout into delta events, one per read.
// Execute's copy goroutine (copyFrom) alone writes pending and err until it
// ends; Execute reads err only after failed is closed or the copy has ended,
// and pending only after the copy has ended.
type deltaWriter struct {
	sink    ports.EventSink
	gate    chan struct{} // closed by release; no delta goes out before it
	discard bool          // set by release before gate is closed
	pending []byte        // an incomplete UTF-8 sequence held back from the last read
	err     error         // the first Emit error
	failed  chan struct{} // closed once err is set
}

func newDeltaWriter(sink ports.EventSink) *deltaWriter {
	return &deltaWriter{sink: sink, gate: make(chan struct{}), failed: make(chan struct{})}
}

// release lets output flow once the metadata event is out, or makes the
// writer refuse it (ending the copy) when send is false.
func (w *deltaWriter) release(send bool) {
	w.discard = !send
	close(w.gate)
}

// copyFrom reads r with a 32 KiB buffer and emits what each read returns,
// until r ends or fails (a closed pipe: the run is over) or an Emit fails.
func (w *deltaWriter) copyFrom(r io.Reader) {
	_, _ = readChunks(r, func(p []byte) error { _, err := w.Write(p); return err })
}

// Write emits p as one delta event, minus an incomplete UTF-8 sequence at
// its end, which is held back and prepended to the next write.
func (w *deltaWriter) Write(p []byte) (int, error) {
	<-w.gate
	if w.err != nil {
		return 0, w.err
	}
	if w.discard {
		return 0, errDiscarded
	}
	data := p
	if len(w.pending) > 0 {
		data = append(w.pending, p...)
	}
	n := completeLen(data)
	text := string(data[:n])
	w.pending = append(w.pending[:0], data[n:]...)
	if err := w.emit(text); err != nil {
		return 0, err
	}
	return len(p), nil
}

// flush emits what is still held back, once the output has ended.
func (w *deltaWriter) flush() error {
	text := string(w.pending)
	w.pending = nil
	return w.emit(text)
}

func (w *deltaWriter) emit(text string) error {
	if text == "" {
		return nil
	}
	err := w.sink.Emit(domain.RunEvent{Type: domain.EventDelta, Text: strings.ToValidUTF8(text, "\uFFFD")})
	if err != nil && w.err == nil {
		w.err = err
		close(w.failed)
	}
	return err
}

// completeLen returns how much of b can be sent without splitting a UTF-8
// sequence: all of it, unless b ends with the first bytes of a multi-byte
// rune. Invalid bytes count as complete, so they are never held back.
func completeLen(b []byte) int {
	for i := len(b) - 1; i >= 0 && i > len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

// tailBuffer keeps the last max bytes written to it, in a buffer allocated
// once, on the first write (most runs write nothing to stderr). An os/exec
// goroutine writes it; when cmd.WaitDelay ran out (a descendant held stderr
// open), that goroutine may still be finishing a write after cmd.Wait
// returned, hence the lock.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func newTailBuffer(max int) *tailBuffer {
	return &tailBuffer{max: max}
}

// ReadFrom copies r through a pooled buffer; without it, io.Copy would
// allocate a 32 KiB one per run.
func (t *tailBuffer) ReadFrom(r io.Reader) (int64, error) {
	return readChunks(r, func(p []byte) error { _, err := t.Write(p); return err })
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(p) > 0 && t.buf == nil {
		t.buf = make([]byte, 0, t.max)
	}
	n, limit := len(p), t.max
	if len(p) >= limit {
		t.buf = append(t.buf[:0], p[len(p)-limit:]...)
		return n, nil
	}
	if drop := len(t.buf) + len(p) - limit; drop > 0 {
		t.buf = append(t.buf[:0], t.buf[drop:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the tail with surrounding space trimmed: a rune the
// tail starts inside of is dropped, other bytes that are not UTF-8 (a
// Latin-1 message) become U+FFFD, as in the output.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(lines.ValidText(t.buf))
}
