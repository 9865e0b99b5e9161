package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

// SubmitProviderTunnel asks for one raw HTTP exchange with a provider behind
// a node. The request passes through byte for byte.
type SubmitProviderTunnel struct {
	// Node pins the node (the X-IOP-Node header); empty lets the edge choose.
	Node string
	// Model is the model the caller asked for; empty means any provider of
	// the family will do (GET /api/tags pinned to a node, GET /api/version).
	Model string
	// Provider pins the provider by name on the pinned node (a follow-up
	// request to the provider that holds some state); empty lets the edge
	// choose.
	Provider string
	// ProviderType is the API family the caller used: domain.ProviderOpenAI,
	// domain.ProviderOllama or domain.ProviderAnthropic.
	ProviderType string
	// OrOnlyNode is for requests that bring a model to a node rather than
	// use one (pull, create): when no provider is known to serve Model (or
	// Model is empty) and no node is pinned, the only node with a provider
	// of the family takes it (the pinned node, when there is a pin); with
	// several such nodes the request is invalid_request, asking the caller
	// to pick one.
	OrOnlyNode bool
	Method     string
	Path       string // escaped, as the caller sent it: the node forwards it as is
	Query      string
	Header     domain.Header
	// Body is sent with the request; BodyReader, when non-nil, is streamed
	// after it in chunks (for bodies too large to hold).
	Body       []byte
	BodyReader io.Reader
}

// SubmitProviderTunnelHandler routes provider requests to nodes and follows
// the tunnels it opens: it counts them against their node, and when one
// ends it records the usage in the ledger and publishes one
// tunnel.completed event (never the body).
//
// Routing: a pinned node must be connected (node_not_found), not draining
// (shutting_down, as for a run) and have a provider that speaks the family
// (provider_not_found) and serves the model (model_not_found). Unpinned,
// the candidates are the providers of connected nodes that speak the family
// and serve the model, and the node with the fewest tunnels in flight wins
// (ties: node id, then provider config order). Draining nodes are left out
// as runs leave them out (Registry.PickForTarget): they close their link
// once their runs end, which would cut a tunnel short. No provider speaking
// the family anywhere is no_node_available; nobody serving the model is
// model_not_found, unless a draining node serves it: then, as for a run
// when every node drains, no_node_available saying they are shutting down;
// or unless the model is declared (edge.yaml models) for a configured node
// that is not connected (Nodes): then no_node_available naming that node,
// which callers retry, as they do when no node of the family is connected
// at all — a node's restart is not a model that does not exist.
// A provider whose model list is not known yet (discovery failed or
// pending) is used only when no provider with a known list serves the
// model: the provider then answers for itself (for example its own 404).
//
// Unlike a run, a tunnel is not tried again on another node: a node does
// not refuse tunnels while it drains (it serves them until its link
// closes), and Handle returns once the request is sent, before the node's
// first frame, by when a streamed body (BodyReader) may be partly gone and
// cannot be replayed.
type SubmitProviderTunnelHandler struct {
	reg     *Registry
	bus     ports.EventPublisher
	catalog *ModelCatalog
	ledger  *UsageLedger
	log     *slog.Logger
	now     func() time.Time
	newID   func() string

	// Observe receives every finished tunnel.
	Observe Observers
	// Responses, if set, is the history RecallResponse reads: where a
	// stored response this edge process does not remember was created.
	Responses ports.ResponseHistory
	// Nodes, if set, is the config's node directory: a model declared for
	// one of its nodes that is not connected is no_node_available, not
	// model_not_found (see the type's doc).
	Nodes ports.NodeDirectory
}

// NewSubmitProviderTunnelHandler refuses nil dependencies (log may be nil).
func NewSubmitProviderTunnelHandler(reg *Registry, bus ports.EventPublisher, catalog *ModelCatalog, ledger *UsageLedger, log *slog.Logger) *SubmitProviderTunnelHandler {
	if reg == nil || bus == nil || catalog == nil || ledger == nil {
		panic("edge.NewSubmitProviderTunnelHandler: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	return &SubmitProviderTunnelHandler{reg: reg, bus: bus, catalog: catalog, ledger: ledger, log: log, now: time.Now, newID: newTunnelID}
}

func newTunnelID() string { return timeOrderedID("tun", time.Now()) }

// Handle picks a node and provider for in and opens the tunnel there. The
// caller must read the returned tunnel with Next until it ends, or Close it.
// ctx bounds opening the tunnel only; Next takes its own.
func (h *SubmitProviderTunnelHandler) Handle(ctx context.Context, in SubmitProviderTunnel) (*Tunnel, error) {
	if err := domain.PrincipalFrom(ctx).Require(domain.ScopeInference); err != nil {
		return nil, err
	}
	if !slices.Contains(domain.KnownProviderTypes, in.ProviderType) {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "unknown provider API %q (known: %s)", in.ProviderType, strings.Join(domain.KnownProviderTypes, ", "))
	}
	if !strings.HasPrefix(in.Path, "/") {
		return nil, domain.Errorf(domain.CodeInvalidRequest, "path %q must start with /", in.Path)
	}
	method := in.Method
	if method == "" {
		method = "GET"
	}
	cand, link, release, served, err := h.route(domain.PrincipalFrom(ctx), in)
	if err != nil {
		return nil, err
	}
	header := in.Header.Clone()
	// The caller's credentials are for the edge; the node adds the
	// provider's own key, so they need not cross the wire at all.
	header.Del("Authorization")
	header.Del("Proxy-Authorization")
	req := domain.TunnelRequest{Provider: cand.cfg.Name, Method: method, Path: in.Path, Query: in.Query, Header: header, Body: in.Body}
	start := h.now()
	// The model may label metrics only if the chosen provider lists it,
	// and then under the name its list (or config) gives it, served: the
	// caller's spelling matches loosely (case, ":latest", a date suffix),
	// and each spelling would be a series of its own. route may pick a
	// provider that does not list it (one with no list yet, or the only
	// node's, for a request that brings a model to it), and then in.Model
	// is whatever the caller sent. The request itself goes as the caller
	// wrote it.
	model := in.Model
	if served != "" {
		model = served
	}
	obs := tunnelObservation{key: CallerKey(ctx), modelOK: served != "", bytesIn: int64(len(in.Body))}
	body := in.BodyReader
	if body != nil {
		obs.body = &countingReader{r: body}
		body = obs.body
	}
	st, err := link.OpenTunnel(ctx, req, body)
	if err != nil {
		release()
		return nil, fmt.Errorf("open tunnel to node %s: %w", cand.node, err)
	}
	return &Tunnel{
		ID: h.newID(), Node: cand.node, Provider: cand.cfg.Name, Model: model, Key: domain.PrincipalFrom(ctx).Name,
		h: h, stream: st, release: release, path: in.Path, start: start, obs: obs,
	}, nil
}

// route chooses the node and provider for in and counts a tunnel against
// the node; release undoes that. served is the name under which the chosen
// provider lists (or declares) in.Model, "" when it does not list it: the
// name that may label metrics.
func (h *SubmitProviderTunnelHandler) route(caller domain.Principal, in SubmitProviderTunnel) (_ providerModels, _ ports.NodeLink, _ func(), served string, _ error) {
	family := in.ProviderType
	if in.Node != "" {
		v, ok := h.reg.GetAs(caller, in.Node)
		if !ok {
			return providerModels{}, nil, nil, "", domain.Errorf(domain.CodeNodeNotFound, "node %q is not connected", in.Node)
		}
		if v.Draining {
			return providerModels{}, nil, nil, "", shuttingDown(in.Node)
		}
	}
	// speak: the providers that may take in; draining: those that would
	// but for their node draining.
	var speak, draining []providerModels
	for _, p := range h.catalog.providers() {
		if Speaks(p.cfg.Type, family) && (in.Node == "" || p.node == in.Node) && (in.Provider == "" || p.cfg.Name == in.Provider) && caller.SeesNode(p.node) {
			if p.draining {
				draining = append(draining, p)
				continue
			}
			speak = append(speak, p)
		}
	}
	if len(speak) == 0 && len(draining) > 0 {
		if in.Node != "" { // it began draining since the check above
			return providerModels{}, nil, nil, "", shuttingDown(in.Node)
		}
		return providerModels{}, nil, nil, "", domain.Errorf(domain.CodeNoNodeAvailable, "every connected node with a provider for the %s API is shutting down", family)
	}
	if len(speak) == 0 {
		if in.Node != "" && in.Provider != "" {
			return providerModels{}, nil, nil, "", domain.Errorf(domain.CodeProviderNotFound, "node %q no longer has provider %q for the %s API", in.Node, in.Provider, family)
		}
		if in.Node != "" {
			return providerModels{}, nil, nil, "", domain.Errorf(domain.CodeProviderNotFound, "node %q has no provider for the %s API", in.Node, family)
		}
		return providerModels{}, nil, nil, "", domain.Errorf(domain.CodeNoNodeAvailable, "no connected node has a provider for the %s API", family)
	}
	cands := speak
	if in.OrOnlyNode && (in.Model == "" || !anyServes(speak, in.Model)) {
		nodes := map[string]bool{}
		var ids []string
		for _, p := range speak {
			if !nodes[p.node] {
				nodes[p.node] = true
				ids = append(ids, p.node)
			}
		}
		if len(ids) > 1 {
			// "this request needs a node: several nodes …" (a blob upload
			// names no model), or "model "x" is on no node, and several …".
			what := "this request needs a node:"
			if in.Model != "" {
				what = fmt.Sprintf("model %q is on no node, and", in.Model)
			}
			err := domain.Errorf(domain.CodeInvalidRequest,
				"%s several nodes have a provider for the %s API (%s): choose one with the X-IOP-Node header", what, family, strings.Join(ids, ", "))
			if in.Model != "" {
				return providerModels{}, nil, nil, "", &noNodeHasModel{err}
			}
			return providerModels{}, nil, nil, "", err
		}
		in.Model = "" // the only node takes it
	}
	if in.Model != "" {
		cands = nil
		for _, p := range speak {
			if !p.known {
				continue
			}
			if p.served = p.match(in.Model); p.served != "" {
				cands = append(cands, p)
			}
		}
		if len(cands) == 0 {
			for _, p := range speak {
				if !p.known {
					cands = append(cands, p)
				}
			}
		}
		if len(cands) == 0 {
			if in.Node != "" {
				return providerModels{}, nil, nil, "", domain.Errorf(domain.CodeModelNotFound, "model %q is not served by node %q", in.Model, in.Node)
			}
			if slices.ContainsFunc(draining, func(p providerModels) bool { return !p.known || p.serves(in.Model) }) {
				return providerModels{}, nil, nil, "", domain.Errorf(domain.CodeNoNodeAvailable, "every connected node serving model %q is shutting down", in.Model)
			}
			if node, ok := h.offlineServing(caller, family, in.Provider, in.Model); ok {
				// In ErrNoNodeHasModel's chain, as model_not_found would be:
				// a caller refreshes the catalog once and asks again.
				return providerModels{}, nil, nil, "", &noNodeHasModel{domain.Errorf(domain.CodeNoNodeAvailable,
					"model %q is served by node %q, which is not connected", in.Model, node)}
			}
			return providerModels{}, nil, nil, "", domain.Errorf(domain.CodeModelNotFound, "model %q is not served by any connected node", in.Model)
		}
	}
	// providers() lists nodes by id and providers in config order, so a
	// stable sort by load keeps both as tie-breakers.
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].inFlight < cands[j].inFlight })
	for _, c := range cands {
		release, ok := h.reg.acquireTunnel(c.node)
		if !ok {
			continue // disconnected since the snapshot
		}
		v, ok := h.reg.Get(c.node)
		if !ok {
			release()
			continue
		}
		return c, v.Link, release, c.served, nil
	}
	return providerModels{}, nil, nil, "", domain.Errorf(domain.CodeNoNodeAvailable, "every node serving %q disconnected", in.Model)
}

// ErrNoNodeHasModel is in the chain of the refusal (invalid_request) of a
// request that brings a model to a node (OrOnlyNode) when no node is known
// to have the model and several could take it. The catalog may just not
// know yet: a model pulled on a node since its last refresh (iop ollama
// pull, or Ollama's own CLI on the node) is on that node, where such a
// request goes. A caller that refreshes the catalog and asks again finds
// it, as after a model_not_found. It is also in the chain of the
// no_node_available of a model that only nodes not connected declare: a
// connected node may have it by now too.
var ErrNoNodeHasModel = errors.New("no node is known to have the model")

// noNodeHasModel is that refusal: its *domain.Error and ErrNoNodeHasModel.
type noNodeHasModel struct{ err *domain.Error }

func (e *noNodeHasModel) Error() string   { return e.err.Error() }
func (e *noNodeHasModel) Unwrap() []error { return []error{e.err, ErrNoNodeHasModel} }

// shuttingDown is the error for a request pinned to a draining node, as a
// run's (Registry.PickForTarget).
func shuttingDown(node string) error {
	return domain.Errorf(domain.CodeShuttingDown, "node %q is shutting down: it takes no new requests", node)
}

// offlineServing reports a node of the config's directory that caller may
// see, is not connected, and declares a provider of family (named
// provider, if set) serving model.
func (h *SubmitProviderTunnelHandler) offlineServing(caller domain.Principal, family, provider, model string) (string, bool) {
	if h.Nodes == nil {
		return "", false
	}
	for _, rec := range h.Nodes.Records() {
		if !caller.SeesNode(rec.ID) {
			continue
		}
		if _, connected := h.reg.Get(rec.ID); connected {
			continue // its providers were looked at, as they are now
		}
		for _, p := range rec.Providers {
			pm := providerModels{cfg: p, known: true}
			if len(p.Models) > 0 && Speaks(p.Type, family) && (provider == "" || p.Name == provider) && pm.serves(model) {
				return rec.ID, true
			}
		}
	}
	return "", false
}

func anyServes(ps []providerModels, model string) bool {
	for _, p := range ps {
		if p.known && p.serves(model) {
			return true
		}
	}
	return false
}

// responseRecallTimeout bounds a stored response's recall from the
// history, as a session's is.
const responseRecallTimeout = sessionRecallTimeout

// ResponseOrigin is where a stored response was created, and by which API
// key.
type ResponseOrigin struct {
	Node, Provider, Key string
	// Counted: its usage is not for this edge to count (any more), as
	// domain.TunnelRecord.UsageCounted says.
	Counted bool
}

// Connected reports whether node is connected to this edge process (a
// stopping node too): a response created on one that is not (it left, or
// it is another edge's, sharing the history) cannot be followed up there.
func (h *SubmitProviderTunnelHandler) Connected(node string) bool {
	_, ok := h.reg.Get(node)
	return ok
}

// RecallResponse looks up in the history where stored response id was
// created, for a follow-up of a response this edge process does not
// remember (it restarted, or forgot the id among newer ones). found is
// false when there is no history or it holds no such response; err, when
// the history cannot answer within responseRecallTimeout, is
// history_unavailable.
func (h *SubmitProviderTunnelHandler) RecallResponse(ctx context.Context, id string) (o ResponseOrigin, found bool, err error) {
	if h.Responses == nil || id == "" {
		return ResponseOrigin{}, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, responseRecallTimeout)
	defer cancel()
	t, found, err := h.Responses.ResponseOrigin(ctx, id)
	if err != nil {
		h.log.Warn("stored response's owner not recalled from the history", "response", id, "key", domain.PrincipalFrom(ctx).Name, "err", err)
		return ResponseOrigin{}, false, domain.Errorf(domain.CodeHistoryUnavailable,
			"response %q: the edge's history, which says whose it is, cannot be read now; retry later", id)
	}
	if !found {
		return ResponseOrigin{}, false, nil
	}
	return ResponseOrigin{Node: t.Node, Provider: t.Provider, Key: t.Key, Counted: t.UsageCounted}, true, nil
}

// ProviderTarget is one connected node's provider of some API family.
type ProviderTarget struct {
	Node     string
	Provider string
}

// Targets lists the providers of connected nodes caller may see that speak family, nodes
// by id and providers in config order: where a request that asks every
// node (a merged list) goes. Draining nodes are left out, as Handle would
// refuse them.
func (h *SubmitProviderTunnelHandler) Targets(caller domain.Principal, family string) []ProviderTarget {
	var out []ProviderTarget
	for _, p := range h.catalog.providers() {
		if Speaks(p.cfg.Type, family) && caller.SeesNode(p.node) && !p.draining {
			out = append(out, ProviderTarget{Node: p.node, Provider: p.cfg.Name})
		}
	}
	return out
}

// Tunnel is a caller's view of one open provider tunnel. It has one
// consumer: Next and Close are called from the same goroutine.
type Tunnel struct {
	ID       string
	Node     string
	Provider string
	// Model is the model as the provider lists or declares it, when it
	// does ("llama3.2:latest" for a request for "Llama3.2"; a declared
	// Anthropic alias for a request for one of its dated ids), else the
	// one the caller named ("" for none). History, ledger and the
	// tunnel.completed event record it.
	Model string
	// Key names the API key of the caller.
	Key string
	// CountUsage, if set before the tunnel is read, decides whether the
	// usage the provider reports is this tunnel's to count (ledger,
	// history, metrics, tunnel.completed): a retrieval of a stored
	// response reports the usage its creation counted already. It runs
	// on the goroutine that calls Next.
	CountUsage func(*domain.Usage) bool
	// ReadUsage, if set before the tunnel is read, is the usage its relay
	// read from the body itself so far (nil for none). It is recorded when
	// the node reported no usage because the tunnel did not end well: the
	// caller left, or the link broke, after the provider had already
	// stated counts (an Anthropic stream's prompt, in message_start). It
	// runs once, on the goroutine that ends the tunnel, and CountUsage
	// judges its answer as it does the node's.
	ReadUsage func() *domain.Usage
	// Response, if set before the tunnel ends, is the id of the stored
	// response it created (a Responses API create): the history records
	// it, so that an edge that no longer remembers the response still
	// knows its key, node and provider (RecallResponse).
	Response string
	// UsageOf, if set before the tunnel ends, is the id of the stored
	// response a follow-up is about: the history records it with the
	// usage the tunnel counts (CountUsage), if it counts any, so that an
	// edge that no longer remembers the response knows it was counted
	// (RecallResponse).
	UsageOf string

	h       *SubmitProviderTunnelHandler
	stream  ports.TunnelStream
	release func()
	path    string
	start   time.Time

	status    int
	bodyBytes int64
	usage     *domain.Usage
	// streamErr is the error the provider stated inside its successful
	// body (the node's metadata sideband): the tunnel ends as relayed, and
	// is recorded as failed with it.
	streamErr *domain.Error
	obs       tunnelObservation
	done      bool
	once      sync.Once
}

