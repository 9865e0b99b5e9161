package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	ioppb "iop/proto/iop"
)

// Protocol faults. A connection that produces one is closed; nothing else is.
var (
	ErrFrameTooLarge  = errors.New("frame exceeds maximum size")
	ErrMalformedFrame = errors.New("malformed frame")
	ErrEmptyFrame     = errors.New("frame has no body")
)

// readBufferSize is the read buffer a busy link borrows (linkreader.go);
// bulk frames go around it.
const readBufferSize = 4 << 10

// pooledFrameSize is the writer's batch buffer (conn.go), taken from the
// size-classed pools (datapool.go); it covers a batch up to coalesceLimit
// plus the frame that crosses it.
const pooledFrameSize = 64 << 10

// beatBufferSize holds a few heartbeats (a frame is under 40 bytes): the
// writer's buffer for a batch of heartbeats alone.
const beatBufferSize = 256

var beatPool = sync.Pool{New: func() any { b := make([]byte, beatBufferSize); return &b }}

// DefaultMaxFrameSize bounds every frame on the wire (the length prefix is
// checked before anything is allocated).
const DefaultMaxFrameSize = 4 << 20

// Decoder reads length-prefixed Frames: a uvarint byte count followed by that
// many bytes of protobuf (the layout protodelim writes).
type Decoder struct {
	r   *linkReader
	max int
	// elements, when positive, is the most elements (checkElements) a
	// protobuf frame may hold: handshakeElements for the first frame of a
	// connection, nodeFrameElements for every later one the edge reads
	// (elements.go). counted is then the element count of the protobuf
	// frame next returned last.
	elements int
	counted  int
	// progress, when set, is called each time another readPiece bytes of
	// a large frame have arrived: the link's read loop moves its read
	// deadline there, so a large frame on a slow link is not cut off
	// while its bytes keep coming. Frames of readPiece bytes or less never
	// call it.
	progress func()
}

// readPiece is how much of a large frame the decoder reads before it
// reports progress (Decoder.progress).
const readPiece = 64 << 10

// readFull reads len(p) bytes, reporting progress per readPiece when p is
// larger than that and a progress hook is set.
func (d *Decoder) readFull(p []byte) error {
	if d.progress == nil || len(p) <= readPiece {
		_, err := io.ReadFull(d.r, p)
		return err
	}
	for len(p) > 0 {
		n := min(len(p), readPiece)
		if _, err := io.ReadFull(d.r, p[:n]); err != nil {
			return err
		}
		p = p[n:]
		d.progress()
	}
	return nil
}

// NewDecoder reads from r; frames larger than max bytes are refused.
func NewDecoder(r io.Reader, max int) *Decoder {
	// An idle link holds only a small inline buffer (linkreader.go), and
	// reads of large frames bypass the buffer (io.ReadFull into the frame).
	return &Decoder{r: newLinkReader(r), max: max}
}

// Decode reads the next frame into f and returns its size on the wire.
// io.EOF is returned only on a clean end between frames. A data frame is a
// malformed frame here: Decode is for the handshake, before any stream.
func (d *Decoder) Decode(f *ioppb.Frame) (int, error) {
	var df dataFrame
	n, isData, err := d.next(f, &df)
	if err == nil && isData {
		putPayload(df.pool)
		return n, fmt.Errorf("%w: data frame outside a stream", ErrMalformedFrame)
	}
	return n, err
}

