package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	ioppb "iop/proto/iop"
)

// sampleFrames has one frame of every body type, with most fields set.
func sampleFrames() []*ioppb.Frame {
	cfg := configToProto(testNodeConfig())
	return []*ioppb.Frame{
		{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: &ioppb.RegisterRequest{Token: "t", NodeVersion: "1.2", Hostname: "h", Os: "linux", Arch: "amd64", InitialWindow: 1 << 18}}},
		{Body: &ioppb.Frame_RegisterResponse{RegisterResponse: &ioppb.RegisterResponse{Accepted: true, Config: cfg, HeartbeatIntervalMs: 30000, HeartbeatTimeoutMs: 45000, InitialWindow: 1 << 18}}},
		{Body: &ioppb.Frame_RegisterResponse{RegisterResponse: &ioppb.RegisterResponse{Reason: "unknown_token"}}},
		{Body: &ioppb.Frame_Heartbeat{Heartbeat: &ioppb.Heartbeat{SentUnixNano: 123, EchoUnixNano: 45, Reply: true}}},
		{Body: &ioppb.Frame_ConfigRefresh{ConfigRefresh: &ioppb.ConfigRefresh{Config: cfg}}},
		{Body: &ioppb.Frame_ConfigRefreshAck{ConfigRefreshAck: &ioppb.ConfigRefreshAck{Version: 9, Error: "bad"}}},
		{Body: &ioppb.Frame_NodeStats{NodeStats: &ioppb.NodeStats{ChildProcesses: 2, StoreBytes: 4096,
			Adapters:  []*ioppb.AdapterSlots{{Name: "exec", MaxConcurrency: 4, InFlight: 1}},
			Providers: []*ioppb.ProviderLatency{{Name: "oai", Count: 3, Seconds: 0.5}}}}},
		{StreamId: 3, Body: &ioppb.Frame_WindowUpdate{WindowUpdate: &ioppb.WindowUpdate{Increment: 4096}}},
		{StreamId: 5, Body: &ioppb.Frame_StreamReset{StreamReset: &ioppb.StreamReset{Code: "cancel", Message: "bye"}}},
		{StreamId: 7, Body: &ioppb.Frame_RunRequest{RunRequest: &ioppb.RunRequest{RunId: "r", Adapter: "a", Target: "t", Input: []byte("in"), SessionId: "s", Background: true, OptionsJson: []byte(`{"x":1}`)}}},
		{StreamId: 7, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "r", Seq: 2, Type: ioppb.EventType_EVENT_TYPE_ERROR, Text: "x", Usage: &ioppb.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3, CostUsd: 0.5, DurationMs: 9, StopReason: "stop", Model: "m"}, Error: &ioppb.Error{Code: "c", Message: "m"}, TimeUnixNano: 99, MetadataJson: []byte(`{}`)}}},
		{StreamId: 9, Body: &ioppb.Frame_CancelRequest{CancelRequest: &ioppb.CancelRequest{Kind: ioppb.CancelKind_TERMINATE_SESSION, RunId: "r", Adapter: "a", Target: "t", SessionId: "s"}}},
		{StreamId: 9, Body: &ioppb.Frame_CancelResponse{CancelResponse: &ioppb.CancelResponse{Error: &ioppb.Error{Code: "run_not_found"}}}},
		{StreamId: 11, Body: &ioppb.Frame_NodeCommandRequest{NodeCommandRequest: &ioppb.NodeCommandRequest{Command: "ollama.pull", ArgsJson: []byte(`{"m":"x"}`)}}},
		{StreamId: 11, Body: &ioppb.Frame_NodeCommandResponse{NodeCommandResponse: &ioppb.NodeCommandResponse{Final: true, ResultJson: []byte(`{}`), ProgressJson: []byte(`{"p":1}`), Error: &ioppb.Error{Code: "e"}}}},
		{StreamId: 13, Body: &ioppb.Frame_ProviderTunnelRequest{ProviderTunnelRequest: &ioppb.ProviderTunnelRequest{Provider: "p", Method: "POST", Path: "/v1/x", Query: "a=b", Headers: []*ioppb.Header{{Name: "A", Values: [][]byte{[]byte("1"), []byte("2")}}}, Body: []byte("body"), BodyFollows: true}}},
		{StreamId: 13, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Status{Status: 200}}}},
		{StreamId: 13, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Header{Header: &ioppb.HeaderBlock{Headers: []*ioppb.Header{{Name: "B", Values: [][]byte{[]byte("x")}}}}}}}},
		{StreamId: 13, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Body{Body: []byte("chunk")}}}},
		{StreamId: 13, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Usage{Usage: &ioppb.Usage{TotalTokens: 5}}}}},
		{StreamId: 13, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_MetadataJson{MetadataJson: []byte(`{"k":"v"}`)}}}},
		{StreamId: 13, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_End{End: &ioppb.End{BodyBytes: 5}}}}},
		{StreamId: 13, Body: &ioppb.Frame_ProviderTunnelFrame{ProviderTunnelFrame: &ioppb.ProviderTunnelFrame{Kind: &ioppb.ProviderTunnelFrame_Error{Error: &ioppb.Error{Code: "provider_error"}}}}},
		{StreamId: 13, Body: &ioppb.Frame_TunnelRequestBody{TunnelRequestBody: &ioppb.TunnelRequestBody{Data: []byte("more"), End: true}}},
		{StreamId: 1<<64 - 1, Body: &ioppb.Frame_WindowUpdate{WindowUpdate: &ioppb.WindowUpdate{Increment: 1<<32 - 1}}},
		{Body: &ioppb.Frame_NodeDraining{NodeDraining: &ioppb.NodeDraining{}}}, // last: tests pick others by index
	}
}

