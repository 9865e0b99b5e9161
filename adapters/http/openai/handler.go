// Package openaiapi serves the edge's OpenAI-compatible and Ollama-native
// HTTP surface by passing requests through provider tunnels to the nodes
// whose providers serve the requested model.
//
// Routes (mount the Handler at the server root, without StripPrefix: the
// request path is forwarded to the provider unchanged):
//
//	POST /v1/chat/completions, /v1/completions, /v1/embeddings  → a provider speaking the OpenAI API
//	GET  /v1/models, /v1/models/{model}                         → merged from the model catalog
//	POST /api/chat, /api/generate, /api/embed, /api/embeddings, /api/show → an ollama provider
//	GET  /api/tags                                              → merged from the catalog (or passed through when pinned)
//	GET  /api/version                                           → passed through to an ollama provider
//
// The optional request header X-IOP-Node pins the node. The model is read
// from the JSON body ("model"; Ollama's legacy "name" too); the body itself
// is forwarded byte for byte.
//
// Passthrough is faithful: the provider's status code, headers (minus
// hop-by-hop ones) and body bytes reach the caller unchanged, upstream
// 4xx/5xx included, and every body frame is flushed as it arrives. Usage and
// metadata frames are sideband and never written. If the tunnel fails after
// the response has started (node lost, provider reset), the handler aborts
// the response with http.ErrAbortHandler, so the caller sees a broken
// stream — never a clean end or a synthesized "[DONE]". Middleware must let
// that panic through. When the caller goes away, the tunnel is closed and
// the node aborts the upstream request.
//
// Errors raised before the response starts use the caller's API family:
// {"error":{"message","type","param","code"}} on /v1 routes and Ollama's
// {"error":"message"} on /api routes, with the status chosen by statusFor.
//
// Request bodies: up to MaxBody bytes (default 64 MiB; more is 413). A body
// that declares a Content-Length of at most 1 MiB is read whole. A larger or
// chunked body is read only as far as the "model" field (at worst the whole
// body, when the field comes last) and the rest is streamed to the node as
// the caller sends it.
package openaiapi

import (
	"bytes"
	"context"
	"encoding/json"
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

	"iop/application/edge"
	"iop/domain"
)

// Defaults of the Handler's tunables.
const (
	DefaultMaxBody          = 64 << 20
	DefaultWriteIdleTimeout = 5 * time.Minute
	// smallBody is the largest declared body read whole before routing.
	smallBody = 1 << 20
)

// NodeHeader pins a request to one node.
const NodeHeader = "X-IOP-Node"

// Deps are the use cases the surface needs; both are required.
type Deps struct {
	Tunnels *edge.SubmitProviderTunnelHandler
	Models  *edge.ModelCatalog
}

// Handler is the OpenAI-compatible and Ollama-native surface.
type Handler struct {
	deps   Deps
	log    *slog.Logger
	routes map[string]route

	// MaxBody bounds request bodies (DefaultMaxBody). Set before serving.
	MaxBody int64
	// WriteIdleTimeout bounds each write to the caller (DefaultWriteIdleTimeout),
	// so a caller that stops reading cannot hold a tunnel forever; it also
	// lifts any server-wide WriteTimeout for long streams. Set before serving.
	WriteIdleTimeout time.Duration
}

type route struct {
	method string
	serve  func(w http.ResponseWriter, r *http.Request)
}

