package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

func (s *Server) handleListNodes(w http.ResponseWriter, r *http.Request) {
	out := struct {
		Nodes []nodeJSON `json:"nodes"`
	}{Nodes: []nodeJSON{}}
	caller := domain.PrincipalFrom(r.Context())
	if s.deps.Nodes == nil {
		for _, n := range s.deps.Registry.ListAs(caller) {
			out.Nodes = append(out.Nodes, toNodeJSON(n))
		}
	} else {
		for _, e := range s.deps.Nodes.ListAs(caller) {
			out.Nodes = append(out.Nodes, toNodeEntryJSON(e))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetNode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	// Checked like every other id a caller sends: an id with control
	// characters or invalid UTF-8 came back in the error message.
	if err := domain.CheckPathID("node id", id); err != nil {
		writeError(w, err)
		return
	}
	n, ok := s.deps.Registry.GetAs(domain.PrincipalFrom(r.Context()), id)
	if !ok {
		writeError(w, domain.Errorf(domain.CodeNodeNotFound, "node %q is not connected", id))
		return
	}
	writeJSON(w, http.StatusOK, toNodeJSON(n))
}

// commandRequest is the body of POST /v1/nodes/{id}/commands.
type commandRequest struct {
	Command string          `json:"command"`
	Args    json.RawMessage `json:"args"`
}

type commandReply struct {
	ports.CommandReply
	err error
}

// handleNodeCommand runs a node command. The answer is the command's JSON
// result (200), or an error body with statusFor's status — unless the
// client accepts text/event-stream or the command reports progress: then
// the answer is an event stream of "progress" events ending with one
// "result" or "error" event ({"error":{"code","message"}}).
func (s *Server) handleNodeCommand(w http.ResponseWriter, r *http.Request) {
	var req commandRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	var args []byte
	if t := bytes.TrimSpace(req.Args); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		args = t
	}
	ctx, cancel := s.streamContext(r)
	defer cancel()
	cs, cctx, ccancel, err := s.deps.Commands.Handle(ctx, r.PathValue("id"), req.Command, args)
	if err != nil {
		writeError(w, err)
		return
	}

	replies := make(chan commandReply)
	pumpDone := make(chan struct{})
	go func() {
		defer close(pumpDone)
		defer close(replies)
		for {
			rep, err := cs.Recv(cctx)
			select {
			case replies <- commandReply{CommandReply: rep, err: err}:
			case <-cctx.Done():
				return
			}
			if err != nil || rep.Final {
				return
			}
		}
	}()
	defer func() {
		ccancel()
		<-pumpDone
		cs.Close()
	}()

	var sse *sseWriter
	fail := func(err error) {
		if sse == nil {
			writeError(w, err)
			return
		}
		_ = sse.eventJSON("error", errorBody{Error: errorJSON{Code: domain.CodeOf(err), Message: domain.MessageOf(err)}})
	}
	// ended explains why the reply stream stopped early; nil when the
	// client has gone and there is nobody to tell.
	ended := func(err error) error {
		switch {
		case r.Context().Err() != nil:
			return nil
		case s.shuttingDown(r):
			return domain.Errorf(domain.CodeShuttingDown, "the edge is shutting down")
		case errors.Is(context.Cause(cctx), context.DeadlineExceeded):
			return domain.Errorf(domain.CodeTimeout, "command %s on node %s did not finish in time", req.Command, r.PathValue("id"))
		case err == nil || errors.Is(err, io.EOF):
			return domain.Errorf(domain.CodeNodeDisconnected, "command %s ended without a result", req.Command)
		}
		return err
	}
	var tick <-chan time.Time
	var ticker *time.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	startStream := func() bool {
		if sse != nil {
			return true
		}
		var err error
		if sse, err = s.startSSE(w, nil); err != nil {
			return false
		}
		ticker = time.NewTicker(s.keepAlive())
		tick = ticker.C
		return true
	}
	if wantsSSE(r) && !startStream() {
		return
	}
	for {
		select {
		case rep, ok := <-replies:
			if !ok || rep.err != nil {
				if err := ended(rep.err); err != nil {
					fail(err)
				}
				return
			}
			if !rep.Final {
				if len(rep.Progress) == 0 {
					continue
				}
				if !startStream() || sse.event("progress", rep.Progress) != nil {
					return
				}
				continue
			}
			if rep.Err != nil {
				fail(rep.Err)
				return
			}
			result := bytes.TrimSpace(rep.Result)
			if len(result) == 0 {
				result = []byte("{}")
			}
			if sse != nil {
				_ = sse.event("result", result)
				return
			}
			writeRawJSON(w, http.StatusOK, result)
			return
		case <-tick:
			if sse.keepAlive() != nil {
				return
			}
		}
	}
}

// handleUsage answers GET /v1/usage?node=: the edge's tunnel usage ledger.
func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) {
	lines := []edge.UsageLine{}
	if s.deps.TunnelUsage != nil {
		lines = s.deps.TunnelUsage(r.URL.Query().Get("node"))
	}
	if caller := domain.PrincipalFrom(r.Context()); caller.Limited() {
		visible := lines[:0:0]
		for _, l := range lines {
			if caller.SeesNode(l.Node) {
				visible = append(visible, l)
			}
		}
		lines = visible
	}
	writeJSON(w, http.StatusOK, map[string]any{"tunnels": lines})
}