func encode(tb testing.TB, frames ...*ioppb.Frame) []byte {
	tb.Helper()
	var b []byte
	for _, f := range frames {
		var err error
		if b, err = AppendFrame(b, f, DefaultMaxFrameSize); err != nil {
			tb.Fatalf("encode %T: %v", f.Body, err)
		}
	}
	return b
}

func TestCodecRoundTripsEveryBodyType(t *testing.T) {
	frames := sampleFrames()
	// Every oneof case of Frame appears in the samples.
	seen := map[string]bool{}
	for _, f := range frames {
		seen[string(f.ProtoReflect().WhichOneof(f.ProtoReflect().Descriptor().Oneofs().ByName("body")).Name())] = true
	}
	fields := (&ioppb.Frame{}).ProtoReflect().Descriptor().Oneofs().ByName("body").Fields()
	for i := 0; i < fields.Len(); i++ {
		if name := string(fields.Get(i).Name()); !seen[name] {
			t.Errorf("no sample frame for body %s", name)
		}
	}

	wire := encode(t, frames...)
	dec := NewDecoder(bytes.NewReader(wire), DefaultMaxFrameSize)
	total := 0
	for i, want := range frames {
		got := new(ioppb.Frame)
		n, err := dec.Decode(got)
		if err != nil {
			t.Fatalf("frame %d (%T): %v", i, want.Body, err)
		}
		if n != len(encode(t, want)) {
			t.Errorf("frame %d: Decode reported %d bytes, encoding is %d", i, n, len(encode(t, want)))
		}
		total += n
		if !proto.Equal(got, want) {
			t.Errorf("frame %d: got %v, want %v", i, got, want)
		}
	}
	if total != len(wire) {
		t.Errorf("decoded %d bytes of %d", total, len(wire))
	}
	if _, err := dec.Decode(new(ioppb.Frame)); err != io.EOF {
		t.Errorf("after the last frame: got %v, want io.EOF", err)
	}
}

// countingReader hands out its bytes in one Read and counts later calls.
type countingReader struct {
	b     []byte
	calls int
}

