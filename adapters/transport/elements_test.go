package transport

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	ioppb "iop/proto/iop"
)

// emptyMessagesFrame is a frame of n empty submessages, two bytes each on
// the wire, length-prefixed.
func emptyMessagesFrame(t *testing.T, n int) []byte {
	stats := &ioppb.NodeStats{}
	for range n {
		stats.Adapters = append(stats.Adapters, &ioppb.AdapterSlots{})
	}
	b, err := proto.Marshal(&ioppb.Frame{Body: &ioppb.Frame_NodeStats{NodeStats: stats}})
	if err != nil {
		t.Fatal(err)
	}
	return append(protowire.AppendVarint(nil, uint64(len(b))), b...)
}

// TestFirstFrameOfEmptyMessagesIsRefusedUndecoded: the first frame of a
// connection, sent before any token, may not make the edge allocate
// megabytes: a 64 KiB frame of empty messages (≈ 3.4 MiB decoded) is
// refused before it is decoded, while a real register request passes.
func TestFirstFrameOfEmptyMessagesIsRefusedUndecoded(t *testing.T) {
	wire := emptyMessagesFrame(t, 30000)
	if len(wire) > maxRegisterFrame {
		t.Fatalf("test frame of %d bytes is over the handshake cap", len(wire))
	}
	dec := NewDecoder(bytes.NewReader(wire), maxRegisterFrame)
	dec.elements = handshakeElements
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := dec.Decode(new(ioppb.Frame))
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMalformedFrame) {
		t.Fatalf("Decode: %v, want a malformed frame", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 512<<10 {
		t.Fatalf("refusing the frame allocated %d KiB", alloc>>10)
	}

	reg, err := proto.Marshal(&ioppb.Frame{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: &ioppb.RegisterRequest{
		Token: testToken, NodeVersion: "v", Hostname: "h", Os: "linux", Arch: "amd64", InitialWindow: 1 << 18,
		AdapterTypes: []string{"exec", "ollama", "openai", "claude-code", "codex", "gemini"}, DataFrames: true,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	dec = NewDecoder(bytes.NewReader(append(protowire.AppendVarint(nil, uint64(len(reg))), reg...)), maxRegisterFrame)
	dec.elements = handshakeElements
	f := new(ioppb.Frame)
	if _, err := dec.Decode(f); err != nil || f.GetRegisterRequest().GetToken() != testToken {
		t.Fatalf("a register request: %v", err)
	}
}

// TestEdgeRefusesFirstFrameOfEmptyMessages: the edge's handshake uses the
// bound: such a first frame is a handshake failure and the connection is
// closed.
func TestEdgeRefusesFirstFrameOfEmptyMessages(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", testConfig(), edge)
	p := dialRaw(t, srv.Addr().String())
	if err := p.writeBytes(emptyMessagesFrame(t, 30000)); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-edge.failed:
		if !strings.Contains(f.Reason, "malformed") && !strings.Contains(f.Reason, "messages and strings") {
			t.Fatalf("handshake failure %q", f.Reason)
		}
	case <-ctx.Done():
		t.Fatal("no handshake failure")
	}
	if !closedByEdge(ctx, p) {
		t.Fatal("the connection stayed open")
	}
}

// TestLaterFramesAreNotBoundByElements: the node's decoder bounds no frame
// after registration by its elements: what the edge sends may be as dense
// as its size allows (a header repeated with empty values is legitimate
// and comes from a caller, through the edge). The edge's bound on what a
// node sends is in density_test.go.
func TestLaterFramesAreNotBoundByElements(t *testing.T) {
	wire := emptyMessagesFrame(t, 30000)
	dec := NewDecoder(bytes.NewReader(wire), DefaultMaxFrameSize)
	f := new(ioppb.Frame)
	if _, err := dec.Decode(f); err != nil || len(f.GetNodeStats().GetAdapters()) != 30000 {
		t.Fatalf("Decode: %v (%d adapters)", err, len(f.GetNodeStats().GetAdapters()))
	}
}
