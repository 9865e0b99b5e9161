// Package httpapi serves the edge's HTTP API:
//
//	POST   /v1/runs                   start a run: SSE of its events, or 202 {"run_id","node"} when background
//	GET    /v1/runs                   recent runs of every (or ?node=) node, ?status=, ?limit= → {"runs":[…]}
//	GET    /v1/runs/{id}              one run from its node's store
//	POST   /v1/runs/{id}/cancel       → {"run_id","node","status":"cancelling"}
//	DELETE /v1/sessions/{session_id}  ?adapter=A&node=N&target=T → {"session_id","node","adapter","terminated":true}
//	GET    /v1/nodes                  connected nodes and the config's offline ones → {"nodes":[…]}
//	GET    /v1/nodes/{id}             one connected node
//	POST   /v1/nodes/{id}/commands    {"command","args"} → the command's JSON result, or SSE (progress/result/error)
//	GET    /v1/events                 SSE of the event bus, ?type=a,b
//	POST   /v1/admin/reload           re-read the node directory → the reload result
//	GET    /healthz                   {"status":"ok","nodes":N}
//
// Every error body is {"error":{"code","message"}}, with the status chosen by
// statusFor from the domain error code (command_unsupported and
// session_unsupported are 501; unknown_command is 400). Unknown routes
// answer 404 and wrong methods 405, in the same shape; a path the mux would
// clean (//v1/nodes) is redirected 308 with such a body (movedTo).
//
// On every route, before any key is looked at, a state-changing request a
// browser sent from another origin is refused 403 cross_origin, and an edge
// without keys on a loopback address refuses a Host that is not loopback or
// localhost with 421 host_not_allowed (DNS rebinding); see browserGuard.
//
// With API keys (Deps.APIKeys) every route registered without
// Access.Public needs a key (Bearer or x-api-key) holding the route's scope:
// 401 without or with a wrong key, 403 without the scope, 429 for an address
// that sent too many wrong keys — each written by the route's Dialect (iop,
// OpenAI, Ollama, or one a new surface brings via Handle). The key's
// principal travels in the request context (domain.PrincipalFrom); use
// cases apply its node limit. Unknown routes need a key too. Server-sent event
// streams send a comment line (": keep-alive") every 15 s while idle and end
// when the client leaves or the server stops.
//
// The listener holds at most MaxConns connections, MaxConnsPerAddr per
// network prefix (connlimit.go). At the total, idle connections of the
// prefix holding the most make room; a connection over the caps is
// answered 503 too_many_connections with Connection: close (in the route's
// dialect), or closed at once when many such answers are under way.
package httpapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"iop/adapters/eventbus"
	"iop/adapters/internal/deadline"
	"iop/application/edge"
	"iop/domain"
)

// DefaultKeepAlive is how often an idle SSE stream sends a comment line.
const DefaultKeepAlive = 15 * time.Second

// DefaultWriteIdleTimeout is how long one write to an SSE client may block.
const DefaultWriteIdleTimeout = time.Minute

// maxBody bounds request bodies.
const maxBody = 8 << 20

// EventSubscriber is what the event feed needs of the edge's bus.
type EventSubscriber interface {
	SubscribeBytes(buffer int, maxBytes int64, filter func(domain.BusEvent) bool) *eventbus.Subscription
}

// Deps are the use cases the API serves. Reload may be nil (the reload
// route then answers 501); everything else is required.
type Deps struct {
	Registry *edge.Registry
	// Nodes, if set, backs GET /v1/nodes with the config's offline nodes
	// too; without it the list holds the connected nodes only.
	Nodes     *edge.ListNodesHandler
	Submit    *edge.SubmitRunHandler
	Cancel    *edge.CancelRunHandler
	Terminate *edge.TerminateSessionHandler
	Commands  *edge.NodeCommandHandler
	GetRun    *edge.GetRunHandler
	ListRuns  *edge.ListRunsHandler
	Events    EventSubscriber
	Reload    func(context.Context) (edge.ReloadResult, error)
	// OpenAI, if set, serves the provider passthrough routes: OpenAI-compatible
	// (/v1/chat/completions, /v1/responses, /v1/models, …), Anthropic
	// Messages (/v1/messages) and Ollama-native (/, /api/…).
	OpenAI http.Handler
	// TunnelUsage, if set, reports the edge's tunnel usage ledger for a node
	// ("" for all); it backs GET /v1/usage.
	TunnelUsage func(node string) []edge.UsageLine
	// History, if set, answers GET /v1/runs, GET /v1/runs/{id} and
	// GET /v1/usage from the edge's durable history.
	History *edge.RunHistoryHandler
	// Metrics, if set, is served on GET /metrics (scope read, and a key
	// without a nodes limit: it covers every node).
	Metrics http.Handler
	// APIKeys, when any is set, make every route not marked Public need a
	// key holding the route's scope; with none every caller is anonymous.
	APIKeys []APIKey
	// TLSCert, if set, serves HTTPS with this certificate.
	TLSCert *tls.Certificate
}

