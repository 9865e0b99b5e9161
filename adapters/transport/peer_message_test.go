package transport

import (
	"fmt"
	"strings"
	"testing"

	ioppb "iop/proto/iop"
)

// A node cuts the error messages it sends to 8 KiB; one that does not
// (broken or hostile) had the edge take megabytes as they came: a run's
// or a tunnel's error, relayed, published and logged, and the reason of a
// config it refused, which became the link's (a log line, a bus event and
// the node list's reason, again at every registration). The edge cuts
// them alike.
func TestEdgeCutsANodesLongErrorMessages(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", testConfig(), edge)
	raw := dialRaw(t, srv.Addr().String())
	if resp := raw.register(ctx, testToken, 1<<20); !resp.GetAccepted() {
		t.Fatalf("register: %+v", resp)
	}
	link := recv(t, ctx, edge.registered, "node").Link.(*edgeLink)
	const limit = 8<<10 + 256 // the message, cut to 8 KiB, and what the edge says around it

	rs, err := link.StartRun(ctx, runReq("r"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	id := raw.readUntil(ctx, "run request", func(f *ioppb.Frame) bool { return f.GetRunRequest() != nil }).StreamId
	raw.write(&ioppb.Frame{StreamId: id, Body: &ioppb.Frame_RunEvent{RunEvent: &ioppb.RunEvent{RunId: "r", Seq: 1, Type: ioppb.EventType_EVENT_TYPE_ERROR,
		Error: &ioppb.Error{Code: "boom", Message: strings.Repeat("é", 100<<10)}}}})
	ev, err := rs.Recv(ctx)
	mustf(t, err, "run event")
	if ev.Error == nil {
		t.Fatalf("run event %+v without its error", ev)
	}
	if msg := ev.Error.Message; len(msg) > limit || !strings.HasSuffix(msg, "… (204800 bytes in all)") || ev.Error.Code != "boom" {
		t.Fatalf("run error %s with a message of %d bytes, want boom with at most %d ending with the length it had", ev.Error.Code, len(msg), limit)
	}

	// A reset's code and message are cut as they arrive.
	rs2, err := link.StartRun(ctx, runReq("r2"))
	mustf(t, err, "StartRun")
	defer rs2.Close()
	id2 := raw.readUntil(ctx, "run request", func(f *ioppb.Frame) bool { return f.GetRunRequest() != nil }).StreamId
	raw.write(&ioppb.Frame{StreamId: id2, Body: &ioppb.Frame_StreamReset{StreamReset: &ioppb.StreamReset{
		Code: strings.Repeat("c", 10<<10), Message: strings.Repeat("m", 100<<10)}}})
	if _, err := rs2.Recv(ctx); err == nil || len(err.Error()) > limit {
		t.Fatalf("reset: %d bytes of error (%.80q…), want at most %d", len(fmt.Sprint(err)), fmt.Sprint(err), limit)
	}

	raw.write(&ioppb.Frame{Body: &ioppb.Frame_ConfigRefreshAck{ConfigRefreshAck: &ioppb.ConfigRefreshAck{
		Version: testNodeConfig().Version, Error: strings.Repeat("x", 1<<20)}}})
	d := recv(t, ctx, edge.disconnected, "disconnect")
	if len(d.Reason) > limit || !strings.Contains(d.Reason, "node refused its config") {
		t.Fatalf("disconnect reason of %d bytes (%.80q…), want at most %d", len(d.Reason), d.Reason, limit)
	}
}

// What a node says about itself is cut too: the edge logs its version at
// every registration and lists all of it in /v1/nodes.
func TestEdgeCutsWhatANodeSaysAboutItself(t *testing.T) {
	ctx := testCtx(t)
	edge := newFakeEdge()
	edge.addNode(testToken, testNodeConfig())
	srv := startServer(t, "", testConfig(), edge)
	raw := dialRaw(t, srv.Addr().String())
	types := make([]string, 200) // the handshake holds at most 256 elements
	for i := range types {
		types[i] = "exec"
	}
	types[0] = strings.Repeat("t", 4<<10)
	long := strings.Repeat("h", 12<<10) // all within the 64 KiB handshake frame
	raw.write(&ioppb.Frame{Body: &ioppb.Frame_RegisterRequest{RegisterRequest: &ioppb.RegisterRequest{
		Token: testToken, NodeVersion: long, Hostname: long, Os: long, Arch: long, InitialWindow: 1 << 20, AdapterTypes: types,
	}}})
	if f := raw.readUntil(ctx, "register response", func(f *ioppb.Frame) bool { return f.GetRegisterResponse() != nil }); !f.GetRegisterResponse().GetAccepted() {
		t.Fatalf("register: %+v", f.GetRegisterResponse())
	}
	info := recv(t, ctx, edge.registered, "node").Info
	for name, v := range map[string]string{"version": info.Version, "hostname": info.Hostname, "os": info.OS, "arch": info.Arch, "adapter type": info.AdapterTypes[0]} {
		if len(v) > 256 || !strings.HasSuffix(v, " bytes in all)") {
			t.Errorf("%s of %d bytes kept as %d: %.40q…", name, len(v), len(v), v)
		}
	}
	if n := len(info.AdapterTypes); n != 64 {
		t.Errorf("%d adapter types kept, want 64", n)
	}
}
