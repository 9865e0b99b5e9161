package transport

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	ioppb "iop/proto/iop"
)

// scriptedReader returns its chunks one Read at a time (each cut to the
// caller's buffer), then err.
type scriptedReader struct {
	chunks [][]byte
	err    error
	sizes  []int // len(p) of every Read
}

func (r *scriptedReader) Read(p []byte) (int, error) {
	r.sizes = append(r.sizes, len(p))
	if len(r.chunks) == 0 {
		return 0, r.err
	}
	n := copy(p, r.chunks[0])
	if r.chunks[0] = r.chunks[0][n:]; len(r.chunks[0]) == 0 {
		r.chunks = r.chunks[1:]
	}
	return n, nil
}

// Every frame comes through whole and in order, whatever sizes the
// underlying reads return, and a clean end between frames is io.EOF. A
// frame decoded where it lay in the read buffer keeps its contents after
// later reads reuse that buffer.
func TestLinkReaderDecodesFramesAcrossReadSizes(t *testing.T) {
	var wire []byte
	var want []string
	for i, n := range []int{0, 1, 60, 127, 128, 129, 4000, 4096, 5000, 40000, 3} {
		text := string(bytes.Repeat([]byte{'a' + byte(i)}, n))
		want = append(want, text)
		var err error
		wire, err = AppendFrame(wire, &ioppb.Frame{StreamId: uint64(i + 1), Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{Text: text}}}, DefaultMaxFrameSize)
		mustf(t, err, "encode")
	}
	readers := map[string]func() io.Reader{
		"whole":    func() io.Reader { return bytes.NewReader(wire) },
		"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(wire)) },
		"half":     func() io.Reader { return iotest.HalfReader(bytes.NewReader(wire)) },
		"data+EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(wire)) },
	}
	for name, mk := range readers {
		dec := NewDecoder(mk(), DefaultMaxFrameSize)
		var got []*ioppb.Frame
		for i := range want {
			f := new(ioppb.Frame)
			if _, err := dec.Decode(f); err != nil {
				t.Fatalf("%s: frame %d: %v", name, i, err)
			}
			got = append(got, f)
		}
		for i, w := range want {
			if f := got[i]; f.StreamId != uint64(i+1) || f.GetRunEvent().GetText() != w {
				t.Fatalf("%s: frame %d: stream %d, %d bytes of text; want stream %d, %d bytes", name, i, f.StreamId, len(f.GetRunEvent().GetText()), i+1, len(w))
			}
		}
		if _, err := dec.Decode(new(ioppb.Frame)); !errors.Is(err, io.EOF) {
			t.Errorf("%s: after the last frame: %v, want io.EOF", name, err)
		}
	}
}

// An idle link holds no pooled buffer: once a read brought less than the
// inline array holds (a heartbeat) and that is drained, the next read (the
// one that blocks while the link is idle) goes into the inline array. While
// reads bring more, the pooled buffer is used.
func TestLinkReaderHoldsNoPooledBufferWhenIdle(t *testing.T) {
	burst := bytes.Repeat([]byte{'x'}, 3*readBufferSize)
	medium := bytes.Repeat([]byte{'m'}, 300)
	r := &scriptedReader{chunks: [][]byte{{'h', 'b'}, burst, medium, {'y'}}, err: io.EOF}
	lr := newLinkReader(r)

	get := func(n int) {
		t.Helper()
		if _, err := io.ReadFull(lr, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
	// A heartbeat-sized read: into the inline array, nothing borrowed.
	get(2)
	if lr.pooled != nil || r.sizes[0] != idleReadSize {
		t.Fatalf("idle read: pooled %v, read size %d; want none and %d", lr.pooled != nil, r.sizes[0], idleReadSize)
	}
	// A burst: the inline read comes back full, so the next reads use the
	// pooled buffer.
	get(idleReadSize)
	get(100)
	if lr.pooled == nil || r.sizes[len(r.sizes)-1] != readBufferSize {
		t.Fatalf("busy: pooled %v, last read size %d; want a pooled %d-byte read", lr.pooled != nil, r.sizes[len(r.sizes)-1], readBufferSize)
	}
	// Drain the burst. A read that brings a few hundred bytes keeps the
	// buffer (the link is still busy) ...
	get(len(burst) - idleReadSize - 100)
	get(len(medium))
	if lr.pooled == nil || r.sizes[len(r.sizes)-1] != readBufferSize {
		t.Fatalf("after a medium read: pooled %v, last read size %d; want a pooled %d-byte read", lr.pooled != nil, r.sizes[len(r.sizes)-1], readBufferSize)
	}
	// ... one that brings a heartbeat's worth lets it go before the next
	// read (the one an idle link blocks in).
	get(1)
	if _, err := lr.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("at the end: %v, want io.EOF", err)
	}
	if lr.pooled != nil || r.sizes[len(r.sizes)-1] != idleReadSize {
		t.Fatalf("after the burst: pooled %v, last read size %d; want none and %d", lr.pooled != nil, r.sizes[len(r.sizes)-1], idleReadSize)
	}
}

// A frame larger than the read buffer is read straight into the caller's
// slice, and an error comes only after the bytes before it.
func TestLinkReaderLargeReadsAndErrors(t *testing.T) {
	boom := errors.New("boom")
	big := bytes.Repeat([]byte{'z'}, 2*readBufferSize)
	r := &scriptedReader{chunks: [][]byte{big, {1, 2, 3}}, err: boom}
	lr := newLinkReader(r)
	p := make([]byte, len(big))
	if _, err := io.ReadFull(lr, p); err != nil || !bytes.Equal(p, big) {
		t.Fatalf("large read: %v", err)
	}
	if r.sizes[0] != len(big) {
		t.Errorf("large read went through a %d-byte buffer, want straight into the %d-byte slice", r.sizes[0], len(big))
	}
	for _, want := range []byte{1, 2, 3} {
		if c, err := lr.ReadByte(); err != nil || c != want {
			t.Fatalf("ReadByte = %d, %v; want %d", c, err, want)
		}
	}
	if _, err := lr.ReadByte(); !errors.Is(err, boom) {
		t.Fatalf("after the data: %v, want the reader's error", err)
	}
}
