package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"time"

	"iop/domain"
	"iop/domain/nodecmd"
	"iop/ports"
)

// NodeCommandHandler runs a node command (capabilities, transport_status,
// usage_status, session_list, runs, run_get, ollama.*) on one node.
type NodeCommandHandler struct {
	reg *Registry
	// Timeout bounds a command until it reports progress; one that does
	// (a model download, say) streams for up to LongTimeout. Which commands
	// stream is the node's to say, by sending progress: the edge knows no
	// command by name.
	Timeout     time.Duration
	LongTimeout time.Duration
	// MaxRequestBytes bounds a command request as it goes to the node in
	// one frame (DefaultMaxRequestBytes; bootstrap sets the link's max frame
	// size); a larger one is refused with invalid_request. Zero or less
	// disables the check.
	MaxRequestBytes int
	// Ledger, when set, adds the edge's own part to usage_status: the node
	// counts runs, the edge counts the tunnels it relays ("tunnels").
	Ledger *UsageLedger
}

// NewNodeCommandHandler refuses nil dependencies.
func NewNodeCommandHandler(reg *Registry) *NodeCommandHandler {
	if reg == nil {
		panic("edge.NewNodeCommandHandler: nil dependency")
	}
	return &NodeCommandHandler{reg: reg, Timeout: 30 * time.Second, LongTimeout: 2 * time.Hour, MaxRequestBytes: DefaultMaxRequestBytes}
}

// Handle starts the command and returns its reply stream together with the
// context bounding it; the caller must call the returned cancel when done.
// When the bound is reached, context.Cause of the context is
// context.DeadlineExceeded.
func (h *NodeCommandHandler) Handle(ctx context.Context, node, name string, args []byte) (ports.CommandStream, context.Context, context.CancelFunc, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return nil, nil, nil, domain.Errorf(domain.CodeInvalidRequest, "command is required")
	}
	if err := domain.CheckPathID("node id", node); err != nil {
		return nil, nil, nil, err
	}
	if err := domain.CheckID("command", name); err != nil {
		return nil, nil, nil, err
	}
	if size := len(name) + len(args) + requestOverhead; h.MaxRequestBytes > 0 && size > h.MaxRequestBytes {
		return nil, nil, nil, domain.Errorf(domain.CodeInvalidRequest, "command request is too large: its arguments take %d bytes, the node link carries at most %d",
			len(args), h.MaxRequestBytes-requestOverhead)
	}
	n, err := h.reg.resolve(domain.PrincipalFrom(ctx), node)
	if err != nil {
		return nil, nil, nil, err
	}
	long, cancelLong := context.WithTimeout(ctx, max(h.LongTimeout, h.Timeout))
	ctx, cancelShort := context.WithCancelCause(long)
	short := time.AfterFunc(h.Timeout, func() { cancelShort(context.DeadlineExceeded) })
	cancel := func() {
		short.Stop()
		cancelShort(context.Canceled)
		cancelLong()
	}
	cs, err := n.Link.Command(ctx, name, args)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	cs = &progressExtends{CommandStream: &jsonReplies{CommandStream: cs, node: n.ID, name: name}, short: short}
	if name == nodecmd.CmdUsageStatus && h.Ledger != nil {
		cs = &withTunnelUsage{CommandStream: cs, lines: func() []UsageLine { return h.Ledger.ForNode(n.ID) }}
	}
	return cs, ctx, cancel, nil
}

// withTunnelUsage fills in the edge's part of a usage_status result, the
// tunnels it relayed for the node. A result that does not decode as the
// contract's UsageStatus is passed on untouched.
type withTunnelUsage struct {
	ports.CommandStream
	lines func() []UsageLine
}

func (w *withTunnelUsage) Recv(ctx context.Context) (ports.CommandReply, error) {
	r, err := w.CommandStream.Recv(ctx)
	if err != nil || !r.Final || r.Err != nil {
		return r, err
	}
	var u *nodecmd.UsageStatus
	if json.Unmarshal(r.Result, &u) != nil || u == nil {
		return r, nil
	}
	u.Tunnels = w.lines()
	if out, merr := json.Marshal(u); merr == nil {
		r.Result = out
	}
	return r, nil
}

// jsonReplies holds a node to the contract that its command results and
// progress reports are JSON. The edge passed them on as they came: a
// broken or hostile node's text went out as a "200 application/json"
// answer, or a progress event, that was not JSON (terminal escapes and
// all). A progress report that is not JSON is dropped (and does not lift
// the short timeout); a result that is not JSON fails the command with
// bad_result. An empty result is the edge's "{}", as before.
type jsonReplies struct {
	ports.CommandStream
	node, name string
}

func (j *jsonReplies) Recv(ctx context.Context) (ports.CommandReply, error) {
	for {
		r, err := j.CommandStream.Recv(ctx)
		if err != nil {
			return r, err
		}
		if !r.Final {
			if len(r.Progress) > 0 && !json.Valid(r.Progress) {
				continue
			}
			return r, nil
		}
		if r.Err == nil && len(bytes.TrimSpace(r.Result)) > 0 && !json.Valid(r.Result) {
			return ports.CommandReply{Final: true, Err: domain.Errorf(domain.CodeBadResult,
				"node %q answered command %q with a result that is not JSON (%d bytes)", j.node, j.name, len(r.Result))}, nil
		}
		return r, nil
	}
}

// progressExtends lifts the ordinary timeout once the command reports
// progress, leaving it the long one.
type progressExtends struct {
	ports.CommandStream
	short *time.Timer
}

func (p *progressExtends) Recv(ctx context.Context) (ports.CommandReply, error) {
	r, err := p.CommandStream.Recv(ctx)
	if err == nil && !r.Final && r.Progress != nil {
		p.short.Stop()
	}
	return r, err
}

// Call runs a command to completion and returns its final result, all of
// it within Timeout. It is how the edge asks nodes its own questions
// (run_get, runs), which answer at once and report no progress: a progress
// report, which lifts a streaming command's bound to LongTimeout (Handle),
// lifts nothing here, so a node that sends one and then nothing (broken or
// hostile) holds a lookup asked of every node for Timeout, not for hours.
func (h *NodeCommandHandler) Call(ctx context.Context, node, name string, args []byte) ([]byte, error) {
	ctx, cancelCall := context.WithTimeout(ctx, h.Timeout)
	defer cancelCall()
	cs, cctx, cancel, err := h.Handle(ctx, node, name, args)
	if err != nil {
		return nil, err
	}
	defer cancel()
	defer cs.Close()
	for {
		r, err := cs.Recv(cctx)
		if err != nil {
			if cctx.Err() != nil {
				return nil, domain.Errorf(domain.CodeTimeout, "command %s on node %s: %v", name, node, err)
			}
			return nil, err
		}
		if r.Final {
			return r.Result, r.Err
		}
	}
}