// Server is the edge's HTTP API server.
type Server struct {
	deps Deps
	addr string
	log  *slog.Logger
	mux  *http.ServeMux
	auth *authenticator
	// refusals spaces the access lines of refused requests (logRefused).
	refusals refusalLog
	// feeds counts live event feeds (handleEvents).
	feeds feedCaps
	// MaxSubscriptions and MaxSubscriptionsPerKey cap live event feeds
	// (DefaultMaxSubscriptions, DefaultMaxSubscriptionsPerKey). Set them
	// before serving.
	MaxSubscriptions, MaxSubscriptionsPerKey int
	// guard refuses cross-origin browser writes and, on a keyless loopback
	// edge, foreign Host names (see browserGuard).
	guard browserGuard
	// access holds each registered pattern's Access (see Handle).
	access map[string]Access

	// KeepAlive is the SSE keep-alive interval (DefaultKeepAlive); set it
	// before serving.
	KeepAlive time.Duration
	// WriteIdleTimeout bounds each write of every answer, SSE streams
	// included (DefaultWriteIdleTimeout; see statusWriter): a caller that
	// keeps its connection open but stops reading is cut off, as if it had
	// left, instead of holding a run, a command, a bus subscription or the
	// connection forever. Set it before serving.
	WriteIdleTimeout time.Duration
	// BodyTimeout and BodyMinRate bound the time to read a request body on
	// every route of this server, the OpenAI and Ollama surfaces included
	// (DefaultBodyTimeout, DefaultBodyMinRate); see clockBody. Set them
	// before serving.
	BodyTimeout time.Duration
	BodyMinRate int
	// BodyIdleTimeout bounds each wait for a body's next bytes
	// (DefaultBodyIdleTimeout). Set it before serving.
	BodyIdleTimeout time.Duration
	// AccessLog logs every request at info (log.access); off, at debug.
	AccessLog bool
	// MaxConns and MaxConnsPerAddr cap the listener's connections in total
	// and per network prefix (an IPv4 address, an IPv6 /64):
	// DefaultMaxConns and DefaultMaxConnsPerAddr when zero; see
	// connLimiter. Set them before Start.
	MaxConns, MaxConnsPerAddr int

	// stopping is cancelled when Stop begins: streams end, short requests
	// are left to finish. base is cancelled when Stop gives up waiting.
	// handlers counts serveHTTP calls under way: Stop waits a moment for
	// those its Close cut off, so what they record on the way out (a cut
	// tunnel's history row) is in before the rest of the edge stops.
	handlers atomic.Int64

	stopping   context.Context
	beginStop  context.CancelFunc
	base       context.Context
	cancelBase context.CancelFunc

	mu        sync.Mutex
	srv       *http.Server
	ln        net.Listener
	lim       *connLimiter
	serveDone chan struct{}
}

