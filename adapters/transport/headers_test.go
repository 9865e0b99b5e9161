package transport

import (
	"context"
	"io"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// obsText is a header value HTTP allows (bytes 0x80-0xFF are obs-text, and
// Go's net/http passes them both ways) that is not UTF-8.
const obsText = "caf\xe9"

// headerMode is how the two ends can agree on header values.
type headerMode struct {
	name string
	opt  pairOptions
	raw  bool // values that are not UTF-8 cross the link
}

var headerModes = []headerMode{
	{"both current", pairOptions{}, true},
	{"older edge", pairOptions{server: Config{noRawHeaders: true}}, false},
	{"older node", pairOptions{client: ClientConfig{Transport: Config{noRawHeaders: true}}}, false},
}

// A provider's response header value that is not UTF-8 must neither drop
// the link (it did: the frame failed to encode, its bytes went out anyway,
// the edge rejected the frame and closed the link, ending every run and
// tunnel on it) nor fail the response: between current ends the value
// arrives byte for byte; towards an older edge it is left out and counted.
func TestTunnelResponseHeaderNotUTF8(t *testing.T) {
	for _, m := range headerModes {
		t.Run(m.name, func(t *testing.T) {
			p := newPair(t, m.opt, func(_ *fakeEdge, n *fakeNode) {
				n.onTunnel = func(_ context.Context, _ domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
					for _, f := range []domain.TunnelFrame{
						{Kind: domain.TunnelStatus, Status: 200},
						{Kind: domain.TunnelHeader, Header: domain.Header{"X-Upstream": {obsText}, "X-Both": {"ok", obsText}, "Content-Type": {"text/plain"}}},
						{Kind: domain.TunnelBody, Body: []byte("ok")},
						{Kind: domain.TunnelEnd},
					} {
						if out.Send(f) != nil {
							return
						}
					}
				}
			})
			checkRawHeaders(t, p, m.raw)
			ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Method: "GET", Path: "/x"}, nil)
			mustf(t, err, "OpenTunnel")
			defer ts.Close()
			var hdr domain.Header
			var body []byte
			for {
				f, err := ts.Recv(p.ctx)
				if err == io.EOF {
					break
				}
				mustf(t, err, "tunnel Recv")
				if f.Kind == domain.TunnelHeader {
					hdr = f.Header
				}
				body = append(body, f.Body...)
			}
			want := domain.Header{"X-Upstream": {obsText}, "X-Both": {"ok", obsText}, "Content-Type": {"text/plain"}}
			dropped := int64(0)
			if !m.raw {
				want = domain.Header{"X-Both": {"ok"}, "Content-Type": {"text/plain"}}
				dropped = 2
			}
			if !reflect.DeepEqual(hdr, want) || string(body) != "ok" {
				t.Fatalf("edge got header %q body %q; want %q, \"ok\"", hdr, body, want)
			}
			if got := p.cli.currentConn().Stats().HeaderValuesDropped; got != dropped {
				t.Errorf("node counted %d dropped header values, want %d", got, dropped)
			}
			requireLinkServes(t, p)
		})
	}
}

// The same for a caller's request header the edge forwards to the node.
func TestTunnelRequestHeaderNotUTF8(t *testing.T) {
	for _, m := range headerModes {
		t.Run(m.name, func(t *testing.T) {
			seen := make(chan tunnelSeen, 1)
			p := newPair(t, m.opt, func(_ *fakeEdge, n *fakeNode) { n.onTunnel = echoTunnel(seen, []byte("ok")) })
			checkRawHeaders(t, p, m.raw)
			req := domain.TunnelRequest{Provider: "oa", Method: "POST", Path: "/v1/chat/completions",
				Header: domain.Header{"X-Caller": {obsText}, "Authorization": {"Bearer t"}}, Body: []byte("{}")}
			ts, err := p.link.OpenTunnel(p.ctx, req, nil)
			mustf(t, err, "OpenTunnel")
			defer ts.Close()
			got := recv(t, p.ctx, seen, "the node's tunnel")
			want := domain.Header{"X-Caller": {obsText}, "Authorization": {"Bearer t"}}
			dropped := int64(0)
			if !m.raw {
				want = domain.Header{"Authorization": {"Bearer t"}}
				dropped = 1
			}
			if !reflect.DeepEqual(got.req.Header, want) {
				t.Fatalf("node got header %q, want %q", got.req.Header, want)
			}
			if kinds, body := drainTunnel(t, p.ctx, ts); kinds[len(kinds)-1] != domain.TunnelEnd || string(body) != "ok" {
				t.Fatalf("tunnel ended with %v, body %q", kinds, body)
			}
			if got := p.link.Stats().HeaderValuesDropped; got != dropped {
				t.Errorf("edge counted %d dropped header values, want %d", got, dropped)
			}
			requireLinkServes(t, p)
		})
	}
}