// next reads the next frame: a protobuf frame into f, or a data frame
// (isData) into df, whose payload the caller owns (release df.pool when
// done with it).
func (d *Decoder) next(f *ioppb.Frame, df *dataFrame) (size int, isData bool, err error) {
	n, err := d.readLength()
	if err != nil {
		return 0, false, err
	}
	if n > uint64(d.max) {
		return 0, false, fmt.Errorf("%w: %d > %d bytes", ErrFrameTooLarge, n, d.max)
	}
	if n == 0 {
		return protowire.SizeVarint(n), false, ErrEmptyFrame
	}
	size = protowire.SizeVarint(n) + int(n)
	// A protobuf message never starts with a zero byte (field number 0 does
	// not exist), so a leading zero marks a data frame.
	first, err := d.r.ReadByte()
	if err != nil {
		return 0, false, unexpectedEOF(err)
	}
	if first == dataMarker {
		return size, true, d.readData(int(n)-1, df)
	}
	// A frame whose bytes are all buffered already (most small frames) is
	// decoded where it lies; any other borrows a buffer from a pool shared
	// by all connections, so an idle link pins none and a busy one does not
	// allocate per frame. Unmarshal copies what it keeps, so the bytes are
	// free again right after.
	b := d.r.frame(int(n))
	if b == nil {
		var pooled *[]byte
		b, pooled = getFrameBuf(int(n))
		defer putPayload(pooled)
		b[0] = first
		if err := d.readFull(b[1:]); err != nil {
			return 0, false, unexpectedEOF(err)
		}
	}
	if n == tlsHandshakeRecord && first == tlsMajorVersion {
		// No protobuf message starts with 0x03 (field number 0): these
		// are the first bytes of a TLS record, read as a frame.
		return 0, false, fmt.Errorf("%w: %w", ErrMalformedFrame, errTLSClient)
	}
	d.counted = 0
	if d.elements > 0 {
		if d.counted, err = checkElements(b, d.elements); err != nil {
			return 0, false, err
		}
	}
	if err := proto.Unmarshal(b, f); err != nil {
		return 0, false, fmt.Errorf("%w: %v", ErrMalformedFrame, err)
	}
	if f.Body == nil {
		return size, false, ErrEmptyFrame
	}
	return size, false, nil
}

// readData reads a data frame's kind, stream id and payload (rest bytes in
// all, the marker already read). The payload is read straight from the
// socket into its own buffer: no protobuf decoding, no second copy.
func (d *Decoder) readData(rest int, df *dataFrame) error {
	if rest < 2 {
		return fmt.Errorf("%w: data frame of %d bytes has no kind and stream id", ErrMalformedFrame, rest+1)
	}
	kind, err := d.r.ReadByte()
	if err != nil {
		return unexpectedEOF(err)
	}
	rest--
	var id uint64
	for i := 0; ; i++ {
		if rest <= 0 || i == binary.MaxVarintLen64 {
			return fmt.Errorf("%w: data frame stream id", ErrMalformedFrame)
		}
		c, err := d.r.ReadByte()
		if err != nil {
			return unexpectedEOF(err)
		}
		rest--
		id |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			break
		}
	}
	payload, pool := getPayload(rest)
	if err := d.readFull(payload); err != nil {
		putPayload(pool)
		return unexpectedEOF(err)
	}
	*df = dataFrame{kind: kind, stream: id, payload: payload, pool: pool}
	return nil
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readLength reads the uvarint length prefix. A clean EOF before its first
// byte is io.EOF; a prefix longer than ten bytes is garbage.
func (d *Decoder) readLength() (uint64, error) {
	var n uint64
	for i := 0; i < binary.MaxVarintLen64; i++ {
		c, err := d.r.ReadByte()
		if err != nil {
			if i > 0 && errors.Is(err, io.EOF) {
				return 0, io.ErrUnexpectedEOF
			}
			return 0, err
		}
		if i == binary.MaxVarintLen64-1 && c > 1 {
			break
		}
		n |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return n, nil
		}
	}
	return 0, fmt.Errorf("%w: length prefix overflows 64 bits", ErrMalformedFrame)
}

// AppendFrame appends f's wire encoding to b. It refuses frames over max.
func AppendFrame(b []byte, f *ioppb.Frame, max int) ([]byte, error) {
	size := proto.Size(f)
	if size > max {
		return b, fmt.Errorf("%w: %d > %d bytes", ErrFrameTooLarge, size, max)
	}
	b = binary.AppendUvarint(b, uint64(size))
	// The size was just computed: let Marshal reuse it instead of walking
	// the message a second time.
	return proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, f)
}

func readerOf(b []byte) io.Reader { return bytes.NewReader(b) }