// New builds a server for addr; it refuses missing dependencies. Nothing
// listens until Start.
func New(deps Deps, addr string, log *slog.Logger) *Server {
	if deps.Registry == nil || deps.Submit == nil || deps.Cancel == nil || deps.Terminate == nil ||
		deps.Commands == nil || deps.GetRun == nil || deps.ListRuns == nil || deps.Events == nil {
		panic("httpapi.New: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Server{deps: deps, addr: addr, log: log, KeepAlive: DefaultKeepAlive, WriteIdleTimeout: DefaultWriteIdleTimeout,
		BodyTimeout: DefaultBodyTimeout, BodyMinRate: DefaultBodyMinRate, BodyIdleTimeout: DefaultBodyIdleTimeout}
	s.stopping, s.beginStop = context.WithCancel(context.Background())
	s.base, s.cancelBase = context.WithCancel(context.Background())
	s.mux = http.NewServeMux()
	s.access = map[string]Access{}
	s.auth = &authenticator{keys: deps.APIKeys,
		throttle: newFailureThrottle(DefaultFailureBurst, DefaultFailureRefill, DefaultFailureLog, log)}
	s.guard = newBrowserGuard(len(deps.APIKeys) == 0, addr)
	s.routes()
	return s
}

// Access of the iop routes, by scope.
var (
	readAccess  = Access{Scope: domain.ScopeRead}
	runsAccess  = Access{Scope: domain.ScopeRuns}
	adminAccess = Access{Scope: domain.ScopeAdmin}
)

func (s *Server) routes() {
	s.Handle("POST /v1/runs", runsAccess, http.HandlerFunc(s.handleCreateRun))
	if s.deps.History != nil {
		s.Handle("GET /v1/runs", readAccess, http.HandlerFunc(s.handleHistoryRuns))
		s.Handle("GET /v1/runs/{id}", readAccess, http.HandlerFunc(s.handleHistoryRun))
	} else {
		s.Handle("GET /v1/runs", readAccess, http.HandlerFunc(s.handleListRuns))
		s.Handle("GET /v1/runs/{id}", readAccess, http.HandlerFunc(s.handleNodeRun))
	}
	s.Handle("POST /v1/runs/{id}/cancel", runsAccess, http.HandlerFunc(s.handleCancelRun))
	s.Handle("DELETE /v1/sessions/{session_id}", runsAccess, http.HandlerFunc(s.handleEndSession))
	s.Handle("GET /v1/nodes", readAccess, http.HandlerFunc(s.handleListNodes))
	s.Handle("GET /v1/nodes/{id}", readAccess, http.HandlerFunc(s.handleGetNode))
	s.Handle("POST /v1/nodes/{id}/commands", adminAccess, http.HandlerFunc(s.handleNodeCommand))
	s.Handle("GET /v1/events", readAccess, http.HandlerFunc(s.handleEvents))
	s.Handle("POST /v1/admin/reload", adminAccess, edgeWide(http.HandlerFunc(s.handleReload)))
	s.Handle("GET /healthz", Access{Public: true}, http.HandlerFunc(s.handleHealth))
	if s.deps.History != nil {
		s.Handle("GET /v1/usage", readAccess, http.HandlerFunc(s.handleHistoryUsage))
	} else {
		s.Handle("GET /v1/usage", readAccess, http.HandlerFunc(s.handleUsage))
	}
	if s.deps.Metrics != nil {
		s.Handle("GET /metrics", readAccess, edgeWide(s.deps.Metrics))
	}
	if s.deps.OpenAI != nil {
		// No method in these patterns: the passthrough answers 405 itself.
		openai := Access{Scope: domain.ScopeInference, Dialect: DialectOpenAI, AnthropicByHeader: true}
		for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/models/",
			"/v1/responses", "/v1/responses/", "/v1/audio/", "/v1/images/", "/v1/rerank"} {
			s.Handle(p, openai, s.deps.OpenAI)
		}
		anthropic := Access{Scope: domain.ScopeInference, Dialect: DialectAnthropic}
		s.Handle("/v1/messages", anthropic, s.deps.OpenAI)
		s.Handle("/v1/messages/", anthropic, s.deps.OpenAI)
		// "Ollama is running": the probe Ollama's CLI and Claude Code send
		// before anything else, with no key; it tells nothing.
		s.Handle("/{$}", Access{Public: true}, s.deps.OpenAI)
		s.Handle("/api/", Access{Scope: domain.ScopeInference, Dialect: DialectOllama}, s.deps.OpenAI)
	}
}

// Handle registers h for pattern (http.ServeMux syntax) with the access it
// requires. Call it before Start; other surfaces (a console, more
// compatible APIs) add their routes this way.
func (s *Server) Handle(pattern string, acc Access, h http.Handler) {
	s.access[pattern] = acc
	s.mux.Handle(pattern, h)
}

// apiContentSecurityPolicy is every API answer's policy: a document
// served on any route (a provider's HTML page relayed as it came) gets an
// opaque origin, loads nothing and cannot be framed.
const apiContentSecurityPolicy = "sandbox; default-src 'none'; frame-ancestors 'none'"

// The two headers' values, shared by every answer without an allocation:
// their capacity is their length, so a handler that adds a value (a
// passthrough copying the provider's headers) appends to a copy.
var (
	apiCSPValue  = []string{apiContentSecurityPolicy}[:1:1]
	nosniffValue = []string{"nosniff"}[:1:1]
)

