package transport

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	ioppb "iop/proto/iop"
)

// A frame's wire size bounds what it costs to hold only up to the memory
// its decoded form takes per element: every message, string and bytes
// value in it becomes an allocation of its own, and an empty submessage is
// two bytes on the wire but a whole Go struct in memory (a 64 KiB frame of
// them decodes to ≈ 3.4 MiB). Elements are counted on the wire before
// proto.Unmarshal sees a frame, and bounded where the edge reads:
//
//   - The first frame of a connection is decoded before the peer has shown
//     a token, for up to MaxPending connections at once, so it may hold at
//     most handshakeElements elements (a register request has a dozen).
//   - Every later frame a node sends may hold at most nodeFrameElements
//     (decoded, ≈ 100 bytes each: ≈ 1.6 MiB, whatever max_frame_size is).
//     The largest a node sends legitimately are a tunnel's header frame
//     (the node refuses to send one over the bound: headerFrameElements)
//     and node_stats (the node cuts it to maxStatsEntries adapters and
//     providers, ≈ 1,000 elements); the rest have a dozen at most.
//   - The frames queued on one stream may hold at most
//     streamElements(window) in all (Stream.enqueue), so what a stream
//     pins is bounded in elements as well as in wire bytes: without it a
//     window of header frames full of empty headers decodes to 40 times
//     the window. A node's legitimate frames take 8 wire bytes or more
//     per element on average (a frame costs its size plus 16, and the
//     smallest carry two or three elements), so a stream full of them
//     stays below window/8, and the slack is room for a header frame.
//
// A node that breaks either bound is disconnected (a protocol violation).
// The node's own decoder counts nothing after the handshake: what the edge
// sends may legitimately be dense (a caller's header repeated with empty
// values, forwarded in a tunnel request), and the edge is trusted.
const (
	handshakeElements = 256
	nodeFrameElements = 16 << 10
	maxElementDepth   = 64
)

// streamElements is the most elements the frames queued on one stream of
// a node's link may hold in all, for a receive window of window bytes.
func streamElements(window int) int { return nodeFrameElements + window/8 }

// headerElements is the most elements a node puts in a tunnel's header
// frame; past it the tunnel ends with an error instead.
const headerElements = nodeFrameElements

// headerFrameElements is the element count of the frame that carries pf,
// as checkElements counts it, if pf is a header frame (0 otherwise):
// the frame, pf, the header block, and each header's entry, name and
// values.
func headerFrameElements(pf *ioppb.ProviderTunnelFrame) int {
	hb := pf.GetHeader()
	if hb == nil {
		return 0
	}
	n := 3
	for _, h := range hb.GetHeaders() {
		n += 1 + len(h.GetValues())
		if h.GetName() != "" {
			n++
		}
	}
	return n
}

// errTooManyElements marks a frame refused for its element count.
var errTooManyElements = errors.New("too many messages, strings and bytes values")

var frameDescriptor = (&ioppb.Frame{}).ProtoReflect().Descriptor()

// checkElements returns b's element count if b, an encoded Frame, holds at
// most limit elements (messages, strings and bytes values, nested ones
// included) and nests messages no deeper than maxElementDepth, and an
// error otherwise. It reads the wire format only; malformed bytes are left
// for proto.Unmarshal to report.
func checkElements(b []byte, limit int) (int, error) {
	n, err := countElements(b, frameDescriptor, limit, 0)
	if err != nil {
		return n, err
	}
	if n > limit {
		return n, fmt.Errorf("%w: %w: more than %d in a frame of %d bytes", ErrMalformedFrame, errTooManyElements, limit, len(b))
	}
	return n, nil
}

// countElements counts b's elements (b itself included) under message md,
// stopping once past limit.
func countElements(b []byte, md protoreflect.MessageDescriptor, limit, depth int) (int, error) {
	if depth > maxElementDepth {
		return 0, fmt.Errorf("%w: messages nested deeper than %d", ErrMalformedFrame, maxElementDepth)
	}
	n := 1
	for len(b) > 0 && n <= limit {
		num, typ, tl := protowire.ConsumeTag(b)
		if tl < 0 {
			return n, nil // malformed: Unmarshal says so
		}
		b = b[tl:]
		if typ != protowire.BytesType {
			vl := protowire.ConsumeFieldValue(num, typ, b)
			if vl < 0 {
				return n, nil
			}
			b = b[vl:]
			continue
		}
		v, vl := protowire.ConsumeBytes(b)
		if vl < 0 {
			return n, nil
		}
		b = b[vl:]
		fd := md.Fields().ByNumber(num)
		switch {
		case fd == nil:
			n++ // an unknown field is kept as bytes
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			m, err := countElements(v, fd.Message(), limit-n, depth+1)
			if err != nil {
				return n, err
			}
			n += m
		case fd.Kind() == protoreflect.StringKind || fd.Kind() == protoreflect.BytesKind:
			n++
		default:
			// A packed repeated scalar: one slice, its size in proportion
			// to the bytes.
			n++
		}
	}
	return n, nil
}
