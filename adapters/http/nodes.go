package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"iop/domain"
	"iop/ports"
)

func (s *Server) handleListNodes(w http.ResponseWriter, _ *http.Request) {
	out := struct {
		Nodes []nodeJSON `json:"nodes"`
	}{Nodes: []nodeJSON{}}
	for _, n := range s.deps.Registry.List() {
		out.Nodes = append(out.Nodes, toNodeJSON(n))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetNode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	n, ok := s.deps.Registry.Get(id)
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
		case errors.Is(cctx.Err(), context.DeadlineExceeded):
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
			if req.Command == "usage_status" {
				result = s.withTunnelUsage(r.PathValue("id"), result)
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

// usageLineJSON is one line of the edge's tunnel usage ledger.
type usageLineJSON struct {
	Node             string `json:"node"`
	Provider         string `json:"provider"`
	Model            string `json:"model"`
	Requests         int64  `json:"requests"`
	Errors           int64  `json:"errors"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	TotalTokens      int64  `json:"total_tokens"`
	BodyBytes        int64  `json:"body_bytes"`
}

func (s *Server) tunnelUsage(node string) []usageLineJSON {
	out := []usageLineJSON{}
	if s.deps.TunnelUsage == nil {
		return out
	}
	for _, l := range s.deps.TunnelUsage(node) {
		out = append(out, usageLineJSON{Node: l.Node, Provider: l.Provider, Model: l.Model, Requests: l.Requests, Errors: l.Errors,
			PromptTokens: l.PromptTokens, CompletionTokens: l.CompletionTokens, TotalTokens: l.TotalTokens, BodyBytes: l.BodyBytes})
	}
	return out
}

// withTunnelUsage adds the edge's tunnel usage for node to a usage_status
// result: runs are counted by the node, tunnels by the edge that relays them.
func (s *Server) withTunnelUsage(node string, result []byte) []byte {
	var m map[string]json.RawMessage
	if s.deps.TunnelUsage == nil || json.Unmarshal(result, &m) != nil {
		return result
	}
	t, err := json.Marshal(s.tunnelUsage(node))
	if err != nil {
		return result
	}
	m["tunnels"] = t
	out, err := json.Marshal(m)
	if err != nil {
		return result
	}
	return out
}

// handleUsage answers GET /v1/usage?node=: the edge's tunnel usage ledger.
func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"tunnels": s.tunnelUsage(r.URL.Query().Get("node"))})
}