// Handler returns the API as an http.Handler (access log, JSON 404/405).
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(s.serveHTTP)
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.handlers.Add(1)
	defer s.handlers.Add(-1)
	start := time.Now()
	body := clockBody(w, r, s.BodyTimeout, s.BodyMinRate, s.BodyIdleTimeout)
	if body != nil {
		// A read of the body after the handler returned (a handler's bug:
		// net/http forbids it) must at least not move the connection's
		// deadline through a ResponseController that is no longer valid.
		defer func() { _ = body.own(time.Time{}, true) }()
	}
	// No answer of this API is a page: what a provider, a node or a caller
	// put in one (a passthrough's HTML, a run's output) must never run as
	// this origin, where the console and every write route live. API
	// clients ignore both; the console sets its own policy.
	hdr := w.Header()
	hdr["Content-Security-Policy"], hdr["X-Content-Type-Options"] = apiCSPValue, nosniffValue
	sw := &statusWriter{ResponseWriter: w, wd: deadline.Quarter(s.WriteIdleTimeout), body: body}
	keepDotID(r)
	h, pattern := s.mux.Handler(r)
	// An unknown route needs a key too, so that a caller without one
	// learns nothing about which routes exist.
	acc := s.access[pattern]
	if anthropicClient(r, pattern, acc) {
		acc.Dialect = DialectAnthropic
	}
	if why, over := refusedConn(r); over {
		// The connection is over the listener's caps (connLimiter): it
		// was kept only to say so, and is closed after this answer.
		answerRefused(sw, acc.dialect(), why, "this edge")
		s.logRefused(sw, r, start, "", pattern)
		return
	}
	// Before the key: a browser's forged or rebound request is refused on
	// every route, public ones and those of a keyless edge included.
	if status, code, msg, ok := s.guard.check(r); !ok {
		acc.dialect()(sw, status, code, msg)
		s.logRefused(sw, r, start, "", pattern)
		return
	}
	var p domain.Principal
	if acc.Public {
		p = domain.Anonymous()
	} else {
		var res authResult
		p, res = s.auth.authenticate(r)
		if res == authOK && acc.Scope != "" && !p.Allows(acc.Scope) {
			res = authForbidden
		}
		if res != authOK {
			refuse(sw, r, acc, res, p, s.auth.throttle.retryAfter(remoteHost(r)))
			s.logRefused(sw, r, start, p.Name, pattern)
			return
		}
	}
	r = r.WithContext(domain.WithPrincipal(r.Context(), p))
	// Logged on the way out of a panic too: a relay that breaks mid-stream
	// aborts its response with http.ErrAbortHandler, which net/http
	// recovers after this handler — it still gets its access line.
	defer func() {
		s.logAccess(sw, r, start, p.Name)
		if sw.internal != nil {
			// Not always a 500: a history read the database fails is
			// answered 503 history_unavailable; the line names what went out.
			s.log.Error("internal error answered", "method", r.Method, "path", r.URL.Path, "status", sw.status(), "err", sw.internal)
		}
	}()
	if target, ok := movedTo(r, pattern); ok {
		moved(sw, r, target, acc.dialect())
	} else if pattern == "" {
		d, hint := acc.dialect(), ""
		if v1, vacc, ok := s.underV1(r); ok {
			// An SDK whose base URL lacks its /v1 (or has it twice): say
			// where the route is, in that route's shape.
			hint = v1
			if !anthropicClient(r, "", acc) {
				d = vacc.dialect()
			}
		}
		unroutedHint(sw, r, h, d, hint)
	} else {
		s.mux.ServeHTTP(sw, r)
	}
}

// idRoutes are the path prefixes under which the iop API takes a run,
// session or node id as the next segment.
var idRoutes = []string{"/v1/runs/", "/v1/sessions/", "/v1/nodes/"}

// keepDotID percent-encodes an id segment that is "." or ".." (GET
// /v1/runs/., DELETE /v1/sessions/..), so that the mux, which cleans such
// segments away, routes the request as sent and the route refuses the id
// (domain.CheckPathID, 400). Cleaned, GET /v1/runs/. was redirected to the
// run list (307 with an HTML body) and DELETE /v1/sessions/.. reached no
// route. The decoded path is unchanged.
func keepDotID(r *http.Request) {
	p := r.URL.EscapedPath()
	for _, prefix := range idRoutes {
		rest, ok := strings.CutPrefix(p, prefix)
		if !ok {
			continue
		}
		id, tail, slash := strings.Cut(rest, "/")
		if id != "." && id != ".." {
			return
		}
		raw := prefix + strings.Repeat("%2E", len(id))
		if slash {
			raw += "/" + tail
		}
		r.URL.RawPath = raw
		return
	}
}

