// Package openaiapi serves the edge's provider passthrough surfaces — the
// OpenAI-compatible API, the Anthropic Messages API and Ollama's native API —
// by passing requests through provider tunnels to the nodes whose providers
// serve the requested model.
//
// Routes (mount the Handler at the server root, without StripPrefix: the
// request path is forwarded to the provider unchanged):
//
//	POST /v1/chat/completions, /v1/completions, /v1/embeddings,
//	     /v1/responses, /v1/images/generations, /v1/rerank        → a provider of the OpenAI API, by the body's "model"
//	POST /v1/audio/transcriptions, /v1/audio/translations         → the same, the model read from the multipart form
//	POST /v1/responses/compact, /v1/responses/input_tokens          → the same (by "model"; input_tokens may name only a previous_response_id seen created)
//	POST /v1/responses{,/compact,/input_tokens} with a previous_response_id seen created,
//	GET|DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel,
//	GET /v1/responses/{id}/input_items                            → the node and provider that created the response
//	POST /v1/messages, /v1/messages/count_tokens                  → a provider of the Anthropic Messages API
//	GET  /v1/models, /v1/models/{model}                           → merged from the model catalog
//	GET|HEAD /                                                    → 200 "Ollama is running" (Ollama clients and Claude Code probe it)
//	POST /api/chat, /api/generate, /api/embed, /api/embeddings,
//	     /api/show, /api/push; DELETE /api/delete                 → the ollama provider serving the model
//	POST /api/copy                                                → the ollama provider serving "source"
//	POST /api/pull, /api/create                                   → the provider serving the model, else the only node with an ollama provider
//	HEAD|POST /api/blobs/{digest}                                 → the pinned node, else the only node with an ollama provider
//	GET  /api/tags, /api/ps                                       → every node's answer merged (pinned: the node's, its providers' merged if several)
//	GET  /api/version                                             → passed through to an ollama provider
//
// The optional request header X-IOP-Node pins the node. The model is read
// from the JSON body ("model"; Ollama's legacy "name" too); the body itself
// is forwarded byte for byte. A model no node serves triggers a refresh of
// the model catalog (rounds shared by concurrent callers, at most one per
// edge.ModelCatalog.MinRefreshGap) before the answer is 404; /v1/models
// and /api/tags refresh the same way before they answer, so a model just
// pulled or copied on a provider is seen at once.
//
// Passthrough is faithful: the provider's status code, headers (minus
// hop-by-hop, X-IOP-* and CORS ones; Content-Length kept) and body bytes reach the caller
// unchanged, upstream 4xx/5xx included, and every body frame is flushed as
// it arrives. Usage and metadata frames are sideband and never written (the
// start of an Anthropic event stream is also read for the prompt tokens
// its message_start states, recorded if the stream is cut short). If
// the tunnel fails after the response has started (node lost, provider
// reset), the handler aborts the response with http.ErrAbortHandler, so the
// caller sees a broken stream — never a clean end or a synthesized
// "[DONE]". Middleware must let that panic through. When the caller goes
// away, the tunnel is closed and the node aborts the upstream request.
//
// Errors the edge writes itself use the caller's dialect: OpenAI's
// {"error":{"message","type","param","code"}} on /v1 routes, Anthropic's
// {"type":"error","error":{"type","message"}} on /v1/messages (and on
// /v1/models asked with anthropic-version), Ollama's {"error":"message"}
// on /api routes and / ("model 'x' not found" for an unknown model, the
// text Ollama's CLI matches). See WriteError.
//
// Request bodies: at most MaxBody bytes (DefaultMaxBody, 32 MiB; more is
// 413), uncompressed (a Content-Encoding but identity is 415). The body
// is read only as far as the model: a byte scan of the
// top-level JSON object that keeps what it read and a depth counter, never
// a parse tree, refuses nesting deeper than MaxDepth (400) and stops at
// "model" (on POST /v1/responses and its /compact and /input_tokens, once
// it has seen both "model" and "previous_response_id", so at the end of a
// body without the latter);
// what was read and the rest of the body then stream to the node as the
// caller sends them, through a guard that fails the body on a model (or
// previous_response_id) named twice (keyGuard, formGuard). So a request
// costs at most its prefix up to the keys it routes on (bounded by
// MaxBody), whatever its shape. Blob uploads (/api/blobs) are streamed
// without the cap: nothing of them is held.
package openaiapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"iop/adapters/internal/deadline"
	"iop/adapters/internal/hopheader"
	"iop/adapters/provider"
	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// Defaults of the Handler's tunables.
const (
	DefaultMaxBody          = 32 << 20
	DefaultWriteIdleTimeout = 5 * time.Minute
	// smallBody is the largest declared body read whole before routing
	// (its first piece then travels in the tunnel's opening frame, the
	// rest in pieces behind it: transport's OpenTunnel).
	smallBody = 1 << 20
	// maxListBody bounds one node's answer to a merged list (/api/ps).
	maxListBody = 8 << 20
	// listTimeout bounds asking one node for its part of a merged list.
	listTimeout = 15 * time.Second
	// DefaultRefreshWait bounds the wait for a model catalog refresh.
	DefaultRefreshWait = 3 * time.Second
)

// NodeHeader pins a request to one node.
const NodeHeader = "X-IOP-Node"

// Deps are the use cases the surface needs; both are required.
type Deps struct {
	Tunnels *edge.SubmitProviderTunnelHandler
	Models  *edge.ModelCatalog
}

// Handler is the OpenAI-compatible, Anthropic Messages and Ollama-native
// surface.
type Handler struct {
	deps      Deps
	log       *slog.Logger
	routes    map[string]map[string]http.HandlerFunc
	responses *responseNodes

	// MaxBody bounds request bodies (DefaultMaxBody). Set before serving.
	MaxBody int64
	// RefreshWait bounds how long a model list or a model miss waits for a
	// catalog refresh (DefaultRefreshWait). Set before serving.
	RefreshWait time.Duration
	// WriteIdleTimeout bounds each write to the caller (DefaultWriteIdleTimeout),
	// so a caller that stops reading cannot hold a tunnel forever; it also
	// lifts any server-wide WriteTimeout for long streams. Set before serving.
	WriteIdleTimeout time.Duration
}

// target is how one route reaches a provider.
type target struct {
	family string   // the provider API family that serves the route
	keys   []string // JSON body keys naming the model, preferred first
	form   bool     // the model is the multipart form field "model"
	// orOnlyNode: the request brings a model to a node (pull, create,
	// blobs), so without a node serving it the only candidate node takes it.
	orOnlyNode bool
	unbounded  bool // the body streams without the MaxBody cap (blobs)
	remember   bool // remember the created response's id → node
	// follows is the JSON body key naming a response this request
	// continues (previous_response_id): that response's state lives only
	// with the provider that created it, so a remembered id pins its node
	// and provider, as the follow-ups of a response do.
	follows string
	// followUp is the id of the stored response a follow-up (retrieve,
	// delete, cancel, input items) is about: its usage was counted once.
	followUp string
	// modelOptional: a body without a model is routed by its follows id
	// alone when that id is remembered (else it is still refused).
	modelOptional bool
}

var (
	modelKeys  = []string{"model"}
	ollamaKeys = []string{"model", "name"} // Ollama's legacy "name"
	copyKeys   = []string{"source"}        // /api/copy's model
)

// followsKey is the body key of the Responses routes that names the
// response a request continues.
const followsKey = "previous_response_id"

// New builds the handler; it refuses missing dependencies.
func New(deps Deps, log *slog.Logger) *Handler {
	if deps.Tunnels == nil || deps.Models == nil {
		panic("openaiapi.New: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{deps: deps, log: log, MaxBody: DefaultMaxBody, WriteIdleTimeout: DefaultWriteIdleTimeout, RefreshWait: DefaultRefreshWait,
		responses: newResponseNodes(maxResponseIDs)}
	via := func(t target) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { h.proxy(w, r, t, "", "") }
	}
	openai := via(target{family: domain.ProviderOpenAI, keys: modelKeys})
	form := via(target{family: domain.ProviderOpenAI, form: true})
	anthropic := via(target{family: domain.ProviderAnthropic, keys: modelKeys})
	ollama := via(target{family: domain.ProviderOllama, keys: ollamaKeys})
	bring := via(target{family: domain.ProviderOllama, keys: ollamaKeys, orOnlyNode: true})
	post := func(f http.HandlerFunc) map[string]http.HandlerFunc {
		return map[string]http.HandlerFunc{http.MethodPost: f}
	}
	get := func(f http.HandlerFunc) map[string]http.HandlerFunc {
		return map[string]http.HandlerFunc{http.MethodGet: f}
	}
	h.routes = map[string]map[string]http.HandlerFunc{
		"/v1/chat/completions":      post(openai),
		"/v1/completions":           post(openai),
		"/v1/embeddings":            post(openai),
		"/v1/responses":             post(via(target{family: domain.ProviderOpenAI, keys: modelKeys, remember: true, follows: followsKey})),
		"/v1/images/generations":    post(openai),
		"/v1/rerank":                post(openai),
		"/v1/audio/transcriptions":  post(form),
		"/v1/audio/translations":    post(form),
		"/v1/messages":              post(anthropic),
		"/v1/messages/count_tokens": post(anthropic),
		"/v1/models":                get(h.listModels),
		"/":                         get(h.root),
		"/api/chat":                 post(ollama),
		"/api/generate":             post(ollama),
		"/api/embed":                post(ollama),
		"/api/embeddings":           post(ollama),
		"/api/show":                 post(ollama),
		"/api/push":                 post(ollama),
		"/api/delete":               {http.MethodDelete: ollama},
		"/api/copy":                 post(via(target{family: domain.ProviderOllama, keys: copyKeys})),
		"/api/pull":                 post(bring),
		"/api/create":               post(bring),
		"/api/tags":                 get(h.tags),
		"/api/ps":                   get(h.ps),
		"/api/version": get(func(w http.ResponseWriter, r *http.Request) {
			h.proxy(w, r, target{family: domain.ProviderOllama}, "", "")
		}),
	}
	// Compaction and input token counts take a create's body (model,
	// input, previous_response_id) and create nothing to follow up;
	// counting needs no model when the previous response says where.
	h.routes["/v1/responses/compact"] = post(via(target{family: domain.ProviderOpenAI, keys: modelKeys, follows: followsKey}))
	h.routes["/v1/responses/input_tokens"] = post(via(target{family: domain.ProviderOpenAI, keys: modelKeys, follows: followsKey, modelOptional: true}))
	return h
}

// ServeHTTP dispatches by path; unknown paths are 404 and wrong methods
// 405, in the caller's dialect. HEAD is served wherever GET is.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	methods, ok := h.routes[r.URL.Path]
	if !ok {
		methods, ok = h.prefixRoute(r.URL.Path)
	}
	if !ok {
		WriteError(w, r, http.StatusNotFound, "not_found", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
		return
	}
	serve, ok := methods[r.Method]
	if !ok && r.Method == http.MethodHead {
		serve, ok = methods[http.MethodGet]
	}
	if !ok {
		var allow []string
		for m := range methods {
			allow = append(allow, m)
		}
		if _, ok := methods[http.MethodGet]; ok {
			if _, ok := methods[http.MethodHead]; !ok {
				allow = append(allow, http.MethodHead) // served wherever GET is
			}
		}
		sort.Strings(allow)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		WriteError(w, r, http.StatusMethodNotAllowed, "method_not_allowed",
			fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", ")))
		return
	}
	serve(w, r)
}

// prefixRoute serves the routes with an id in the path.
func (h *Handler) prefixRoute(path string) (map[string]http.HandlerFunc, bool) {
	switch {
	case strings.HasPrefix(path, "/v1/models/") && len(path) > len("/v1/models/"):
		return map[string]http.HandlerFunc{http.MethodGet: h.getModel}, true
	case strings.HasPrefix(path, "/v1/responses/"):
		id, sub, _ := strings.Cut(strings.TrimPrefix(path, "/v1/responses/"), "/")
		if id == "" {
			return nil, false
		}
		f := func(w http.ResponseWriter, r *http.Request) { h.responseFollowUp(w, r, id) }
		switch sub {
		case "":
			return map[string]http.HandlerFunc{http.MethodGet: f, http.MethodDelete: f}, true
		case "cancel":
			return map[string]http.HandlerFunc{http.MethodPost: f}, true
		case "input_items":
			return map[string]http.HandlerFunc{http.MethodGet: f}, true
		}
	case strings.HasPrefix(path, "/api/blobs/") && len(path) > len("/api/blobs/") && !strings.Contains(path[len("/api/blobs/"):], "/"):
		f := func(w http.ResponseWriter, r *http.Request) {
			h.proxy(w, r, target{family: domain.ProviderOllama, orOnlyNode: true, unbounded: true}, "", "")
		}
		return map[string]http.HandlerFunc{http.MethodHead: f, http.MethodPost: f}, true
	}
	return nil, false
}

// proxy reads the model from the request body as t says and passes the
// request through to a provider of t's family that serves it; node and
// provider, when set, pin where it goes.
func (h *Handler) proxy(w http.ResponseWriter, r *http.Request, t target, node, provider string) {
	var (
		model string
		head  []byte
		rest  io.Reader
		rec   *recordingReader
	)
	switch {
	case t.keys != nil || t.form:
		if ce := contentEncoding(r); ce != "" {
			// The model is read from the body's bytes: a compressed body
			// would fail that scan with a misleading "not a JSON object".
			WriteError(w, r, http.StatusUnsupportedMediaType, "unsupported_content_encoding",
				fmt.Sprintf("request bodies with Content-Encoding %q are not supported here: send the body uncompressed", ce))
			return
		}
		if r.ContentLength > h.MaxBody {
			h.tooLarge(w, r)
			return
		}
		var body io.Reader = http.MaxBytesReader(w, r.Body, h.MaxBody)
		if t.form {
			body = newFormGuard(body, r.Header.Get("Content-Type"))
		} else {
			body = newKeyGuard(body, t.keys, t.follows)
		}
		rec = newRecordingReader(body)
		p := newPrefix(rec, r.ContentLength)
		var (
			err     error
			follows string
		)
		if t.form {
			model, err = scanMultipartModel(p, r.Header.Get("Content-Type"), "model")
		} else {
			model, follows, err = scanJSONModel(p, t.keys, t.follows)
		}
		if err == nil && r.ContentLength >= 0 && r.ContentLength <= smallBody {
			for p.more() != nil { // small: send it whole in the opening frame
			}
			if !errors.Is(p.err, io.EOF) {
				err = p.err
			}
		}
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				h.tooLarge(w, r)
				return
			}
			WriteError(w, r, http.StatusBadRequest, domain.CodeInvalidRequest, err.Error())
			return
		}
		// An id neither this edge nor its history saw created is routed by
		// model alone, and so is one of the caller's whose node is not
		// connected here (another edge's, sharing the history). Another
		// key's response is not continued, whichever nodes the caller may
		// see: the provider would replay its conversation to this caller
		// (the answer names no node). A history that cannot tell whose it
		// is refuses all but an admin key.
		pinned := false
		offline := "" // the node, not connected here, of the caller's response it continues
		if follows != "" {
			p := domain.PrincipalFrom(r.Context())
			at, ok, err := h.responseOf(r.Context(), follows)
			if err != nil && !p.Allows(domain.ScopeAdmin) {
				WriteError(w, r, statusFor(err), domain.CodeOf(err), domain.MessageOf(err))
				return
			}
			switch {
			case !ok:
			case !at.ownedBy(p):
				WriteError(w, r, http.StatusNotFound, "previous_response_not_found", fmt.Sprintf("previous response %q was not created through this edge", follows))
				return
			case p.SeesNode(at.node) && h.deps.Tunnels.Connected(at.node):
				node, provider, pinned = at.node, at.provider, true
			case p.SeesNode(at.node):
				offline = at.node
			}
		}
		if model == "" && !(t.modelOptional && pinned) {
			what := ""
			if len(t.keys) > 0 {
				what = fmt.Sprintf("%q is required", t.keys[0])
				switch {
				case t.modelOptional && offline != "":
					// Known, but its node is away: routed by model alone.
					what += fmt.Sprintf(": previous response %q was created on node %q, which is not connected", follows, offline)
				case t.modelOptional:
					what += fmt.Sprintf(" (or a %s of a response created through this edge)", t.follows)
				}
			}
			if t.form {
				what = `the form field "model" is required`
			}
			WriteError(w, r, http.StatusBadRequest, domain.CodeInvalidRequest, what)
			return
		}
		head, rest = p.body()
	case r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0:
		// Unbounded (blobs) or not, the body goes through a recorder: a
		// body that fails while it streams is the caller's 400, not the
		// tunnel failure it causes (the recorder holds nothing of it).
		var body io.Reader = r.Body
		if !t.unbounded {
			body = http.MaxBytesReader(w, r.Body, h.MaxBody)
		}
		rec = newRecordingReader(body)
		rest = rec
	}
	if rest != nil && rest != io.Reader(rec) {
		// What the tunnel reads reads rec: closing the tunnel closes rec.
		rest = struct {
			io.Reader
			io.Closer
		}{rest, rec}
	}
	h.pass(w, r, t, edge.SubmitProviderTunnel{
		Node: node, Provider: provider, Model: model, ProviderType: t.family, OrOnlyNode: t.orOnlyNode,
		Body: head, BodyReader: rest,
	}, rec)
}

// contentEncoding is the request's Content-Encoding other than identity
// ("" when the body is not encoded).
func contentEncoding(r *http.Request) string {
	ce := strings.TrimSpace(strings.Join(r.Header.Values("Content-Encoding"), ","))
	if ce == "" || strings.EqualFold(ce, "identity") {
		return ""
	}
	return ce
}

func (h *Handler) tooLarge(w http.ResponseWriter, r *http.Request) {
	WriteError(w, r, http.StatusRequestEntityTooLarge, "request_too_large",
		fmt.Sprintf("request body is larger than %d bytes", h.MaxBody))
}

// pass opens a tunnel for in (completed from r) and relays the provider's
// response. rec, when set, tells a body over the limit apart from other
// failures.
func (h *Handler) pass(w http.ResponseWriter, r *http.Request, t target, in edge.SubmitProviderTunnel, rec *recordingReader) {
	rc := http.NewResponseController(w)
	aborted := false
	if in.BodyReader != nil {
		// The body keeps streaming to the node while the response may
		// already start (a provider can answer early): without full duplex
		// the server would consume the unread body when headers go out.
		_ = rc.EnableFullDuplex()
		// With full duplex on, a body left unread as the handler returns
		// (a refusal before the tunnel opened, a provider's early answer)
		// made net/http panic reading the connection's next request
		// ("invalid concurrent Body.Read call", golang/go#68560). It is
		// closed here, last (after the tunnel's Close has stopped its
		// uploader), once the answer is flushed, as net/http does for any
		// unread body: closing drains what is left of it (up to 256 KiB,
		// within the body's deadlines), which a caller still streaming
		// its body must not wait for to get the answer. A stream aborted
		// mid-response (aborted) ends its connection anyway.
		defer func() {
			if !aborted {
				_ = rc.Flush()
				_ = r.Body.Close()
			}
		}()
	}
	if rec != nil {
		// The tunnel's uploader reads the body on a goroutine of its own.
		// When the tunnel ends (here, on this goroutine: in Next or Close)
		// while that goroutine still waits for the caller's next bytes, the
		// wait is cut off with a read deadline: nothing may read the body
		// once this handler returns.
		rec.cut = func() { _ = rc.SetReadDeadline(time.Now()) }
	}
	if in.Node == "" {
		in.Node = r.Header.Get(NodeHeader)
	}
	// Routing read the decoded path; the provider gets the caller's escaped
	// one, so an escaped "?", "#", "/" or "%" stays part of its segment.
	in.Method, in.Path, in.Query, in.Header = r.Method, r.URL.EscapedPath(), r.URL.RawQuery, domain.Header(forwardHeader(r))
	tun, err := h.deps.Tunnels.Handle(r.Context(), in)
	if err != nil && in.Model != "" && (domain.CodeOf(err) == domain.CodeModelNotFound || errors.Is(err, edge.ErrNoNodeHasModel)) {
		// The catalog may be stale (a model just pulled or copied on the
		// provider): look again, once, before saying not found — or, for
		// a pull or create, before asking which of several nodes takes a
		// model one of them may have already.
		h.refreshCatalog(r)
		tun, err = h.deps.Tunnels.Handle(r.Context(), in)
	}
	if err != nil {
		h.fail(w, r, err, rec, in.Model)
		return
	}
	defer tun.Close() // after a normal end a no-op; otherwise the node aborts upstream
	var sniff *idSniffer
	created := "" // the id of the response this tunnel creates, once sniffed
	switch {
	case t.followUp != "":
		tun.CountUsage = func(*domain.Usage) bool { return h.responses.countUsage(t.followUp) }
		tun.UsageOf = t.followUp // the history keeps that it counted it, if it does
	case t.remember:
		tun.CountUsage = func(*domain.Usage) bool {
			if created != "" {
				h.responses.countUsage(created) // counted here: retrievals count nothing
			}
			return true
		}
	}
	// An Anthropic stream states its prompt's tokens in its first event,
	// message_start; the node reports usage only once the stream has ended
	// well. The first bytes are read here too, so a stream the caller
	// leaves (or whose link breaks) still records the prompt it cost.
	var early *earlyUsage
	if t.family == domain.ProviderAnthropic {
		early = &earlyUsage{}
		tun.ReadUsage = early.usage
	}
	status, started := 0, false
	wd := deadline.Quarter(h.WriteIdleTimeout)
	// unflushed: written to the caller's buffer but not sent. The flush
	// waits until no frame is ready, so frames that arrive together (status,
	// headers and the first chunk; a burst of chunks) leave in one write.
	unflushed := false
	start := func(hdr http.Header) {
		copyResponseHeader(w.Header(), hdr)
		// The node that served it, as a run's answer names its node: the
		// caller can pin its follow-ups there, and the access log names it.
		w.Header().Set(NodeHeader, tun.Node)
		if _, ok := w.Header()["Content-Type"]; !ok {
			// Headers arrive as the provider sent them: without one of its
			// own, net/http would guess a Content-Type from the body.
			w.Header()["Content-Type"] = nil
		}
		if status < 200 || status > 999 {
			// Not a final status (a node relays none: a 1xx here would
			// tell a proxy in front that the connection switched
			// protocols while the edge reads HTTP on).
			status = http.StatusBadGateway
		}
		if t.remember && status >= 200 && status < 300 {
			sniff = &idSniffer{}
		}
		if early != nil {
			early.start(status, w.Header().Get("Content-Type"))
		}
		armWrite(&wd, rc)
		w.WriteHeader(status)
		started, unflushed = true, true
	}
	for {
		f, err := tun.Next(ports.ReadyOnly)
		if err != nil && errors.Is(err, context.Canceled) && r.Context().Err() == nil {
			// Nothing ready: send what is buffered, then wait.
			if unflushed {
				unflushed = false
				if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
					return
				}
			}
			f, err = tun.Next(r.Context())
		}
		if err != nil {
			if !started && rec != nil {
				bodyErr := rec.failure()
				if bodyErr == nil && r.Context().Err() != nil {
					// net/http cancels the request's context from inside
					// a body read that fails on the connection (the body
					// clock's deadline), before that read returns its
					// error to rec: let it return before deciding that the
					// caller left.
					bodyErr = rec.settledFailure(bodySettle)
				}
				if bodyErr != nil || rec.wasCut() {
					// Reading the caller's body failed (too slow, malformed
					// chunks, too large): that, not the tunnel it broke, is
					// the answer — even though net/http may have cancelled
					// the request's context over it. Or the tunnel failed
					// and ending it cut the body's read off, which cancels
					// the context too: the tunnel's error is the answer.
					h.fail(w, r, err, rec, in.Model)
					return
				}
			}
			if r.Context().Err() != nil && (rec == nil || !rec.wasCut()) {
				// The caller left (a context this handler's own cut of the
				// body read cancelled is no such thing: the tunnel broke).
				// Clients often hang up as soon as the body is complete,
				// while its usage and end frames are still on the way:
				// read them for a moment so the usage is recorded; then
				// Close aborts whatever is left upstream.
				drainEnd(tun, sidebandGrace)
				return
			}
			if !started {
				h.fail(w, r, err, rec, in.Model)
				return
			}
			h.log.Warn("provider stream broke mid-response", "tunnel", tun.ID, "node", tun.Node, "provider", tun.Provider, "err", err)
			tun.Close()
			if unflushed {
				_ = rc.Flush() // every byte relayed before the break reaches the caller
			}
			aborted = true
			panic(http.ErrAbortHandler) // the caller must see a broken stream, not an end
		}
		switch f.Kind {
		case domain.TunnelStatus:
			status = f.Status
		case domain.TunnelHeader:
			if !started {
				start(http.Header(f.Header))
			}
		case domain.TunnelBody:
			if !started {
				start(nil)
			}
			if sniff != nil {
				if id, done := sniff.feed(f.Body); done {
					if id != "" && h.responses.put(id, responseAt{node: tun.Node, provider: tun.Provider, key: domain.PrincipalFrom(r.Context()).Name}) {
						created = id
						tun.Response = id // the history keeps whose it is
					}
					sniff = nil
				}
			}
			if early != nil {
				early.feed(f.Body)
			}
			armWrite(&wd, rc)
			if _, err := w.Write(f.Body); err != nil {
				return // the caller is gone
			}
			unflushed = true
		case domain.TunnelEnd:
			if !started {
				start(nil)
			}
			return
		}
		// Usage and metadata are sideband: never part of the body.
	}
}

