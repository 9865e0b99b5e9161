package transport

import "io"

// idleReadSize is the inline buffer a link reads into while it is idle: a
// heartbeat and its reply fit, so an idle link never borrows the pool.
const idleReadSize = 128

// linkReader is the buffered reader under a link's Decoder. A read loop
// spends almost all its life blocked in a read; a bufio.Reader would hold its
// whole buffer there. linkReader blocks on a small inline array instead and
// switches to a pooled readBufferSize buffer when a read filled the array
// (more is waiting) or the caller wants more than the array holds (a frame
// is in progress). It keeps the pooled buffer while reads bring at least an
// array's worth, so a busy link reads as often as through a bufio.Reader,
// and gives it back once a read brought less (a heartbeat: the link is
// idle) and that has been drained. A link that goes quiet right after a
// burst holds the buffer until its next heartbeat.
//
// The Decoder uses only ReadByte and Read, with bufio.Reader's semantics: an
// error is returned once buffered bytes are used up, and a read of at least
// readBufferSize bytes with nothing buffered goes straight into the caller's
// slice.
type linkReader struct {
	rd     io.Reader
	buf    []byte // small[:] or *pooled
	pooled *[]byte
	r, w   int
	err    error
	// busy: the last read brought at least idleReadSize bytes, so the next
	// one is worth a full-size buffer.
	busy  bool
	small [idleReadSize]byte
}

func newLinkReader(rd io.Reader) *linkReader {
	b := &linkReader{rd: rd}
	b.buf = b.small[:]
	return b
}

// release gives the pooled buffer back; only when nothing is buffered.
func (b *linkReader) release() {
	if b.pooled != nil {
		putPayload(b.pooled)
		b.pooled = nil
		b.buf = b.small[:]
	}
}

// fill reads once into an empty buffer; want is how many bytes the caller
// needs now.
func (b *linkReader) fill(want int) {
	b.r, b.w = 0, 0
	if b.busy || want > len(b.small) {
		if b.pooled == nil {
			// From the pools shared by all connections (datapool.go): one is
			// lent to a link only while data keeps coming, so 10,000 idle
			// links hold none.
			b.buf, b.pooled = getFrameBuf(readBufferSize)
		}
	} else {
		b.release()
	}
	for range 100 {
		n, err := b.rd.Read(b.buf)
		if n < 0 || n > len(b.buf) {
			panic("linkReader: reader returned an invalid count")
		}
		b.w = n
		b.busy = n >= idleReadSize
		if err != nil {
			b.err = err
			return
		}
		if n > 0 {
			return
		}
	}
	b.err = io.ErrNoProgress
}

// frame returns the n bytes that start with the byte ReadByte returned last
// and consumes them, if all are buffered; otherwise nil, consuming nothing.
// Call it right after ReadByte. The bytes are valid until the next read.
func (b *linkReader) frame(n int) []byte {
	start := b.r - 1
	if start < 0 || n < 1 || b.w-start < n {
		return nil
	}
	b.r = start + n
	return b.buf[start:b.r]
}

func (b *linkReader) readErr() error {
	err := b.err
	b.err = nil
	return err
}

// ReadByte returns the next byte.
func (b *linkReader) ReadByte() (byte, error) {
	for b.r == b.w {
		if b.err != nil {
			return 0, b.readErr()
		}
		b.fill(1)
	}
	c := b.buf[b.r]
	b.r++
	return c, nil
}

// Read reads up to len(p) bytes; io.ReadFull over it reads a frame.
func (b *linkReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		if b.r < b.w {
			return 0, nil
		}
		return 0, b.readErr()
	}
	if b.r == b.w {
		if b.err != nil {
			return 0, b.readErr()
		}
		if len(p) >= readBufferSize {
			// Large: straight into p, without a copy.
			n, err := b.rd.Read(p)
			if n < 0 || n > len(p) {
				panic("linkReader: reader returned an invalid count")
			}
			b.busy = n >= idleReadSize
			b.err = err
			return n, b.readErr()
		}
		b.fill(len(p))
		if b.r == b.w {
			return 0, b.readErr()
		}
	}
	n := copy(p, b.buf[b.r:b.w])
	b.r += n
	return n, nil
}