// anthropicClient reports whether r is an Anthropic SDK's (it names an
// anthropic-version) on a route of an OpenAI-shaped surface or on none
// under /v1/ (/v1/models asked by the Anthropic SDK, /v1/complete): the
// edge's own refusals there are then in Anthropic's shape, as the
// passthrough's answers are. The iop API's routes keep their own. The
// path is the one the mux routes on (cleaned: //v1/models is /v1/models,
// moved there in Anthropic's shape too).
func anthropicClient(r *http.Request, pattern string, acc Access) bool {
	if r.Header.Get("Anthropic-Version") == "" || !strings.HasPrefix(cleanPath(r.URL.Path), "/v1/") {
		return false
	}
	return pattern == "" || acc.AnthropicByHeader
}

// movedTo reports where the mux would redirect r with an HTML body (307):
// to its cleaned path (//v1/nodes, a base URL ending in "/" joined with
// "/v1/nodes"; /v1/./runs), or to a subtree's root when the slash is
// missing (/api for /api/). Like the mux it cleans the escaped path, so an
// id keepDotID kept is not moved, and it cleans no CONNECT request's path.
// pattern is what the mux matched for r.
func movedTo(r *http.Request, pattern string) (string, bool) {
	p := r.URL.EscapedPath()
	if r.Method != http.MethodConnect {
		if c := cleanPath(p); c != p {
			return c, true
		}
	}
	// A subtree's pattern carries no method ("/api/"), so this is the mux's
	// trailing-slash redirect and never a route the path matched; the mux
	// builds it from the decoded path (/ap%69 is moved to /api/).
	if pattern != "" && (pattern == p+"/" || pattern == r.URL.Path+"/") {
		return pattern, true
	}
	return "", false
}

// cleanPath is net/http's rule for the path the mux serves: rooted,
// path.Clean'd, its trailing slash kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p) // no allocation when p is clean
	if p[len(p)-1] == '/' && np != "/" {
		if len(p) == len(np)+1 && strings.HasPrefix(p, np) {
			return p // clean with its slash: no copy
		}
		np += "/"
	}
	return np
}

// moved redirects r to target (an escaped path) with 308, which keeps the
// method and body (a POST stays a POST), and says so in d's JSON shape.
func moved(w http.ResponseWriter, r *http.Request, target string, d Dialect) {
	loc := target
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	w.Header().Set("Location", loc)
	p := r.URL.EscapedPath()
	d(w, http.StatusPermanentRedirect, "moved", fmt.Sprintf("%s is served at %s (%s)", p, target, movedWhy(p, target)))
}

// movedWhy is why path p is moved to target, as a caller can act on it:
// only a doubled slash is a base URL ending in "/"; /api lacks its slash,
// and /v1/x/../runs has segments the edge does not take.
func movedWhy(p, target string) string {
	switch {
	case strings.Contains(p, "//"):
		return `a base URL ending in "/" doubles the slash`
	case cleanPath(p) != p:
		return `"." and ".." segments are resolved first`
	case strings.HasSuffix(target, "/") && !strings.HasSuffix(p, "/"):
		return `a subtree's path ends in "/"`
	}
	return "its clean form"
}

// unrouted answers requests no route takes (404, or 405 with Allow) in JSON,
// in d's shape.
func unrouted(w http.ResponseWriter, r *http.Request, h http.Handler, d Dialect) {
	unroutedHint(w, r, h, d, "")
}

