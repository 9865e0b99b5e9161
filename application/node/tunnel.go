package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

// tunnelChunk is the read size for provider bodies: each read is relayed at
// once, so the first SSE chunk reaches the caller as soon as it is flushed.
const tunnelChunk = 32 << 10

// chunkPool holds read buffers: one per tunnel was allocated and cleared per
// request. The sink copies each chunk it sends, so the buffer is free when
// the tunnel ends.
var chunkPool = sync.Pool{New: func() any { b := make([]byte, tunnelChunk); return &b }}

// TunnelHandler relays provider HTTP responses to the edge byte for byte:
// status, headers, body chunks as they arrive, then usage and an error the
// provider stated in a successful stream (sideband) and end, or, when the
// provider's body breaks, what it reported so far and an error instead of
// end.
type TunnelHandler struct {
	rt     *Runtime
	client ports.ProviderClient
	log    *slog.Logger

	// Latencies, if set, sums each provider's time to response headers.
	Latencies *ProviderLatencies

	mu     sync.Mutex
	active int
	idle   chan struct{} // closed, and replaced, each time active falls to 0
}

// NewTunnelHandler refuses nil dependencies.
func NewTunnelHandler(rt *Runtime, client ports.ProviderClient, log *slog.Logger) *TunnelHandler {
	if rt == nil || client == nil {
		panic("node.NewTunnelHandler: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	return &TunnelHandler{rt: rt, client: client, log: log}
}

// Idle reports the tunnels open now (relaying or still waiting for their
// provider) and a channel closed once none is: a stopping node waits on
// it so that the requests it relays end before its link closes.
func (h *TunnelHandler) Idle() (open int, idle <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.active == 0 {
		c := make(chan struct{})
		close(c)
		return 0, c
	}
	if h.idle == nil {
		h.idle = make(chan struct{})
	}
	return h.active, h.idle
}

func (h *TunnelHandler) begin() {
	h.mu.Lock()
	h.active++
	h.mu.Unlock()
}

func (h *TunnelHandler) end() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.active--; h.active == 0 && h.idle != nil {
		close(h.idle)
		h.idle = nil
	}
}

// OpenTunnel makes req to its provider and relays the response to out. When
// ctx ends (the caller left), the upstream request is aborted.
func (h *TunnelHandler) OpenTunnel(ctx context.Context, req domain.TunnelRequest, body io.Reader, out ports.TunnelSink) {
	h.begin()
	defer h.end()
	fail := func(code, format string, args ...any) {
		e := domain.Errorf(code, format, args...)
		_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelError, Error: &domain.ErrorInfo{Code: e.Code, Message: e.Message}})
	}
	p, ok := h.rt.Provider(req.Provider)
	if !ok {
		fail(domain.CodeProviderNotFound, "provider %q is not configured on this node", req.Provider)
		return
	}
	began := time.Now()
	resp, err := h.client.Do(ctx, p, req, body)
	if err == nil {
		h.Latencies.observe(req.Provider, time.Since(began))
	}
	if err != nil {
		code := domain.CodeOf(err)
		if code == domain.CodeInternal {
			code = domain.CodeProviderUnreachable
		}
		fail(code, "%s", domain.MessageOf(err))
		return
	}
	defer resp.Body.Close()
	if resp.Status < 200 {
		// A 101 (the clients return it, not skip it as other 1xx): the
		// caller never asked to switch protocols (its Upgrade is not sent
		// on), and relayed as a final answer it would tell whatever sits in
		// front of the edge that the connection is now a raw tunnel while
		// the edge goes on reading HTTP from it.
		h.log.Warn("provider switched protocols unasked", "provider", req.Provider, "path", req.Path, "status", resp.Status)
		fail(domain.CodeProviderError, "the provider answered %d to a request that did not ask to switch protocols (tunnels do not upgrade connections)", resp.Status)
		return
	}
	if out.Send(domain.TunnelFrame{Kind: domain.TunnelStatus, Status: resp.Status}) != nil {
		return
	}
	if err := out.Send(domain.TunnelFrame{Kind: domain.TunnelHeader, Header: resp.Header}); err != nil {
		var tooBig *ports.FrameTooLargeError
		if errors.As(err, &tooBig) {
			// The link cannot carry headers this large in one frame (the
			// provider client itself takes up to 10 MiB). Without an error
			// frame the edge would see only a reset stream, a bare 502.
			if tooBig.MaxElements > 0 {
				h.log.Warn("provider response headers too many to relay", "provider", req.Provider, "path", req.Path,
					"status", resp.Status, "elements", tooBig.Elements, "max", tooBig.MaxElements)
				fail(domain.CodeProviderError, "the provider's response has too many headers to relay (%d header entries, names and values, at most %d)", tooBig.Elements, tooBig.MaxElements)
				return
			}
			h.log.Warn("provider response headers too large to relay", "provider", req.Provider, "path", req.Path,
				"status", resp.Status, "bytes", tooBig.Size, "max", tooBig.Max)
			fail(domain.CodeProviderError, "the provider's response headers are too large to relay (%d bytes, at most %d)", tooBig.Size, tooBig.Max)
		}
		return
	}
	bp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bp)
	buf := *bp
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			// Send copies what it keeps (the port's contract): the buffer
			// is read into again at once.
			if out.Send(domain.TunnelFrame{Kind: domain.TunnelBody, Body: buf[:n]}) != nil {
				return
			}
		}
		if rerr == nil {
			continue
		}
		if !errors.Is(rerr, io.EOF) {
			if ctx.Err() != nil {
				return
			}
			// What the provider reported before the break is still owed:
			// an Anthropic stream states (and bills) its prompt in
			// message_start, long before its end.
			sendSideband(resp, out)
			fail(domain.CodeProviderError, "upstream body failed: %v", rerr)
			return
		}
		break
	}
	sendSideband(resp, out)
	_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelEnd})
}

// sendSideband sends what the provider reported in the body read so far:
// its usage, if any, as the tunnel's usage frame, and an error it stated
// inside a successful (2xx) body, if any, as a metadata frame, so that the
// edge records the tunnel as failed although its status and bytes are
// those of a success.
func sendSideband(resp *ports.ProviderResponse, out ports.TunnelSink) {
	if resp.Usage != nil {
		if u := resp.Usage(); u != nil {
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelUsage, Usage: u})
		}
	}
	if resp.StreamError != nil && resp.Status >= 200 && resp.Status < 300 {
		if e := resp.StreamError(); e != nil {
			_ = out.Send(domain.TunnelFrame{Kind: domain.TunnelMetadata, StreamError: e})
		}
	}
}