// New builds the handler; it refuses missing dependencies.
func New(deps Deps, log *slog.Logger) *Handler {
	if deps.Tunnels == nil || deps.Models == nil {
		panic("openaiapi.New: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{deps: deps, log: log, MaxBody: DefaultMaxBody, WriteIdleTimeout: DefaultWriteIdleTimeout}
	openai := func(w http.ResponseWriter, r *http.Request) { h.proxyJSON(w, r, domain.ProviderOpenAI) }
	ollama := func(w http.ResponseWriter, r *http.Request) { h.proxyJSON(w, r, domain.ProviderOllama) }
	h.routes = map[string]route{
		"/v1/chat/completions": {http.MethodPost, openai},
		"/v1/completions":      {http.MethodPost, openai},
		"/v1/embeddings":       {http.MethodPost, openai},
		"/v1/models":           {http.MethodGet, h.listModels},
		"/api/chat":            {http.MethodPost, ollama},
		"/api/generate":        {http.MethodPost, ollama},
		"/api/embed":           {http.MethodPost, ollama},
		"/api/embeddings":      {http.MethodPost, ollama},
		"/api/show":            {http.MethodPost, ollama},
		"/api/tags":            {http.MethodGet, h.tags},
		"/api/version":         {http.MethodGet, h.version},
	}
	return h
}

// ServeHTTP dispatches by exact path; unknown paths are 404 and wrong
// methods 405, in the family's error shape.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	family := familyOf(r.URL.Path)
	rt, ok := h.routes[r.URL.Path]
	if !ok && strings.HasPrefix(r.URL.Path, "/v1/models/") {
		rt, ok = route{http.MethodGet, h.getModel}, true
	}
	if !ok {
		writeError(w, family, http.StatusNotFound, "invalid_request_error", "not_found", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
		return
	}
	if r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead) {
		w.Header().Set("Allow", rt.method)
		writeError(w, family, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
			fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, rt.method))
		return
	}
	rt.serve(w, r)
}

func familyOf(path string) string {
	if strings.HasPrefix(path, "/api/") {
		return domain.ProviderOllama
	}
	return domain.ProviderOpenAI
}

// proxyJSON reads the model from a JSON request body and passes the request
// through to a provider of family that serves it.
func (h *Handler) proxyJSON(w http.ResponseWriter, r *http.Request, family string) {
	rec := &recordingReader{r: http.MaxBytesReader(w, r.Body, h.MaxBody)}
	model, head, rest, err := readModel(rec, r.ContentLength)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, family, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
				fmt.Sprintf("request body is larger than %d bytes", h.MaxBody))
			return
		}
		writeError(w, family, http.StatusBadRequest, "invalid_request_error", domain.CodeInvalidRequest, "request body is not a JSON object: "+err.Error())
		return
	}
	if model == "" {
		writeError(w, family, http.StatusBadRequest, "invalid_request_error", domain.CodeInvalidRequest, `"model" is required`)
		return
	}
	h.pass(w, r, family, model, head, rest, rec)
}