// earlyUsageBytes bounds how much of a stream's start earlyUsage reads:
// message_start is an Anthropic stream's first event.
const earlyUsageBytes = 64 << 10

// earlyUsage reads the usage a successful event stream states in its
// first earlyUsageBytes (see pass).
type earlyUsage struct {
	scan *provider.UsageScanner // nil: not reading
	read int
}

// start begins reading a response of status and content type ct, if it
// is a successful event stream.
func (e *earlyUsage) start(status int, ct string) {
	if status >= 200 && status < 300 && strings.Contains(strings.ToLower(ct), "text/event-stream") {
		e.scan = provider.NewUsageScanner(ct)
	}
}

func (e *earlyUsage) feed(b []byte) {
	if e.scan == nil || e.read >= earlyUsageBytes {
		return
	}
	b = b[:min(len(b), earlyUsageBytes-e.read)]
	e.read += len(b)
	e.scan.Write(b)
}

// usage is what was read; nil if nothing.
func (e *earlyUsage) usage() *domain.Usage {
	if e.scan == nil {
		return nil
	}
	return e.scan.Usage()
}

// sidebandGrace bounds how long a tunnel whose caller left is still read
// for its end (and the usage before it).
const sidebandGrace = 250 * time.Millisecond

// drainEnd reads tun, discarding frames, until its end or for at most d.
func drainEnd(tun *edge.Tunnel, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		f, err := tun.Next(ctx)
		if err != nil || f.Kind == domain.TunnelEnd {
			return
		}
	}
}

// armWrite keeps the relay's write deadline WriteIdleTimeout ahead of its
// progress, moved once per quarter of it (deadline.Lazy): the deadline only
// has to catch a caller that stopped reading.
func armWrite(d *deadline.Lazy, rc *http.ResponseController) {
	if t, due := d.Next(time.Now()); due {
		_ = rc.SetWriteDeadline(t)
	}
}