func (r *countingReader) Read(p []byte) (int, error) {
	r.calls++
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func TestDecodeRefusesOversizedPrefixBeforeAllocating(t *testing.T) {
	for _, size := range []uint64{DefaultMaxFrameSize + 1, 1 << 40, 1<<64 - 1} {
		r := &countingReader{b: binary.AppendUvarint(nil, size)}
		dec := NewDecoder(r, DefaultMaxFrameSize)
		_, err := dec.Decode(new(ioppb.Frame))
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("size %d: got %v, want ErrFrameTooLarge", size, err)
		}
		if r.calls != 1 {
			t.Errorf("size %d: decoder read %d times; it should refuse after the prefix alone", size, r.calls)
		}
	}
}

func TestDecodeSizeLimitIsInclusive(t *testing.T) {
	f := &ioppb.Frame{StreamId: 2, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{Text: strings.Repeat("x", 1000)}}}
	size := proto.Size(f)
	wire := encode(t, f)
	if _, err := NewDecoder(bytes.NewReader(wire), size).Decode(new(ioppb.Frame)); err != nil {
		t.Errorf("frame of exactly max bytes refused: %v", err)
	}
	if _, err := NewDecoder(bytes.NewReader(wire), size-1).Decode(new(ioppb.Frame)); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("frame one byte over max: got %v, want ErrFrameTooLarge", err)
	}
	if _, err := AppendFrame(nil, f, size); err != nil {
		t.Errorf("AppendFrame at exactly max: %v", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	valid := encode(t, sampleFrames()[8])
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"clean eof", nil, io.EOF},
		{"varint overflows 64 bits", append(bytes.Repeat([]byte{0xff}, 9), 0x02), ErrMalformedFrame},
		{"varint longer than ten bytes", bytes.Repeat([]byte{0x80}, 11), ErrMalformedFrame},
		{"max uint64 prefix", append(bytes.Repeat([]byte{0xff}, 9), 0x01), ErrFrameTooLarge},
		{"prefix cut short", []byte{0x80}, io.ErrUnexpectedEOF},
		{"body cut short", valid[:len(valid)-1], io.ErrUnexpectedEOF},
		{"only a prefix", valid[:1], io.ErrUnexpectedEOF},
		{"garbage protobuf", []byte{4, 0xff, 0xff, 0xff, 0xff}, ErrMalformedFrame},
		{"truncated field inside frame", []byte{3, 0x52, 0x05, 0x0a}, ErrMalformedFrame},
		{"invalid utf-8 in a string", encodeRaw([]byte{0x52, 0x03, 0x0a, 0x01, 0xff}), ErrMalformedFrame},
		{"zero length", []byte{0}, ErrEmptyFrame},
		{"no body", encodeRaw([]byte{0x08, 0x05}), ErrEmptyFrame},
		{"unknown body field", encodeRaw([]byte{0xfa, 0x3e, 0x00}), ErrEmptyFrame},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewDecoder(bytes.NewReader(tc.in), DefaultMaxFrameSize).Decode(new(ioppb.Frame))
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// encodeRaw length-prefixes raw protobuf bytes.
func encodeRaw(msg []byte) []byte {
	return append(binary.AppendUvarint(nil, uint64(len(msg))), msg...)
}

func TestDecoderStaysInSyncAfterEmptyFrames(t *testing.T) {
	want := sampleFrames()[3]
	wire := append([]byte{0}, encodeRaw([]byte{0x08, 0x05})...)
	wire = append(wire, encode(t, want)...)
	dec := NewDecoder(bytes.NewReader(wire), DefaultMaxFrameSize)
	for i := 0; i < 2; i++ {
		if _, err := dec.Decode(new(ioppb.Frame)); !errors.Is(err, ErrEmptyFrame) {
			t.Fatalf("frame %d: got %v, want ErrEmptyFrame", i, err)
		}
	}
	got := new(ioppb.Frame)
	if _, err := dec.Decode(got); err != nil || !proto.Equal(got, want) {
		t.Fatalf("after empty frames: %v, %v", got, err)
	}
}

func TestDecoderDropsLargeBuffers(t *testing.T) {
	big := &ioppb.Frame{Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{Text: strings.Repeat("y", 1<<20)}}}
	small := sampleFrames()[3]
	dec := NewDecoder(bytes.NewReader(encode(t, big, small)), DefaultMaxFrameSize)
	got := new(ioppb.Frame)
	mustf(t, errOnly(dec.Decode(got)), "decode big")
	if got.GetRunEvent().GetText() != big.GetRunEvent().GetText() {
		t.Fatal("big frame corrupted")
	}
	if n := cap(dec.r.buf); n > readBufferSize {
		t.Errorf("decoder keeps a %d byte buffer after a big frame", n)
	}
	mustf(t, errOnly(dec.Decode(got)), "decode small")
	if !proto.Equal(got, small) {
		t.Errorf("small frame after big: %v", got)
	}
}