// listModels answers GET /v1/models in OpenAI's list shape: one entry per
// model and node (owned_by is the node id).
func (h *Handler) listModels(w http.ResponseWriter, r *http.Request) {
	entries, err := h.models(r)
	if err != nil {
		h.fail(w, domain.ProviderOpenAI, err, nil)
		return
	}
	out := modelList{Object: "list", Data: []modelObject{}}
	seen := map[[2]string]bool{}
	for _, e := range entries {
		k := [2]string{e.ID, e.Node}
		if !seen[k] {
			seen[k] = true
			out.Data = append(out.Data, modelObject{ID: e.ID, Object: "model", Created: e.Created, OwnedBy: e.Node})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// getModel answers GET /v1/models/{model} with the first node serving it.
func (h *Handler) getModel(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	entries, err := h.models(r)
	if err != nil {
		h.fail(w, domain.ProviderOpenAI, err, nil)
		return
	}
	for _, exact := range []bool{true, false} {
		for _, e := range entries {
			if e.ID == id || (!exact && edge.MatchModel(e.ID, id)) {
				writeJSON(w, http.StatusOK, modelObject{ID: e.ID, Object: "model", Created: e.Created, OwnedBy: e.Node})
				return
			}
		}
	}
	h.fail(w, domain.ProviderOpenAI, domain.Errorf(domain.CodeModelNotFound, "the model %q does not exist", id), nil)
}

// models returns the catalog, limited to the pinned node if there is one
// and to the nodes the caller's key may see.
func (h *Handler) models(r *http.Request) ([]edge.ModelEntry, error) {
	caller := domain.PrincipalFrom(r.Context())
	if node := r.Header.Get(NodeHeader); node != "" {
		if !caller.SeesNode(node) {
			return nil, domain.Errorf(domain.CodeNodeNotFound, "node %q is not connected", node)
		}
		return h.deps.Models.NodeModels(node)
	}
	return visibleModels(caller, h.deps.Models.Models()), nil
}

// visibleModels drops the models of nodes caller may not see.
func visibleModels(caller domain.Principal, all []edge.ModelEntry) []edge.ModelEntry {
	if !caller.Limited() {
		return all
	}
	out := make([]edge.ModelEntry, 0, len(all))
	for _, e := range all {
		if caller.SeesNode(e.Node) {
			out = append(out, e)
		}
	}
	return out
}

// tags answers GET /api/tags: pinned to a node, the node's own answer;
// otherwise the ollama providers' models of every node merged in Ollama's
// shape, one entry per model name.
func (h *Handler) tags(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(NodeHeader) != "" {
		h.pass(w, r, domain.ProviderOllama, "", nil, nil, nil)
		return
	}
	out := struct {
		Models []json.RawMessage `json:"models"`
	}{Models: []json.RawMessage{}}
	seen := map[string]bool{}
	for _, e := range visibleModels(domain.PrincipalFrom(r.Context()), h.deps.Models.Models()) {
		if e.Type != domain.ProviderOllama || seen[e.ID] {
			continue
		}
		seen[e.ID] = true
		raw := json.RawMessage(e.Raw)
		if len(raw) == 0 {
			raw, _ = json.Marshal(ollamaTag{Name: e.ID, Model: e.ID, ModifiedAt: time.Unix(e.Created, 0).UTC().Format(time.RFC3339), Details: struct{}{}})
		}
		out.Models = append(out.Models, raw)
	}
	writeJSON(w, http.StatusOK, out)
}

// version passes GET /api/version through to an ollama provider.
func (h *Handler) version(w http.ResponseWriter, r *http.Request) {
	h.pass(w, r, domain.ProviderOllama, "", nil, nil, nil)
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

type modelList struct {
	Object string        `json:"object"`
	Data   []modelObject `json:"data"`
}

type ollamaTag struct {
	Name       string   `json:"name"`
	Model      string   `json:"model"`
	ModifiedAt string   `json:"modified_at"`
	Size       int64    `json:"size"`
	Digest     string   `json:"digest"`
	Details    struct{} `json:"details"`
}

// pass opens a tunnel for r and relays the provider's response. head and
// rest are the request body (rest streamed after head); rec, when set,
// tells a body over the limit apart from other failures.
func (h *Handler) pass(w http.ResponseWriter, r *http.Request, family, model string, head []byte, rest io.Reader, rec *recordingReader) {
	rc := http.NewResponseController(w)
	if rest != nil {
		// The body keeps streaming to the node while the response may
		// already start (a provider can answer early): without full duplex
		// the server would consume the unread body when headers go out.
		_ = rc.EnableFullDuplex()
	}
	in := edge.SubmitProviderTunnel{
		Node: r.Header.Get(NodeHeader), Model: model, ProviderType: family,
		Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: forwardHeader(r),
		Body: head, BodyReader: rest,
	}
	tun, err := h.deps.Tunnels.Handle(r.Context(), in)
	if err != nil {
		h.fail(w, family, err, rec)
		return
	}
	defer tun.Close() // after a normal end a no-op; otherwise the node aborts upstream
	status, started := 0, false
	start := func(hdr http.Header) {
		copyResponseHeader(w.Header(), hdr)
		if status < 100 || status > 999 {
			status = http.StatusBadGateway
		}
		h.writeDeadline(rc)
		w.WriteHeader(status)
		_ = rc.Flush()
		started = true
	}
	for {
		f, err := tun.Next(r.Context())
		if err != nil {
			if r.Context().Err() != nil {
				return // the caller left; Close aborts the upstream request
			}
			if !started {
				h.fail(w, family, err, rec)
				return
			}
			h.log.Warn("provider stream broke mid-response", "tunnel", tun.ID, "node", tun.Node, "provider", tun.Provider, "err", err)
			tun.Close()
			panic(http.ErrAbortHandler) // the caller must see a broken stream, not an end
		}
		switch f.Kind {
		case domain.TunnelStatus:
			status = f.Status
		case domain.TunnelHeader:
			if !started {
				start(f.Header)
			}
		case domain.TunnelBody:
			if !started {
				start(nil)
			}
			h.writeDeadline(rc)
			if _, err := w.Write(f.Body); err != nil {
				return // the caller is gone
			}
			if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
				return
			}
		case domain.TunnelEnd:
			if !started {
				start(nil)
			}
			return
		}
		// Usage and metadata are sideband: never part of the body.
	}
}

func (h *Handler) writeDeadline(rc *http.ResponseController) {
	if h.WriteIdleTimeout > 0 {
		_ = rc.SetWriteDeadline(time.Now().Add(h.WriteIdleTimeout))
	}
}

// fail writes err before any response byte went out.
func (h *Handler) fail(w http.ResponseWriter, family string, err error, rec *recordingReader) {
	var tooBig *http.MaxBytesError
	if rec != nil && errors.As(rec.failure(), &tooBig) {
		writeError(w, family, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
			fmt.Sprintf("request body is larger than %d bytes", h.MaxBody))
		return
	}
	status, typ := statusFor(err)
	if status >= 500 {
		h.log.Warn("provider request failed", "family", family, "err", err)
	}
	writeError(w, family, status, typ, domain.CodeOf(err), domain.MessageOf(err))
}

// statusFor maps a domain error to the HTTP status and OpenAI error type
// this surface answers with. It is the only such mapping here.
func statusFor(err error) (int, string) {
	if errors.Is(err, context.DeadlineExceeded) {
		return http.StatusGatewayTimeout, "server_error"
	}
	switch domain.CodeOf(err) {
	case domain.CodeInvalidRequest:
		return http.StatusBadRequest, "invalid_request_error"
	case domain.CodeModelNotFound, domain.CodeNodeNotFound, domain.CodeProviderNotFound:
		return http.StatusNotFound, "invalid_request_error"
	case domain.CodeAtCapacity:
		return http.StatusTooManyRequests, "rate_limit_error"
	case domain.CodeForbidden:
		return http.StatusForbidden, "invalid_request_error"
	case domain.CodeNoNodeAvailable, domain.CodeShuttingDown:
		return http.StatusServiceUnavailable, "server_error"
	case domain.CodeProviderUnreachable, domain.CodeProviderError, domain.CodeNodeDisconnected, domain.CodeStreamReset:
		return http.StatusBadGateway, "server_error"
	case domain.CodeTimeout:
		return http.StatusGatewayTimeout, "server_error"
	case domain.CodeCancelled:
		return 499, "invalid_request_error" // the caller left; nobody reads this
	}
	return http.StatusInternalServerError, "server_error"
}

// writeError writes an error body in the family's shape.
func writeError(w http.ResponseWriter, family string, status int, typ, code, msg string) {
	if family == domain.ProviderOllama {
		writeJSON(w, status, struct {
			Error string `json:"error"`
		}{msg})
		return
	}
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	writeJSON(w, status, struct {
		Error body `json:"error"`
	}{body{Message: msg, Type: typ, Code: code}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding failed","type":"server_error","param":null,"code":"internal"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// hopByHop are connection-scoped headers (RFC 9110 §7.6.1), canonical.
var hopByHop = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

func connectionListed(h http.Header) map[string]bool {
	out := map[string]bool{}
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	return out
}

// forwardHeader is what of the caller's request header goes to the node:
// everything but hop-by-hop headers, the caller's credentials for the edge
// (Authorization, Cookie), X-IOP-* routing headers and what the node's
// HTTP client sets itself; Content-Length is restated from the request.
func forwardHeader(r *http.Request) http.Header {
	listed := connectionListed(r.Header)
	out := make(http.Header, len(r.Header))
	for k, vs := range r.Header {
		ck := http.CanonicalHeaderKey(k)
		switch {
		case hopByHop[ck], listed[ck], strings.HasPrefix(ck, "X-Iop-"):
			continue
		case ck == "Authorization", ck == "Cookie", ck == "Host", ck == "Content-Length", ck == "Accept-Encoding", ck == "Expect":
			continue
		}
		out[ck] = append([]string(nil), vs...)
	}
	if r.ContentLength > 0 {
		out.Set("Content-Length", strconv.FormatInt(r.ContentLength, 10))
	}
	return out
}

// copyResponseHeader copies the provider's header to dst without hop-by-hop
// headers or Content-Length (the body is streamed and framed by the server).
func copyResponseHeader(dst, src http.Header) {
	listed := connectionListed(src)
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ck := http.CanonicalHeaderKey(k)
		if hopByHop[ck] || listed[ck] || ck == "Content-Length" {
			continue
		}
		dst[ck] = append(dst[ck], src[k]...)
	}
}

// recordingReader remembers the first read error other than io.EOF, so a
// body that broke the size limit while streaming to the node is reported as
// 413 rather than as a tunnel failure. Reads happen on the transport's
// uploader goroutine, hence the lock.
type recordingReader struct {
	r   io.Reader
	mu  sync.Mutex
	err error
}

func (rr *recordingReader) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		rr.mu.Lock()
		if rr.err == nil {
			rr.err = err
		}
		rr.mu.Unlock()
	}
	return n, err
}

func (rr *recordingReader) failure() error {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.err
}

// readModel finds the "model" (or, failing that, Ollama's legacy "name")
// string of a JSON object body. A body declared at most smallBody long is
// read whole: head is the body and rest nil. Otherwise the body is read only
// until the model is known: head holds what was read and rest yields the
// remainder; head followed by rest is the body, byte for byte.
func readModel(body io.Reader, contentLength int64) (model string, head []byte, rest io.Reader, err error) {
	if contentLength >= 0 && contentLength <= smallBody {
		b, err := io.ReadAll(body)
		if err != nil {
			return "", nil, nil, err
		}
		var doc struct {
			Model *string `json:"model"`
			Name  *string `json:"name"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return "", nil, nil, err
		}
		switch {
		case doc.Model != nil && *doc.Model != "":
			model = *doc.Model
		case doc.Name != nil:
			model = *doc.Name
		}
		return model, b, nil, nil
	}
	var buf bytes.Buffer
	dec := json.NewDecoder(io.TeeReader(body, &buf))
	model, err = scanModel(dec)
	if err != nil {
		return "", nil, nil, err
	}
	return model, buf.Bytes(), body, nil
}

// scanModel reads the top-level object's keys until "model" and returns its
// value; without one, the "name" value if any.
func scanModel(dec *json.Decoder) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return "", errors.New("top-level value is not an object")
	}
	var name string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", err
		}
		key, _ := tok.(string)
		switch key {
		case "model", "name":
			var v string
			if err := dec.Decode(&v); err != nil {
				return "", fmt.Errorf("%q: %w", key, err)
			}
			if key == "model" && v != "" {
				return v, nil
			}
			if key == "name" {
				name = v
			}
		default:
			if err := skipValue(dec); err != nil {
				return "", err
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return "", err
	}
	return name, nil
}

// skipValue consumes one JSON value token by token, holding no more of it
// than the decoder's buffer.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
	}
}