// fail writes err before any response byte went out; model is the one the
// caller asked for.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error, rec *recordingReader, model string) {
	if rec != nil {
		var tooBig *http.MaxBytesError
		switch bodyErr := rec.failure(); {
		case errors.As(bodyErr, &tooBig):
			h.tooLarge(w, r)
			return
		case bodyErr != nil:
			// The caller's own body broke the request: a 400 that says how,
			// not the tunnel's error (an internal "stream closed").
			WriteError(w, r, http.StatusBadRequest, domain.CodeInvalidRequest, "request body: "+bodyErr.Error())
			return
		}
	}
	status := statusFor(err)
	if status >= 500 {
		h.log.Warn("provider request failed", "path", r.URL.Path, "err", err)
	}
	code, msg := domain.CodeOf(err), domain.MessageOf(err)
	if code == domain.CodeModelNotFound && model != "" && dialectOf(r) == domain.ProviderOllama {
		msg = fmt.Sprintf("model '%s' not found", model) // the text Ollama's CLI matches
	}
	WriteError(w, r, status, code, msg)
}

// statusFor maps a domain error to the HTTP status this surface answers
// with. It is the only such mapping here.
func statusFor(err error) int {
	if errors.Is(err, context.DeadlineExceeded) {
		return http.StatusGatewayTimeout
	}
	switch domain.CodeOf(err) {
	case domain.CodeInvalidRequest:
		return http.StatusBadRequest
	case domain.CodeModelNotFound, domain.CodeNodeNotFound, domain.CodeProviderNotFound:
		return http.StatusNotFound
	case domain.CodeAtCapacity:
		return http.StatusTooManyRequests
	case domain.CodeForbidden:
		return http.StatusForbidden
	case domain.CodeNoNodeAvailable, domain.CodeShuttingDown, domain.CodeHistoryUnavailable:
		return http.StatusServiceUnavailable
	case domain.CodeProviderUnreachable, domain.CodeProviderError, domain.CodeNodeDisconnected, domain.CodeStreamReset:
		return http.StatusBadGateway
	case domain.CodeTimeout:
		return http.StatusGatewayTimeout
	case domain.CodeCancelled:
		return 499 // the caller left; nobody reads this
	}
	return http.StatusInternalServerError
}

// forwardHeader is what of the caller's request header goes to the node:
// everything but hop-by-hop headers, the caller's credentials for the edge
// (Authorization, X-Api-Key, Api-Key, Cookie), X-IOP-* routing headers and what the node's
// HTTP client sets itself; Content-Length is restated from the request.
func forwardHeader(r *http.Request) http.Header {
	listed := hopheader.Listed(r.Header)
	out := make(http.Header, len(r.Header)+1)
	for k, vs := range r.Header {
		ck := http.CanonicalHeaderKey(k) // the server's parser made it canonical: no allocation
		if hopheader.Hop(ck, listed) || hopheader.CallerOnly(ck) {
			continue
		}
		out[ck] = append(out[ck], vs...)
	}
	if r.ContentLength > 0 {
		out["Content-Length"] = []string{strconv.FormatInt(r.ContentLength, 10)}
	}
	return out
}

// copyResponseHeader copies the provider's header to dst without hop-by-hop
// headers, the edge's own (X-IOP-*), CORS headers and those that set state
// for the whole origin (originWide). Content-Length stays: the body is
// relayed byte for byte, and a relay that ends short is aborted, so the
// length is never a lie.
//
// A provider's CORS policy is not the edge's: many allow every origin
// (vLLM, LiteLLM and OpenAI send "Access-Control-Allow-Origin: *",
// llama.cpp's server echoes the Origin), and relayed it would let any page
// open in the operator's browser read a keyless edge's passthrough GETs (a
// stored response on /v1/responses/{id}). The edge refuses cross-origin
// writes (browserGuard), and so allows no cross-origin reads either.
func copyResponseHeader(dst, src http.Header) {
	listed := hopheader.Listed(src)
	canonical := true
	for k := range src {
		if http.CanonicalHeaderKey(k) != k {
			canonical = false
			break
		}
	}
	if canonical { // the usual case: no two keys meet, so order is moot
		for k, vs := range src {
			if !hopheader.Hop(k, listed) && !hopheader.IOP(k) && !isCORS(k) && !originWide(k) {
				dst[k] = append(dst[k], vs...)
			}
		}
		return
	}
	// Keys that canonicalize alike are merged in a stable order.
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ck := http.CanonicalHeaderKey(k)
		if hopheader.Hop(ck, listed) || hopheader.IOP(ck) || isCORS(ck) || originWide(ck) {
			continue
		}
		dst[ck] = append(dst[ck], src[k]...)
	}
}

// isCORS reports whether the canonical header name ck is one of a CORS
// answer's (Access-Control-Allow-Origin, -Allow-Credentials, …).
func isCORS(ck string) bool { return strings.HasPrefix(ck, "Access-Control-") }

