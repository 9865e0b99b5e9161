package transport

import (
	"encoding/binary"

	"google.golang.org/protobuf/encoding/protowire"

	ioppb "iop/proto/iop"
)

// Data frames carry tunnel body bytes without protobuf: after the usual
// uvarint length come a zero marker byte, a kind byte, the stream id
// (uvarint) and the payload (docs/wire.md, "Data frames"). They are sent
// only on links where both ends said so at registration; every other
// frame stays protobuf.
const dataMarker = 0x00

// Data frame kinds.
const (
	// dataTunnelBody is a piece of a provider response body (node → edge),
	// the same as a ProviderTunnelFrame with body set.
	dataTunnelBody byte = 1
	// dataRequestBody is a piece of a tunnel request body (edge → node),
	// the same as a TunnelRequestBody with data set and end false.
	dataRequestBody byte = 2
)

// dataFrame is a decoded data frame. Its payload lives in a pooled buffer
// when pool is set; whoever holds the frame last gives it back.
type dataFrame struct {
	kind    byte
	stream  uint64
	payload []byte
	pool    *[]byte
}

// dataBodyLen is the size of a data frame without its length prefix.
func dataBodyLen(id uint64, payload int) int { return 2 + protowire.SizeVarint(id) + payload }

// encodeData returns the whole wire encoding of a data frame in a buffer
// from the payload pools (release the handle once written).
func encodeData(kind byte, id uint64, payload []byte) ([]byte, *[]byte) {
	body := dataBodyLen(id, len(payload))
	b, pool := getFrameBuf(protowire.SizeVarint(uint64(body)) + body)
	b = binary.AppendUvarint(b[:0], uint64(body))
	b = append(b, dataMarker, kind)
	b = binary.AppendUvarint(b, id)
	b = append(b, payload...)
	return b, pool
}

// asProto is the protobuf frame equivalent to a data frame, for consumers
// that read frames generically. It shares the payload buffer.
func (d *dataFrame) asProto() *ioppb.Frame {
	switch d.kind {
	case dataTunnelBody:
		return &ioppb.Frame{StreamId: d.stream, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Body{Body: d.payload}}}}
	case dataRequestBody:
		return &ioppb.Frame{StreamId: d.stream, Body: &ioppb.Frame_TunnelRequestBody{TunnelRequestBody: &ioppb.TunnelRequestBody{Data: d.payload}}}
	}
	return nil
}

// knownDataKind reports whether this version understands kind; frames of
// other kinds are skipped (counted as dropped), like unknown protobuf bodies.
func knownDataKind(kind byte) bool { return kind == dataTunnelBody || kind == dataRequestBody }