func errOnly(_ int, err error) error { return err }

func TestAppendFrameRefusesTooLarge(t *testing.T) {
	f := &ioppb.Frame{Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{Text: strings.Repeat("z", 70<<10)}}}
	prefix := []byte("keep")
	out, err := AppendFrame(prefix, f, 64<<10)
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("got %v, want ErrFrameTooLarge", err)
	}
	if string(out) != "keep" {
		t.Errorf("AppendFrame changed the buffer on refusal: %q", out)
	}
}

// FuzzDecoder feeds arbitrary bytes to the decoder: it must never panic,
// and any frame it accepts must re-encode to something that decodes to the
// same message.
func FuzzDecoder(f *testing.F) {
	for _, fr := range sampleFrames() {
		b, _ := AppendFrame(nil, fr, DefaultMaxFrameSize)
		f.Add(b)
	}
	all, _ := func() ([]byte, error) {
		var b []byte
		var err error
		for _, fr := range sampleFrames() {
			b, err = AppendFrame(b, fr, DefaultMaxFrameSize)
		}
		return b, err
	}()
	f.Add(all)
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add([]byte{0x80})
	f.Add(bytes.Repeat([]byte{0xff}, 12))
	f.Add([]byte{4, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add(binary.AppendUvarint(nil, DefaultMaxFrameSize+1))
	f.Add(encodeRaw([]byte{0x52, 0x03, 0x0a, 0x01, 0xff}))

	const max = 64 << 10
	det := proto.MarshalOptions{Deterministic: true}
	f.Fuzz(func(t *testing.T, data []byte) {
		dec := NewDecoder(bytes.NewReader(data), max)
		consumed := 0
		for i := 0; i < 1000; i++ {
			fr := new(ioppb.Frame)
			n, err := dec.Decode(fr)
			if errors.Is(err, ErrEmptyFrame) {
				consumed += n
				continue
			}
			if err != nil {
				return
			}
			consumed += n
			if consumed > len(data) {
				t.Fatalf("decoder reports %d bytes consumed of %d", consumed, len(data))
			}
			if fr.Body == nil {
				t.Fatal("accepted a frame without a body")
			}
			// Re-encoding may legitimately grow (a 5-byte negative enum
			// becomes 10 bytes), so allow headroom over max.
			wire, err := AppendFrame(nil, fr, 2*max+64)
			if err != nil {
				t.Fatalf("accepted frame does not re-encode: %v", err)
			}
			again := new(ioppb.Frame)
			if _, err := NewDecoder(bytes.NewReader(wire), 2*max+64).Decode(again); err != nil {
				t.Fatalf("re-encoded frame does not decode: %v", err)
			}
			b1, err1 := det.Marshal(fr)
			b2, err2 := det.Marshal(again)
			if err1 != nil || err2 != nil || !bytes.Equal(b1, b2) {
				t.Fatalf("re-encoded frame differs: %v / %v", fr, again)
			}
		}
	})
}

func TestDataFrameRoundTrip(t *testing.T) {
	for _, size := range []int{0, 1, 100, minPooledPayload - 1, minPooledPayload, 4 << 10, maxDataChunk, 100 << 10} {
		for _, id := range []uint64{1, 2, 300, 1<<64 - 1} {
			payload := randomBytes(size)
			raw, pool := encodeData(dataTunnelBody, id, payload)
			wire := append(append([]byte(nil), raw...), encode(t, sampleFrames()[3])...)
			putPayload(pool)
			dec := NewDecoder(bytes.NewReader(wire), DefaultMaxFrameSize)
			var df dataFrame
			n, isData, err := dec.next(new(ioppb.Frame), &df)
			if err != nil || !isData {
				t.Fatalf("size %d id %d: isData %v err %v", size, id, isData, err)
			}
			if n != len(raw) || df.kind != dataTunnelBody || df.stream != id || !bytes.Equal(df.payload, payload) {
				t.Fatalf("size %d id %d: got n=%d kind=%d stream=%d %d bytes", size, id, n, df.kind, df.stream, len(df.payload))
			}
			if (df.pool != nil) != (size >= minPooledPayload && classOf(size) >= 0) {
				t.Errorf("size %d: pooled=%v, class %d", size, df.pool != nil, classOf(size))
			}
			putPayload(df.pool)
			// The decoder is still in step: the next frame decodes.
			f := new(ioppb.Frame)
			if _, isData, err := dec.next(f, &df); err != nil || isData || !proto.Equal(f, sampleFrames()[3]) {
				t.Fatalf("frame after data frame: %v %v %v", f, isData, err)
			}
		}
	}
}

func TestDataFrameErrors(t *testing.T) {
	ok, pool := encodeData(dataRequestBody, 5, []byte("hello"))
	defer putPayload(pool)
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"marker only", []byte{1, dataMarker}, ErrMalformedFrame},
		{"no stream id", []byte{2, dataMarker, dataTunnelBody}, ErrMalformedFrame},
		{"stream id runs past the frame", []byte{4, dataMarker, dataTunnelBody, 0x80, 0x80, 0x01}, ErrMalformedFrame},
		{"stream id longer than ten bytes", append([]byte{14, dataMarker, dataTunnelBody}, bytes.Repeat([]byte{0x80}, 12)...), ErrMalformedFrame},
		{"payload cut short", ok[:len(ok)-1], io.ErrUnexpectedEOF},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var df dataFrame
			_, _, err := NewDecoder(bytes.NewReader(tc.in), DefaultMaxFrameSize).next(new(ioppb.Frame), &df)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	// The handshake takes protobuf frames only.
	if _, err := NewDecoder(bytes.NewReader(ok), DefaultMaxFrameSize).Decode(new(ioppb.Frame)); !errors.Is(err, ErrMalformedFrame) {
		t.Fatalf("Decode of a data frame: %v, want ErrMalformedFrame", err)
	}
}

func TestPayloadPoolClasses(t *testing.T) {
	for _, n := range []int{minPooledPayload, 4 << 10, 4<<10 + classSlack, 4<<10 + classSlack + 1, maxDataChunk + 20, 64<<10 + classSlack} {
		b, p := getPayload(n)
		if len(b) != n || p == nil || cap(b) > 2*n+2*classSlack {
			t.Errorf("getPayload(%d): len %d cap %d pooled %v", n, len(b), cap(b), p != nil)
		}
		putPayload(p)
	}
	// Received payloads below minPooledPayload wait in queues: exact size.
	if b, p := getPayload(minPooledPayload - 1); p != nil || cap(b) != minPooledPayload-1 {
		t.Errorf("small received payload: cap %d pooled %v", cap(b), p != nil)
	}
	// Encoded frames live briefly: pooled from the smallest class.
	if b, p := getFrameBuf(100); p == nil || cap(b) != firstClass+classSlack {
		t.Errorf("small frame buffer: cap %d pooled %v", cap(b), p != nil)
	}
	if _, p := getPayload(64<<10 + classSlack + 1); p != nil {
		t.Error("a payload above the largest class was pooled")
	}
}
