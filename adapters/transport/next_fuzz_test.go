package transport

import (
	"bytes"
	"errors"
	"io"
	"testing"

	ioppb "iop/proto/iop"
)

// FuzzDecoderNext feeds arbitrary bytes, in reads of any size, to the
// decoder as a link reads them: data frames and protobuf frames both, with
// the first frame held to the handshake's element bound. It must never
// panic, never report more bytes than it was given, never hand out a
// payload larger than the frame, and end with an error, not loop.
func FuzzDecoderNext(f *testing.F) {
	var all []byte
	for _, fr := range sampleFrames() {
		b, _ := AppendFrame(nil, fr, DefaultMaxFrameSize)
		f.Add(b, uint16(0))
		all = append(all, b...)
	}
	for _, d := range []struct {
		kind byte
		id   uint64
	}{{dataTunnelBody, 3}, {dataRequestBody, 1 << 40}, {9, 0}} {
		b, _ := encodeData(d.kind, d.id, bytes.Repeat([]byte("data: {}\n\n"), 50))
		all = append(all, b...)
		f.Add(append([]byte(nil), b...), uint16(7))
	}
	f.Add(all, uint16(100))
	f.Add([]byte{2, 0, 1}, uint16(0))
	f.Add([]byte{3, 0, 1, 0x80}, uint16(1))
	f.Add([]byte{12, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, uint16(0))
	const max = 64 << 10
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		var r io.Reader = bytes.NewReader(data)
		if split > 0 {
			r = &chunkedReader{r: r, n: int(split)}
		}
		d := NewDecoder(r, max)
		d.elements = handshakeElements
		consumed := 0
		for i := 0; ; i++ {
			if i > len(data)+1 {
				t.Fatalf("%d frames from %d bytes", i, len(data))
			}
			var fr ioppb.Frame
			var df dataFrame
			n, isData, err := d.next(&fr, &df)
			if err != nil && !errors.Is(err, ErrEmptyFrame) {
				return
			}
			d.elements = 0
			consumed += n
			if consumed > len(data) {
				t.Fatalf("decoder reports %d bytes consumed of %d", consumed, len(data))
			}
			if isData {
				if len(df.payload) >= n {
					t.Fatalf("payload of %d bytes in a frame of %d", len(df.payload), n)
				}
				putPayload(df.pool)
			}
		}
	})
}

type chunkedReader struct {
	r io.Reader
	n int
}

func (c *chunkedReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }
