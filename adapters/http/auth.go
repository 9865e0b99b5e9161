package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"iop/adapters/internal/connquota"
	"iop/adapters/internal/requestid"
	"iop/domain"
)

// APIKey is one caller key the edge accepts: the SHA-256 of the key (the
// key itself is never kept) and the principal it authenticates as.
type APIKey struct {
	SHA256    [sha256.Size]byte
	Principal domain.Principal
}

// Dialect writes a refusal made before a route's handler runs — an
// authentication failure, status 401 (code "unauthorized"), 403
// ("forbidden") or 429 ("rate_limited"), or a browser request refused by
// browserGuard, 403 ("cross_origin") or 421 ("host_not_allowed") — in a
// surface's own error shape. Each route names the dialect its callers
// understand; a new surface adds its own Dialect beside these.
type Dialect func(w http.ResponseWriter, status int, code, message string)

// DialectIOP is the iop API's {"error":{"code","message"}}.
func DialectIOP(w http.ResponseWriter, status int, code, message string) {
	writeJSONError(w, status, code, message)
}

// DialectOpenAI is OpenAI's {"error":{"message","type","param","code"}}:
// 401 is code invalid_api_key, 403 insufficient_permissions, 429
// rate_limit_exceeded — the codes OpenAI SDKs recognise; a browser refusal,
// a request moved to its clean path (308 "moved"), a route the edge does
// not serve (404 "not_found") and a connection over the caps (503, type
// server_error, which the SDKs retry) keep their iop code: only a refused
// key is invalid_api_key. Like every answer of OpenAI's API it carries a
// request id (req_…) as its x-request-id header, which the SDKs and Codex
// show with the error and the access log names.
func DialectOpenAI(w http.ResponseWriter, status int, code, message string) {
	typ, oaCode := "invalid_request_error", code
	switch code {
	case domain.CodeUnauthorized:
		oaCode = "invalid_api_key"
	case domain.CodeForbidden:
		oaCode = "insufficient_permissions"
	case domain.CodeRateLimited:
		typ, oaCode = "requests", "rate_limit_exceeded"
	case domain.CodeTooManyConnections:
		typ = "server_error"
	}
	writeJSON(w, status, requestid.OpenAIError(w.Header(), typ, oaCode, message))
}

// DialectOllama is Ollama's {"error":"…"}.
func DialectOllama(w http.ResponseWriter, status int, _ string, message string) {
	writeJSON(w, status, struct {
		Error string `json:"error"`
	}{message})
}

// Access is what a route asks of its caller when the edge has API keys.
type Access struct {
	// Public routes need no key (/healthz, static console assets).
	Public bool
	// Scope the caller's key must hold; "" asks only for a valid key.
	Scope string
	// Dialect writes the route's 401/403/429; nil is DialectIOP.
	Dialect Dialect
	// AnthropicByHeader: a request that names an anthropic-version (the
	// Anthropic SDK asking /v1/models) is answered in Anthropic's shape.
	AnthropicByHeader bool
}

func (a Access) dialect() Dialect {
	if a.Dialect == nil {
		return DialectIOP
	}
	return a.Dialect
}

// Throttle defaults: a burst of failures, then one try per refill period.
const (
	DefaultFailureBurst  = 10
	DefaultFailureRefill = 2 * time.Second
	DefaultFailureLog    = time.Minute
	maxThrottled         = 4096
)

// authenticator turns a request's key into a principal. With no keys every
// request is the anonymous principal.
type authenticator struct {
	keys     []APIKey
	throttle *failureThrottle
}

type authResult int

const (
	authOK authResult = iota
	authMissing
	authInvalid
	authThrottled
	authForbidden // a valid key without the route's scope
)

// presentedKey returns the key a request carries: "Authorization: Bearer
// KEY" (what OpenAI SDKs send) or "x-api-key: KEY".
func presentedKey(r *http.Request) (string, bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, key, ok := strings.Cut(h, " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			if key = strings.TrimSpace(key); key != "" {
				return key, true
			}
		}
	}
	if key := strings.TrimSpace(r.Header.Get("X-Api-Key")); key != "" {
		return key, true
	}
	return "", false
}

