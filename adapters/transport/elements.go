package transport

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	ioppb "iop/proto/iop"
)

// A frame's wire size bounds what it costs to hold only up to the memory
// its decoded form takes per element: every message, string and bytes
// value in it becomes an allocation of its own, and an empty submessage is
// two bytes on the wire but a whole Go struct in memory (a 64 KiB frame of
// them decodes to ≈ 3.4 MiB). The first frame of a connection is decoded
// before the peer has shown a token, for up to MaxPending connections at
// once, so it may hold at most handshakeElements elements (a register
// request has a dozen); proto.Unmarshal never sees a larger one. Later
// frames come from a peer that registered with its token, and no bound
// tighter than their size would be safe there: any element takes two
// bytes or more, and a caller's request forwarded by the edge may
// legitimately be dense (a header repeated with empty values).
const (
	handshakeElements = 256
	maxElementDepth   = 64
)

var frameDescriptor = (&ioppb.Frame{}).ProtoReflect().Descriptor()

// checkElements returns an error if b, an encoded Frame, holds more than
// limit elements (messages, strings and bytes values, nested ones
// included) or nests messages deeper than maxElementDepth. It reads the
// wire format only; malformed bytes are left for proto.Unmarshal to report.
func checkElements(b []byte, limit int) error {
	n, err := countElements(b, frameDescriptor, limit, 0)
	if err != nil {
		return err
	}
	if n > limit {
		return fmt.Errorf("%w: more than %d messages and strings in %d bytes", ErrMalformedFrame, limit, len(b))
	}
	return nil
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