// unroutedHint is unrouted whose 404 names v1, when set, as the path the
// caller meant (underV1).
func unroutedHint(w http.ResponseWriter, r *http.Request, h http.Handler, d Dialect, v1 string) {
	probe := &probeWriter{header: http.Header{}}
	h.ServeHTTP(probe, r)
	if probe.code == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", probe.header.Get("Allow"))
		d(w, http.StatusMethodNotAllowed, "method_not_allowed",
			fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, probe.header.Get("Allow")))
		return
	}
	msg := fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)
	anthropic := v1 == "/v1/messages" || strings.HasPrefix(v1, "/v1/messages/")
	twice := strings.HasPrefix(r.URL.Path, "/v1/v1/")
	switch {
	case v1 == "":
	case anthropic && twice:
		msg += fmt.Sprintf(": this edge serves %s; Anthropic SDKs and Claude Code take its URL without /v1 (http://host:port)", v1)
	case anthropic:
		msg += fmt.Sprintf(": this edge serves %s (the path lacks /v1)", v1)
	case twice:
		msg += fmt.Sprintf(": this edge serves %s; OpenAI SDKs and Codex take its URL with /v1 once (http://host:port/v1)", v1)
	default:
		msg += fmt.Sprintf(": this edge serves %s; OpenAI SDKs and Codex take its URL with /v1 (http://host:port/v1)", v1)
	}
	d(w, http.StatusNotFound, "not_found", msg)
}

// underV1 reports the route of a compatible surface an unrouted request
// meant when its base URL lacks "/v1" (an OpenAI SDK given
// http://host:port asks POST /chat/completions) or has it once too many
// (Claude Code given http://host:port/v1 asks /v1/v1/messages): the path
// with "/v1" added or one taken away, if such a route takes that path and
// method, and that route's access.
func (s *Server) underV1(r *http.Request) (string, Access, bool) {
	p := r.URL.Path
	var alt string
	switch {
	case strings.HasPrefix(p, "/v1/v1/"):
		alt = strings.TrimPrefix(p, "/v1")
	case p != "/" && !strings.HasPrefix(p, "/v1/") && !strings.HasPrefix(p, "/api/"):
		alt = "/v1" + p
	default:
		return "", Access{}, false
	}
	probe := r.Clone(r.Context())
	probe.URL.Path, probe.URL.RawPath = alt, ""
	_, pattern := s.mux.Handler(probe)
	acc := s.access[pattern]
	if pattern == "" || acc.Dialect == nil {
		return "", Access{}, false // no route, or the iop API's own
	}
	if _, moved := movedTo(probe, pattern); moved {
		return "", Access{}, false
	}
	return alt, acc, true
}

// Start binds the listener synchronously, so a busy port fails here, and
// serves on a goroutine until Stop.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return errors.New("http server already started")
	}
	// Counted before TLS: a connection over the caps costs no handshake
	// unless it is kept to be answered 503.
	ln, lim, err := listenLimited(s.addr, s.MaxConns, s.MaxConnsPerAddr, s.log)
	if err != nil {
		return fmt.Errorf("http api: listen on %s: %w", s.addr, err)
	}
	s.lim = lim
	if s.deps.TLSCert != nil {
		ln = tls.NewListener(ln, &tls.Config{
			Certificates: []tls.Certificate{*s.deps.TLSCert},
			MinVersion:   tls.VersionTLS12,
			NextProtos:   []string{"http/1.1"},
		})
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return s.base },
		ErrorLog:          log.New(&serverErrorLog{log: s.log}, "", 0),
	}
	lim.hook(s.srv)
	s.serveDone = make(chan struct{})
	go func() {
		defer close(s.serveDone)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http api stopped serving", "err", err)
		}
	}()
	scheme := "http"
	if s.deps.TLSCert != nil {
		scheme = "https"
	}
	s.log.Info("http api listening", "addr", ln.Addr().String(), "scheme", scheme, "api_keys", len(s.deps.APIKeys))
	return nil
}

// Addr is the bound address, or nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Stop ends every stream at once (a foreground run whose caller is cut off
// is cancelled on its node), lets other requests finish until ctx is done,
// then closes whatever is left. It is safe to call more than once.
func (s *Server) Stop(ctx context.Context) error {
	s.beginStop()
	s.mu.Lock()
	srv, done := s.srv, s.serveDone
	s.mu.Unlock()
	if srv == nil {
		s.cancelBase()
		return nil
	}
	err := srv.Shutdown(ctx)
	s.cancelBase()
	if err != nil {
		_ = srv.Close()
	}
	<-done
	if err != nil {
		// Close cut the connections of handlers still running (a tunnel
		// streaming): they end at once, recording as they go.
		for deadline := time.Now().Add(handlerGrace); s.handlers.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	return err
}

// handlerGrace bounds Stop's wait for the handlers its Close cut off.
const handlerGrace = time.Second

// streamContext is done when the client leaves or the server stops.
func (s *Server) streamContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(s.stopping, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// shuttingDown reports whether a stream ended because the server stops
// rather than because its client left.
func (s *Server) shuttingDown(r *http.Request) bool {
	return s.stopping.Err() != nil && r.Context().Err() == nil
}

func (s *Server) keepAlive() time.Duration {
	if s.KeepAlive <= 0 {
		return DefaultKeepAlive
	}
	return s.KeepAlive
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "nodes": len(s.deps.Registry.List())})
}