// Next returns the tunnel's next frame, in wire order: status, header, body
// frames, usage/metadata sidebands, then end; after end it returns io.EOF.
//
// Failures are errors, never frames: an error frame from the node comes
// back as its *domain.Error (provider_unreachable, timeout, provider_error,
// …), a lost link as node_disconnected or stream_reset. Either ends the
// tunnel. If ctx ends first, Next returns ctx's error and the tunnel stays
// open: the caller then calls Close. A body frame's bytes are valid until
// the next Next or Close (ports.TunnelStream).
func (t *Tunnel) Next(ctx context.Context) (domain.TunnelFrame, error) {
	if t.done {
		return domain.TunnelFrame{}, io.EOF
	}
	f, err := t.stream.Recv(ctx)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return domain.TunnelFrame{}, err
		}
		if errors.Is(err, io.EOF) {
			err = domain.Errorf(domain.CodeNodeDisconnected, "tunnel stream ended without an end frame")
		}
		t.finish(err)
		return domain.TunnelFrame{}, err
	}
	switch f.Kind {
	case domain.TunnelStatus:
		t.status = f.Status
		t.obs.firstByte = t.h.now().Sub(t.start)
	case domain.TunnelBody:
		t.bodyBytes += int64(len(f.Body))
	case domain.TunnelUsage:
		if f.Usage != nil && (t.CountUsage == nil || t.CountUsage(f.Usage)) {
			u := *f.Usage
			t.usage = &u
		}
	case domain.TunnelMetadata:
		if e := f.StreamError; e != nil && t.streamErr == nil && t.status >= 200 && t.status < 300 {
			t.streamErr = &domain.Error{Code: domain.CodeProviderError, Message: "the provider reported an error in its stream: " + e.String()}
		}
	case domain.TunnelEnd:
		t.finish(nil)
	case domain.TunnelError:
		e := &domain.Error{Code: domain.CodeProviderError, Message: "the node reported a tunnel failure"}
		if f.Error != nil {
			e = &domain.Error{Code: f.Error.Code, Message: f.Error.Message}
		}
		t.finish(e)
		return domain.TunnelFrame{}, e
	}
	return f, nil
}

// Close abandons the tunnel if it has not ended (the node aborts the
// upstream request) and accounts for it. It is idempotent.
func (t *Tunnel) Close() {
	if !t.done {
		t.finish(domain.Errorf(domain.CodeCancelled, "the caller closed the tunnel"))
	}
}

// finish ends the tunnel once: frees the stream and the node slot, records
// the usage and publishes tunnel.completed. A tunnel that ended well but
// whose provider stated an error in its stream is recorded with that error
// (provider_error); one that failed keeps its own.
func (t *Tunnel) finish(err error) {
	t.once.Do(func() {
		t.done = true
		t.stream.Close()
		t.release()
		if t.usage == nil && err != nil && t.ReadUsage != nil {
			if u := t.ReadUsage(); u != nil && (t.CountUsage == nil || t.CountUsage(u)) {
				c := *u
				t.usage = &c
			}
		}
		if err == nil && t.streamErr != nil {
			err = t.streamErr
		}
		h := t.h
		s := domain.TunnelSummary{
			ID: t.ID, Key: t.Key, Provider: t.Provider, Model: t.Model, Path: t.path, Status: t.status,
			BodyBytes: t.bodyBytes, Duration: h.now().Sub(t.start), Usage: t.usage,
		}
		if err != nil {
			s.Error = err.Error()
			if code := domain.CodeOf(err); code != domain.CodeCancelled {
				h.log.Warn("provider tunnel failed", "tunnel", t.ID, "key", t.Key, "node", t.Node, "provider", t.Provider, "path", t.path, "err", err)
			}
		}
		h.ledger.Record(t.Node, s)
		h.observeTunnel(t, s, err)
		h.bus.Publish(domain.BusEvent{Type: domain.BusTunnelCompleted, Time: h.now(), Node: t.Node, Key: s.Key, Tunnel: &s})
	})
}