// originWide reports whether the canonical header name ck sets state a
// browser keeps for the whole origin that answered rather than for this
// response. The browser takes the edge for that origin, so the provider's
// would apply to the edge's name (and the web console on it):
//   - Set-Cookie (and the obsolete Set-Cookie2): a provider's cookie
//     (Cloudflare's __cf_bm from api.openai.com) would be stored for the
//     edge's host and sent back with every request to it, console
//     included; the edge never forwards a caller's Cookie, so the
//     provider could not get it back anyway;
//   - Strict-Transport-Security: OpenAI's carries includeSubDomains, which
//     would pin HTTPS on the edge's name and every name under it;
//   - Alt-Svc: advertises another protocol and port as the edge's origin;
//   - Clear-Site-Data: would clear the console's storage and cookies;
//   - NEL, Report-To, Reporting-Endpoints: would have the browser send
//     reports about the edge's origin (network errors, policy violations)
//     to the provider's collector.
func originWide(ck string) bool {
	switch ck {
	case "Set-Cookie", "Set-Cookie2", "Strict-Transport-Security", "Alt-Svc", "Clear-Site-Data",
		"Nel", "Report-To", "Reporting-Endpoints":
		return true
	}
	return false
}

// recordingReader remembers the first read error other than io.EOF, so a
// body that broke the size limit while streaming to the node is reported as
// 413 rather than as a tunnel failure. Reads happen on the transport's
// uploader goroutine, hence the lock.
//
// Close stops it: a Read in progress is cut off (cut) and waited for, and
// later Reads fail at once, so the handler can end the tunnel that reads
// it and return with nothing left reading its request's body.
type recordingReader struct {
	r io.Reader
	// reading holds a token while a Read is in progress (reads are never
	// concurrent: the handler's, then the uploader's), so settledFailure
	// and Close can wait for one to return.
	reading chan struct{}
	// cut, when set, makes a Read in progress return soon (a read
	// deadline in the past on the connection). Set before any Read on
	// another goroutine.
	cut     func()
	mu      sync.Mutex
	err     error
	stopped bool // Close was called: reads fail, their errors are not the body's
	didCut  bool // Close cut a read in progress off
}

// errBodyStopped is a Read's error once the handler stopped the body.
var errBodyStopped = errors.New("the request body is no longer read: the tunnel ended")

// bodySettle bounds settledFailure's wait: the read it waits for has
// already failed on the connection and returns at once.
const bodySettle = 500 * time.Millisecond

func newRecordingReader(r io.Reader) *recordingReader {
	return &recordingReader{r: r, reading: make(chan struct{}, 1)}
}

func (rr *recordingReader) Read(p []byte) (int, error) {
	rr.reading <- struct{}{}
	defer func() { <-rr.reading }()
	rr.mu.Lock()
	stopped := rr.stopped
	rr.mu.Unlock()
	if stopped {
		return 0, errBodyStopped
	}
	n, err := rr.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		rr.mu.Lock()
		if rr.err == nil && !rr.stopped { // not the cut's own error
			rr.err = err
		}
		rr.mu.Unlock()
	}
	return n, err
}

// Close stops the body and returns once no Read is in progress; it is
// idempotent. It runs on the handler's goroutine (the tunnel's Next or
// Close), while the handler still owns the request.
func (rr *recordingReader) Close() error {
	rr.mu.Lock()
	if rr.stopped {
		rr.mu.Unlock()
		return nil
	}
	rr.stopped = true
	rr.mu.Unlock()
	select {
	case rr.reading <- struct{}{}: // none in progress, and none will read
	default:
		if rr.cut != nil {
			rr.mu.Lock()
			rr.didCut = true
			rr.mu.Unlock()
			rr.cut()
		}
		// A cut that did not take (no cut, or a connection without read
		// deadlines) must not hold the handler for ever: past
		// bodyCutWait the read is left to end with the request.
		select {
		case rr.reading <- struct{}{}:
		case <-time.After(bodyCutWait):
			return nil
		}
	}
	<-rr.reading
	return nil
}

// bodyCutWait bounds Close's wait for a read it cut off, which returns at
// once when the cut took.
const bodyCutWait = time.Second

// wasCut tells whether Close cut a read in progress off (which cancels
// the request's context: net/http does on any failed read).
func (rr *recordingReader) wasCut() bool {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.didCut
}

func (rr *recordingReader) failure() error {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.err
}

// settledFailure is failure once the Read in progress, if any, has
// returned; it waits at most d for it.
func (rr *recordingReader) settledFailure(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case rr.reading <- struct{}{}:
		<-rr.reading
	case <-t.C:
	}
	return rr.failure()
}