// edgeWide serves h only to a caller that sees every node. /metrics holds
// each node's series and edge-wide totals (tunnel bytes, run durations,
// registrations) that no node filter could split, so a key limited to some
// nodes is refused rather than shown the others.
func edgeWide(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := domain.PrincipalFrom(r.Context()); p.Limited() {
			writeJSONError(w, http.StatusForbidden, domain.CodeForbidden, fmt.Sprintf(
				"API key %q is limited to some nodes; %s %s covers every node and needs a key without a nodes limit",
				p.Name, r.Method, r.URL.Path))
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Server) handleReload(w http.ResponseWriter, r *http.Request) {
	if s.deps.Reload == nil {
		writeJSONError(w, http.StatusNotImplemented, "not_implemented", "config reload is not available on this edge")
		return
	}
	// A caller that leaves does not cut the reload short: a push given up
	// on has an unknown outcome, and its node's link is closed for it.
	res, err := s.deps.Reload(context.WithoutCancel(r.Context()))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// statusWriter records the status and size of a response for the access
// log; Unwrap lets http.ResponseController reach Flush.
//
// It also bounds every write of the answer: before each one (and each
// flush) the connection's write deadline is moved WriteIdleTimeout ahead
// (at most once per quarter of it, see deadline.Lazy), until the handler
// sets a deadline of its own (SSE streams and the provider relay do, and
// keep moving it). Without it a client that pipelined requests and never
// read the answers blocked the server's write forever, on a connection
// that counts as busy and so was never closed to make room. The bound is
// on progress, not on the whole answer: a handler may wait as long as it
// needs before it writes, and a slow client that keeps reading is not cut.
type statusWriter struct {
	http.ResponseWriter
	code  int
	bytes int64
	// internal is the detail of an internal error answered generically.
	internal error
	// wd moves the write deadline; own: the handler set its own.
	wd  deadline.Lazy
	own bool
	// body is the request's clocked body, nil when it has none.
	body *clockedBody
}

// SetReadDeadline is the handler's own read deadline (through
// http.ResponseController): the body clock no longer moves it.
func (w *statusWriter) SetReadDeadline(t time.Time) error {
	if w.body != nil {
		return w.body.own(t, false)
	}
	return http.NewResponseController(w.ResponseWriter).SetReadDeadline(t)
}

// writeChunk is the most one bounded write hands to the connection at once,
// so a large answer to a slow reader is bounded per piece, not as a whole.
const writeChunk = 64 << 10

func (w *statusWriter) noteInternal(err error) { w.internal = err }

// armWrite moves the write deadline before a write, unless the handler
// has taken it over.
func (w *statusWriter) armWrite() {
	if w.own {
		return
	}
	if t, due := w.wd.Next(time.Now()); due {
		_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(t)
	}
}

// SetWriteDeadline is the handler's own deadline (through
// http.ResponseController): from then on it is the handler's to move.
func (w *statusWriter) SetWriteDeadline(t time.Time) error {
	w.own = true
	return http.NewResponseController(w.ResponseWriter).SetWriteDeadline(t)
}

// FlushError flushes under the write deadline (http.ResponseController's
// Flush finds it).
func (w *statusWriter) FlushError() error {
	w.armWrite()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.armWrite()
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	var n int
	for {
		piece := b
		if !w.own && len(piece) > writeChunk {
			piece = piece[:writeChunk]
		}
		w.armWrite()
		m, err := w.ResponseWriter.Write(piece)
		n += m
		w.bytes += int64(m)
		b = b[m:]
		if err != nil || len(b) == 0 {
			return n, err
		}
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// probeWriter captures what the mux's own 404/405 handlers would write.
type probeWriter struct {
	header http.Header
	code   int
}

func (p *probeWriter) Header() http.Header { return p.header }
func (p *probeWriter) WriteHeader(code int) {
	if p.code == 0 {
		p.code = code
	}
}
func (p *probeWriter) Write(b []byte) (int, error) {
	if p.code == 0 {
		p.code = http.StatusOK
	}
	return len(b), nil
}