func checkRawHeaders(t *testing.T, p *pair, want bool) {
	t.Helper()
	if edge, node := p.link.conn.rawHeaders, p.cli.currentConn().rawHeaders; edge != want || node != want {
		t.Fatalf("raw header values negotiated edge=%v node=%v, want %v", edge, node, want)
	}
}

func TestHeadersToProto(t *testing.T) {
	h := domain.Header{"A": {"x", obsText}, "B": {obsText}, "N\xff": {"v"}, "Empty": {}}
	for _, raw := range []bool{true, false} {
		var d headerDrops
		got := headersToDomain(headersToProto(h, raw, &d))
		want := domain.Header{"A": {"x", obsText}, "B": {obsText}, "Empty": {}}
		wantDropped := 1 // the header whose name is not UTF-8
		if !raw {
			want = domain.Header{"A": {"x"}, "Empty": {}}
			wantDropped = 3
		}
		if !reflect.DeepEqual(got, want) || d.values != wantDropped || d.name == "" {
			t.Errorf("raw=%v: got %q, %d dropped (%q); want %q, %d", raw, got, d.values, d.name, want, wantDropped)
		}
	}
}

// Header.values became bytes; a UTF-8 value must stay exactly the bytes an
// older peer (which declares it string) writes and reads.
func TestHeaderValuesWireCompatibleWithString(t *testing.T) {
	got, err := proto.Marshal(&ioppb.Header{Name: "X", Values: [][]byte{[]byte("v1"), []byte("é")}})
	mustf(t, err, "marshal")
	var want []byte
	want = protowire.AppendTag(want, 1, protowire.BytesType)
	want = protowire.AppendString(want, "X")
	for _, v := range []string{"v1", "é"} {
		want = protowire.AppendTag(want, 2, protowire.BytesType)
		want = protowire.AppendString(want, v)
	}
	if string(got) != string(want) {
		t.Fatalf("encoding %x, want the string field's %x", got, want)
	}
}

// publishingEdge opens a tunnel on a link inside Register, as a caller
// routed to a node the registry has just admitted can, before the
// handshake has finished.
type publishingEdge struct {
	*fakeEdge
	served chan error
}

func (e *publishingEdge) Register(ctx context.Context, token string, info domain.NodeInfo, remote string, link ports.NodeLink) (domain.NodeConfig, error) {
	cfg, err := e.fakeEdge.Register(ctx, token, info, remote, link)
	if err != nil {
		return cfg, err
	}
	opened := make(chan struct{})
	go func() {
		ts, err := link.OpenTunnel(context.Background(), domain.TunnelRequest{
			Provider: "oa", Method: "GET", Path: "/x", Header: domain.Header{"X-Caller": {obsText}},
		}, nil)
		close(opened)
		if err != nil {
			e.served <- err
			return
		}
		defer ts.Close()
		for {
			if _, err := ts.Recv(context.Background()); err != nil {
				if err == io.EOF {
					err = nil
				}
				e.served <- err
				return
			}
		}
	}()
	<-opened
	return cfg, nil
}

// A tunnel opened on a link the moment it is published is encoded as the
// handshake agreed: both ends current, its header bytes arrive whole.
func TestTunnelOpenedAsTheLinkRegistersKeepsRawHeaders(t *testing.T) {
	ctx := testCtx(t)
	e := &publishingEdge{fakeEdge: newFakeEdge(), served: make(chan error, 1)}
	e.addNode(testToken, testNodeConfig())
	n := newFakeNode()
	got := make(chan domain.Header, 1)
	n.onTunnel = func(_ context.Context, req domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
		got <- req.Header
		_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: 200})
		_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelEnd})
	}
	srv := startServer(t, "", testConfig(), e)
	startClient(t, ClientConfig{Addr: srv.Addr().String(), Token: testToken, Transport: testConfig()}, n)
	recv(t, ctx, e.registered, "registration")
	h := recv(t, ctx, got, "tunnel at the node")
	mustf(t, recv(t, ctx, e.served, "tunnel served"), "tunnel")
	if v := h["X-Caller"]; len(v) != 1 || v[0] != obsText {
		t.Fatalf("the node got X-Caller=%q; want %q", v, obsText)
	}
}
