package transport

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"iop/domain"
	"iop/ports"
	ioppb "iop/proto/iop"
)

// A frame that cannot be encoded (here a run event whose text is not UTF-8,
// which a protobuf string must be) must cost only its own stream: before,
// the writer put the encoded bytes on the wire anyway, the edge rejected
// the frame as malformed and closed the link, ending every run and tunnel
// on it.
func TestUnencodableNodeFrameResetsOnlyItsStream(t *testing.T) {
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.runScript = func(req domain.RunRequest) []domain.RunEvent {
			if req.RunID != "r-bad" {
				return defaultScript(req)
			}
			return []domain.RunEvent{
				{RunID: req.RunID, Seq: 1, Type: domain.EventStart},
				{RunID: req.RunID, Seq: 2, Type: domain.EventDelta, Text: "caf\xe9"},
				{RunID: req.RunID, Seq: 3, Type: domain.EventComplete},
			}
		}
	})
	rs, err := p.link.StartRun(p.ctx, runReq("r-bad"))
	mustf(t, err, "StartRun")
	defer rs.Close()
	ev, err := rs.Recv(p.ctx)
	mustf(t, err, "Recv start")
	if ev.Type != domain.EventStart {
		t.Fatalf("first event %+v", ev)
	}
	if ev, err := rs.Recv(p.ctx); !errors.Is(err, &domain.Error{Code: domain.CodeStreamReset}) {
		t.Fatalf("after the unencodable event: %+v, %v; want the stream reset", ev, err)
	}
	requireLinkServes(t, p)
}

// The same on the edge's side: a request that cannot be encoded fails its
// own stream with invalid_request and never reaches the node.
func TestUnencodableEdgeFrameFailsOnlyItsStream(t *testing.T) {
	p := newPair(t, pairOptions{}, nil)
	req := runReq("r-bad")
	req.Target = "caf\xe9"
	rs, err := p.link.StartRun(p.ctx, req)
	if err == nil {
		defer rs.Close()
		_, err = rs.Recv(p.ctx)
	}
	if !errors.Is(err, &domain.Error{Code: domain.CodeInvalidRequest}) {
		t.Fatalf("run request with a non-UTF-8 target: %v; want invalid_request", err)
	}
	requireLinkServes(t, p)
	select {
	case got := <-p.node.runStarted:
		if got.RunID == "r-bad" {
			t.Fatal("the node ran the request that could not be encoded")
		}
	default:
	}
}

// requireLinkServes checks that p's link is still the one the node
// registered with and carries a run to its end.
func requireLinkServes(t *testing.T, p *pair) {
	t.Helper()
	rs, err := p.link.StartRun(p.ctx, runReq("r-after"))
	mustf(t, err, "StartRun after the failed stream")
	defer rs.Close()
	var last domain.RunEvent
	for {
		ev, err := rs.Recv(p.ctx)
		if err == io.EOF {
			break
		}
		mustf(t, err, "run after the failed stream")
		last = ev
	}
	if last.Type != domain.EventComplete {
		t.Fatalf("run after the failed stream ended with %+v", last)
	}
	if err := p.link.conn.Err(); err != nil {
		t.Fatalf("link ended: %v", err)
	}
	if n := p.edge.registerCount(); n != 1 {
		t.Fatalf("node registered %d times; the link was dropped", n)
	}
	eventually(t, p.ctx, "streams released", func() bool {
		return p.link.Stats().Streams == 0 && p.cli.currentConn().Stats().Streams == 0
	})
}

// frameKind names a frame's body as the wire docs do, for logs and errors.
func TestFrameKindNamesTheBody(t *testing.T) {
	if got := frameKind(&ioppb.Frame{Body: &ioppb.Frame_RunEvent{}}); got != "RunEvent" {
		t.Fatalf("frameKind = %q, want RunEvent", got)
	}
}

// Error messages quote what a provider or process sent (here a malformed
// header line) and may not be UTF-8; they arrive as themselves, made valid,
// not as a bare stream reset (or a config push waiting for an ack that
// never comes).
func TestErrorMessagesThatAreNotUTF8ArriveAsErrors(t *testing.T) {
	const raw = "malformed MIME header line: X-A: caf\xe9"
	const valid = "malformed MIME header line: X-A: caf\uFFFD"
	p := newPair(t, pairOptions{}, func(_ *fakeEdge, n *fakeNode) {
		n.onTunnel = func(_ context.Context, _ domain.TunnelRequest, _ io.Reader, out ports.TunnelSink) {
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: domain.CodeProviderError, Message: raw}})
		}
		n.cancelErr = func(string) error { return domain.Errorf(domain.CodeRunFinished, "%s", raw) }
		n.applyErr = func(cfg domain.NodeConfig) error {
			if cfg.Version > 7 {
				return errors.New(raw)
			}
			return nil
		}
	})

	ts, err := p.link.OpenTunnel(p.ctx, domain.TunnelRequest{Provider: "oa", Method: "GET", Path: "/x"}, nil)
	mustf(t, err, "OpenTunnel")
	defer ts.Close()
	f, err := ts.Recv(p.ctx)
	if err != nil || f.Kind != domain.TunnelError || f.Error.Message != valid {
		t.Fatalf("tunnel: %+v %v; want its error frame with message %q", f, err, valid)
	}

	err = p.link.CancelRun(p.ctx, "r1", "")
	if !errors.Is(err, domain.ErrRunFinished) || !strings.Contains(err.Error(), valid) {
		t.Fatalf("cancel: %v; want run_finished: %s", err, valid)
	}

	cfg := testNodeConfig()
	cfg.Version = 8
	err = p.link.PushConfig(p.ctx, cfg)
	if !errors.Is(err, &domain.Error{Code: domain.CodeConfigError}) || !strings.Contains(err.Error(), valid) {
		t.Fatalf("config push: %v; want config_error: %s", err, valid)
	}
	requireLinkServes(t, p)
}