// authenticate finds the principal of r. A presented key is hashed and
// compared with every stored hash in constant time, so a wrong key costs
// exactly what a right one does; an address with too many recent failures
// is refused before its key is even looked at.
func (a *authenticator) authenticate(r *http.Request) (domain.Principal, authResult) {
	if len(a.keys) == 0 {
		return domain.Anonymous(), authOK
	}
	key, ok := presentedKey(r)
	if !ok {
		return domain.Principal{}, authMissing
	}
	addr := remoteHost(r)
	if a.throttle.blocked(addr) {
		return domain.Principal{}, authThrottled
	}
	sum := sha256.Sum256([]byte(key))
	found := -1
	for i := range a.keys {
		eq := subtle.ConstantTimeCompare(sum[:], a.keys[i].SHA256[:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	if found < 0 {
		a.throttle.fail(addr)
		return domain.Principal{}, authInvalid
	}
	return a.keys[found].Principal, authOK
}

// refuse writes the failure res in acc's dialect.
func refuse(w http.ResponseWriter, r *http.Request, acc Access, res authResult, p domain.Principal, retry time.Duration) {
	d := acc.dialect()
	switch res {
	case authMissing:
		w.Header().Set("WWW-Authenticate", `Bearer realm="iop"`)
		d(w, http.StatusUnauthorized, domain.CodeUnauthorized,
			"this edge requires an API key: send it as \"Authorization: Bearer <key>\" or \"x-api-key: <key>\"")
	case authInvalid:
		w.Header().Set("WWW-Authenticate", `Bearer realm="iop", error="invalid_token"`)
		d(w, http.StatusUnauthorized, domain.CodeUnauthorized, "invalid API key")
	case authThrottled:
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(retry.Round(time.Second)/time.Second))))
		d(w, http.StatusTooManyRequests, domain.CodeRateLimited, "too many requests with an invalid API key from this address; try again later")
	case authForbidden:
		d(w, http.StatusForbidden, domain.CodeForbidden,
			fmt.Sprintf("API key %q lacks the %q scope needed for %s %s", p.Name, acc.Scope, r.Method, r.URL.Path))
	}
}

// remoteHost is the network the client's address belongs to (an IPv4
// address, an IPv6 /64; connquota.Key): failures are counted per network,
// not per connection, so a client cannot start afresh by moving to another
// address of its own /64.
func remoteHost(r *http.Request) string {
	return connquota.Key(r.RemoteAddr)
}

// failureThrottle is a token bucket of failed keys per address: each wrong
// key takes a token, a token comes back every refill, and an address with
// none left is answered 429 without its key being checked. It also
// aggregates the failure log: the first failure of an address is logged at
// once, later ones as one line per address per logEvery with their count.
// At most maxThrottled addresses are tracked; when full, addresses whose
// bucket has refilled are forgotten first, then any.
type failureThrottle struct {
	burst    float64
	refill   time.Duration
	logEvery time.Duration
	log      *slog.Logger
	now      func() time.Time

	mu sync.Mutex
	m  map[string]*bucket
}

type bucket struct {
	tokens   float64
	last     time.Time
	unlogged int
	lastLog  time.Time
}

func newFailureThrottle(burst int, refill, logEvery time.Duration, log *slog.Logger) *failureThrottle {
	return &failureThrottle{burst: float64(burst), refill: refill, logEvery: logEvery, log: log, now: time.Now, m: map[string]*bucket{}}
}

// top refills b up to now; call with mu held.
func (t *failureThrottle) top(b *bucket, now time.Time) {
	if t.refill > 0 {
		b.tokens = min(t.burst, b.tokens+float64(now.Sub(b.last))/float64(t.refill))
	}
	b.last = now
}

func (t *failureThrottle) blocked(addr string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.m[addr]
	if !ok {
		return false
	}
	t.top(b, t.now())
	return b.tokens < 1
}

// retryAfter is how long until addr has a token again.
func (t *failureThrottle) retryAfter(addr string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.m[addr]
	if !ok || b.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - b.tokens) * float64(t.refill))
}

func (t *failureThrottle) fail(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	b, ok := t.m[addr]
	if !ok {
		t.makeRoom(now)
		b = &bucket{tokens: t.burst, last: now}
		t.m[addr] = b
	}
	t.top(b, now)
	b.tokens = max(0, b.tokens-1)
	b.unlogged++
	if b.lastLog.IsZero() || now.Sub(b.lastLog) >= t.logEvery {
		// The key is never logged, only the address and how many failed.
		t.log.Warn("rejected invalid API keys", "remote", addr, "count", b.unlogged, "interval", t.logEvery, "throttled", b.tokens < 1)
		b.unlogged, b.lastLog = 0, now
	}
}

// makeRoom keeps the map bounded; call with mu held.
func (t *failureThrottle) makeRoom(now time.Time) {
	if len(t.m) < maxThrottled {
		return
	}
	for addr, b := range t.m {
		t.top(b, now)
		if b.tokens >= t.burst && now.Sub(b.lastLog) >= t.logEvery {
			delete(t.m, addr)
		}
	}
	for addr := range t.m {
		if len(t.m) < maxThrottled {
			break
		}
		delete(t.m, addr)
	}
}
