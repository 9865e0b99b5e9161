package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"iop/domain"
)

// Defaults and limits of edge.yaml.
const (
	DefaultTransportListen   = "127.0.0.1:7700"
	DefaultHTTPListen        = "127.0.0.1:7701"
	DefaultHeartbeatInterval = 30 * time.Second
	DefaultHeartbeatTimeout  = 45 * time.Second
	DefaultMaxFrameSize      = 4 << 20
	// DefaultMaxBodyBytes caps a provider passthrough request body.
	DefaultMaxBodyBytes = 32 << 20
	MinMaxFrameSize     = 64 << 10
	MaxMaxFrameSize     = 64 << 20
	MinTokenLength      = 8
	// MinHeartbeat and MaxHeartbeat bound transport.heartbeat_interval and
	// heartbeat_timeout, as the nodes check them (domain.MinHeartbeat).
	MinHeartbeat = domain.MinHeartbeat
	MaxHeartbeat = domain.MaxHeartbeat
)

// DefaultHTTPMaxConnections and DefaultHTTPMaxConnectionsPerAddress cap the
// HTTP listener's connections (httpapi.DefaultMaxConns and
// DefaultMaxConnsPerAddr hold the same values; config does not import the
// HTTP adapter).
const (
	DefaultHTTPMaxConnections           = 8192
	DefaultHTTPMaxConnectionsPerAddress = 256
)

// EdgeConfig is the content of edge.yaml.
type EdgeConfig struct {
	// StateDir holds what the edge creates for itself (the node-link CA and
	// certificate in tls.mode auto). Relative paths are taken from the config
	// file's directory; the default is "<config name>-state" next to it.
	StateDir  string          `yaml:"state_dir"`
	Transport TransportConfig `yaml:"transport"`
	HTTP      HTTPConfig      `yaml:"http"`
	Log       LogConfig       `yaml:"log"`
	Nodes     []NodeEntry     `yaml:"nodes"`
	Store     StoreConfig     `yaml:"store"`
	Metrics   MetricsConfig   `yaml:"metrics"`
}

// TransportConfig configures the edge's node-facing TCP listener.
type TransportConfig struct {
	Listen            string   `yaml:"listen"`
	HeartbeatInterval Duration `yaml:"heartbeat_interval"`
	HeartbeatTimeout  Duration `yaml:"heartbeat_timeout"`
	MaxFrameSize      int64    `yaml:"max_frame_size"`
	TLS               LinkTLS  `yaml:"tls"`
}

// HTTPConfig configures the edge's HTTP API listener.
type HTTPConfig struct {
	Listen string `yaml:"listen"`
	// MaxBodyBytes caps a request body on the provider passthrough routes
	// (/v1/chat/completions, /v1/messages, /api/chat, …); larger is 413.
	// At most this much of a body is held while its model is looked for.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxConnections caps the listener's connections in total;
	// MaxConnectionsPerAddress those from one network prefix (an IPv4
	// address, an IPv6 /64). At the total, idle connections of the prefix
	// holding the most are closed to make room; a connection over the caps
	// is answered 503 too_many_connections and closed.
	MaxConnections           int `yaml:"max_connections"`
	MaxConnectionsPerAddress int `yaml:"max_connections_per_address"`
	// APIKeys, when any is set, make every route but /healthz need a key.
	APIKeys []APIKeyEntry `yaml:"api_keys"`
	// AllowUnauthenticated lets the API listen on a non-loopback address
	// with no keys (the edge then warns at start).
	AllowUnauthenticated bool `yaml:"allow_unauthenticated"`
	// TLS, if set, serves the API over HTTPS.
	TLS *HTTPTLSConfig `yaml:"tls"`
}

// HTTPTLSConfig is the certificate the HTTP API serves HTTPS with.
type HTTPTLSConfig struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// MinAPIKeyLength is the shortest key accepted through key_env.
const MinAPIKeyLength = 16

// APIKeyEntry is one caller key of http.api_keys. Exactly one of KeySHA256
// (hex SHA-256 of the key, so the file holds no secret) and KeyEnv (a
// variable of the edge's environment holding the key) is set.
type APIKeyEntry struct {
	Name      string   `yaml:"name"`
	KeySHA256 string   `yaml:"key_sha256"`
	KeyEnv    string   `yaml:"key_env"`
	Scopes    []string `yaml:"scopes"`
	// Nodes limits the key to these node ids; left out, every node. An
	// empty list is refused: it would mean every node too.
	Nodes []string `yaml:"nodes"`
}

// APIKey is a resolved key: the SHA-256 of the key and the caller it names.
type APIKey struct {
	SHA256    [sha256.Size]byte
	Principal domain.Principal
}

// ResolveKeyHash returns the SHA-256 of the entry's key, from key_sha256 or
// by hashing the value of key_env. Errors never contain the key.
func (k APIKeyEntry) ResolveKeyHash() ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	switch {
	case k.KeySHA256 != "" && k.KeyEnv != "":
		return sum, errors.New("set only one of key_sha256 and key_env")
	case k.KeySHA256 != "":
		b, err := hex.DecodeString(trimSHA256Prefix(k.KeySHA256))
		if err != nil || len(b) != sha256.Size {
			return sum, errors.New("key_sha256 must be 64 hex digits (the SHA-256 of the key, e.g. printf %s KEY | sha256sum)")
		}
		copy(sum[:], b)
		return sum, nil
	case k.KeyEnv != "":
		v := os.Getenv(k.KeyEnv)
		if v == "" {
			return sum, unsetEnvError("key_env", k.KeyEnv, "key")
		}
		if len(v) < MinAPIKeyLength {
			return sum, fmt.Errorf("key_env: the key in %s must be at least %d characters", k.KeyEnv, MinAPIKeyLength)
		}
		return sha256.Sum256([]byte(v)), nil
	default:
		return sum, errors.New("one of key_sha256 and key_env is required")
	}
}

// ResolvedKeys resolves http.api_keys. Call it on a validated config: an entry
// that does not resolve is left out (it could never match).
func (c HTTPConfig) ResolvedKeys() []APIKey {
	out := make([]APIKey, 0, len(c.APIKeys))
	for _, k := range c.APIKeys {
		sum, err := k.ResolveKeyHash()
		if err != nil {
			continue
		}
		out = append(out, APIKey{SHA256: sum, Principal: domain.Principal{
			Name: k.Name, Scopes: slices.Clone(k.Scopes), Nodes: slices.Clone(k.Nodes),
		}})
	}
	return out
}

func (c HTTPConfig) validate(resolveEnv bool) []error {
	var errs []error
	add := func(paths []string, format string, args ...any) {
		errs = append(errs, at(fmt.Errorf(format, args...), paths...))
	}
	names := map[string]int{}
	hashes := map[[sha256.Size]byte]int{}
	for i, k := range c.APIKeys {
		p := fmt.Sprintf("http.api_keys[%d]", i)
		where := p
		switch {
		case k.Name == "":
			add([]string{p}, "%s: name is required", where)
		case !nodeIDPattern.MatchString(k.Name) || k.Name == domain.AnonymousName:
			add([]string{p + ".name"}, "%s: name %q may contain only letters, digits, '.', '_' and '-' and must not be %q", where, k.Name, domain.AnonymousName)
		case len(k.Name) > domain.MaxNameLength:
			// The history stores a run's key name (at most 255 bytes) and
			// recalls a session's owner by it: a longer name came back
			// clipped and no longer matched its own key.
			add([]string{p + ".name"}, "%s: name is %d bytes long, at most %d", where, len(k.Name), domain.MaxNameLength)
		default:
			where = fmt.Sprintf("http.api_keys[%d] (name %q)", i, k.Name)
			if j, dup := names[k.Name]; dup {
				add([]string{p + ".name"}, "%s: name is already used by http.api_keys[%d]", where, j)
			} else {
				names[k.Name] = i
			}
		}
		if len(k.Scopes) == 0 {
			add([]string{p + ".scopes"}, "%s: scopes is required (any of %s)", where, strings.Join(domain.KnownScopes, ", "))
		}
		for j, s := range k.Scopes {
			if !slices.Contains(domain.KnownScopes, s) {
				add([]string{fmt.Sprintf("%s.scopes[%d]", p, j)}, "%s: unknown scope %q (known: %s)", where, s, strings.Join(domain.KnownScopes, ", "))
			}
		}
		if k.Nodes != nil && len(k.Nodes) == 0 {
			// An empty limit is no limit (Principal.Limited): "nodes: []",
			// meant as "no node yet", gave the key every node.
			add([]string{p + ".nodes"}, "%s: nodes is empty, which would give the key every node; list the node ids it may use, or leave nodes out to mean every node", where)
		}
		for j, n := range k.Nodes {
			if !nodeIDPattern.MatchString(n) {
				add([]string{fmt.Sprintf("%s.nodes[%d]", p, j)}, "%s: nodes: %q is not a node id", where, n)
			}
		}
		if !resolveEnv && k.KeyEnv != "" && k.KeySHA256 == "" {
			continue // the key is in the environment, unread
		}
		sum, err := k.ResolveKeyHash()
		if err != nil {
			add(append(entryPaths(p, err.Error(), []string{"key_sha256", "key_env"}), p), "%s: %w", where, err)
			continue
		}
		if j, dup := hashes[sum]; dup {
			add([]string{p + ".key_sha256", p + ".key_env"}, "%s: the key is the same as the key of http.api_keys[%d]; every key needs its own", where, j)
		} else {
			hashes[sum] = i
		}
	}
	if len(c.APIKeys) == 0 && !c.AllowUnauthenticated && !IsLoopbackListen(c.Listen) {
		add([]string{"http.listen", "http"}, "http.listen %q is not a loopback address and http.api_keys is empty: anyone who reaches it could run work on every node; "+
			"add http.api_keys (see docs/security.md) or set http.allow_unauthenticated: true", c.Listen)
	}
	if c.TLS != nil && (c.TLS.CertFile == "" || c.TLS.KeyFile == "") {
		add([]string{"http.tls"}, "http.tls needs both cert_file and key_file")
	}
	return errs
}

// NodeEntry is one node of edge.yaml nodes[]. Exactly one of Token and
// TokenEnv is set; TokenEnv names a variable of the edge's environment.
type NodeEntry struct {
	ID       string `yaml:"id"`
	Token    Secret `yaml:"token"`
	TokenEnv string `yaml:"token_env"`
	// TokenSHA256 is the hex SHA-256 of the token (iop-edge hash-token), so
	// the file need not hold the secret.
	TokenSHA256 string          `yaml:"token_sha256"`
	Adapters    []AdapterEntry  `yaml:"adapters"`
	Providers   []ProviderEntry `yaml:"providers"`
}

// AdapterEntry configures one runtime adapter of a node. Validate checks it
// with domain.NodeRecord.BuildConfig, as a reload does, so the edge refuses
// to start on an entry a reload would refuse; whether the node supports its
// type is checked when the node registers (the node says which it can build).
type AdapterEntry struct {
	Name           string                 `yaml:"name"`
	Type           string                 `yaml:"type"`
	MaxConcurrency int                    `yaml:"max_concurrency"`
	Timeout        Duration               `yaml:"timeout"`
	Targets        map[string]TargetEntry `yaml:"targets"`
	BaseURL        string                 `yaml:"base_url"`
	PathPrefix     string                 `yaml:"path_prefix"`
	APIKeyEnv      string                 `yaml:"api_key_env"`
	Models         []string               `yaml:"models"`
	Command        string                 `yaml:"command"`
	Args           []string               `yaml:"args"`
	WorkDir        string                 `yaml:"work_dir"`
	// Env and InheritEnv shape the child environment of exec targets and
	// CLI agents (see domain.AdapterConfig).
	Env        map[string]string `yaml:"env"`
	InheritEnv []string          `yaml:"inherit_env"`
	// MaxHistoryBytes bounds the history a chat session turn replays
	// (ollama, openai; 0: domain.DefaultMaxHistoryBytes).
	MaxHistoryBytes int `yaml:"max_history_bytes"`
}

// TargetEntry is one command of an exec adapter.
type TargetEntry struct {
	Command []string          `yaml:"command"`
	Timeout Duration          `yaml:"timeout"`
	Dir     string            `yaml:"dir"`
	Env     map[string]string `yaml:"env"`
	// InheritEnv names node environment variables this target also gets.
	InheritEnv []string `yaml:"inherit_env"`
}

// ProviderEntry declares an upstream server a node reaches for the raw tunnel.
type ProviderEntry struct {
	Name       string   `yaml:"name"`
	Type       string   `yaml:"type"`
	BaseURL    string   `yaml:"base_url"`
	PathPrefix string   `yaml:"path_prefix"`
	APIKeyEnv  string   `yaml:"api_key_env"`
	Models     []string `yaml:"models"`
}

// LoadEdge reads, parses and validates the edge config at path; errors start
// with path.
func LoadEdge(path string) (*EdgeConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read edge config: %w", err)
	}
	return ParseEdge(path, data)
}

// LoadEdgeShape reads, parses and validates the edge config at path as
// LoadEdge does, but reads no key_env or token_env variable: it is for
// commands that need no secret (iop-edge join, --print-ca-pin) and run from
// an ordinary shell, while the secrets live in the service's environment.
// What needs a variable's value goes unchecked for entries given by
// key_env/token_env: a key's or token's length, that it differs from the
// other entries', and that a token is not SampleNodeToken on a public link
// (a token_env token cannot be compared without its value). Everything
// else, including the sample-token check of tokens given as token or
// token_sha256, is checked. Do not serve with the result: ResolvedKeys and
// Records still read the environment.
func LoadEdgeShape(path string) (*EdgeConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read edge config: %w", err)
	}
	return parseEdge(path, data, false)
}

// ParseEdge parses data as edge.yaml, applies defaults and validates it. name
// prefixes every error and should be the file's path: relative paths in the
// file (state_dir, transport.tls files) are resolved against its directory.
func ParseEdge(name string, data []byte) (*EdgeConfig, error) {
	return parseEdge(name, data, true)
}

// parseEdge is ParseEdge; with resolveEnv false it reads no key_env or
// token_env variable (see LoadEdgeShape).
func parseEdge(name string, data []byte, resolveEnv bool) (*EdgeConfig, error) {
	var c EdgeConfig
	if err := decodeStrict(name, data, &c); err != nil {
		return nil, err
	}
	c.resolvePaths(name)
	c.SetDefaults()
	c.resolveStore(name)
	if err := c.validate(resolveEnv); err != nil {
		return nil, locate(name, indexLines(data), err, nil, true)
	}
	return &c, nil
}

// SetDefaults fills every unset (zero) field with its default.
func (c *EdgeConfig) SetDefaults() {
	if c.Transport.Listen == "" {
		c.Transport.Listen = DefaultTransportListen
	}
	if c.Transport.HeartbeatInterval == 0 {
		c.Transport.HeartbeatInterval = Duration(DefaultHeartbeatInterval)
	}
	if c.Transport.HeartbeatTimeout == 0 {
		c.Transport.HeartbeatTimeout = Duration(DefaultHeartbeatTimeout)
	}
	if c.Transport.MaxFrameSize == 0 {
		c.Transport.MaxFrameSize = DefaultMaxFrameSize
	}
	if c.HTTP.MaxBodyBytes == 0 {
		c.HTTP.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.HTTP.MaxConnections == 0 {
		c.HTTP.MaxConnections = DefaultHTTPMaxConnections
	}
	if c.HTTP.MaxConnectionsPerAddress == 0 {
		// An edge given a smaller total alone gets that total per address.
		c.HTTP.MaxConnectionsPerAddress = min(DefaultHTTPMaxConnectionsPerAddress, max(c.HTTP.MaxConnections, 1))
	}
	if c.Transport.TLS.Mode == "" {
		c.Transport.TLS.Mode = TLSAuto
	}
	if c.HTTP.Listen == "" {
		c.HTTP.Listen = DefaultHTTPListen
	}
	c.Log.SetDefaults()
	if c.Store.Retention == 0 {
		c.Store.Retention = Duration(DefaultStoreRetention)
	}
}

// nodeIDPattern keeps node ids usable as one URL path segment without escaping.
var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// Validate checks the whole config and reports every problem found, each
// naming its field and, for nodes, the node. It reads token_env variables
// from the environment. Adapter and provider entries get the checks of
// domain.NodeRecord.BuildConfig (what a reload and a registration apply), so
// the edge starts only on a file a reload would accept.
func (c *EdgeConfig) Validate() error { return c.validate(true) }

// validate is Validate; with resolveEnv false it reads no key_env or
// token_env variable and skips the checks that need their values.
func (c *EdgeConfig) validate(resolveEnv bool) error {
	var errs []error
	add := func(paths []string, format string, args ...any) {
		errs = append(errs, at(fmt.Errorf(format, args...), paths...))
	}

	t := c.Transport
	if err := checkHostPort("transport.listen", t.Listen, true); err != nil {
		errs = append(errs, err)
	}
	if err := checkHostPort("http.listen", c.HTTP.Listen, true); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.HTTP.validate(resolveEnv)...)
	errs = append(errs, listenClashes(
		listenAddr{"transport.listen", t.Listen}, listenAddr{"http.listen", c.HTTP.Listen}, listenAddr{"metrics.listen", c.Metrics.Listen})...)
	if t.HeartbeatInterval <= 0 {
		add([]string{"transport.heartbeat_interval"}, "transport.heartbeat_interval must be positive, got %s", t.HeartbeatInterval)
	}
	if t.HeartbeatTimeout <= t.HeartbeatInterval {
		add([]string{"transport.heartbeat_timeout", "transport.heartbeat_interval"}, "transport.heartbeat_timeout (%s) must be greater than transport.heartbeat_interval (%s)", t.HeartbeatTimeout, t.HeartbeatInterval)
	}
	for _, h := range []struct {
		key string
		v   Duration
	}{{"heartbeat_interval", t.HeartbeatInterval}, {"heartbeat_timeout", t.HeartbeatTimeout}} {
		if h.v > 0 && (h.v.Std() < MinHeartbeat || h.v.Std() > MaxHeartbeat) {
			add([]string{"transport." + h.key}, "transport.%s %s is outside [%s, %s] (nodes are told it in milliseconds and refuse other values)", h.key, h.v, Duration(MinHeartbeat), Duration(MaxHeartbeat))
		}
	}
	errs = appendFlat(errs, t.TLS.validate(t.Listen))
	if t.MaxFrameSize < MinMaxFrameSize || t.MaxFrameSize > MaxMaxFrameSize {
		add([]string{"transport.max_frame_size"}, "transport.max_frame_size %d is outside [%d, %d] (64 KiB to 64 MiB)", t.MaxFrameSize, MinMaxFrameSize, MaxMaxFrameSize)
	}
	if c.HTTP.MaxBodyBytes < 1<<10 || c.HTTP.MaxBodyBytes > 1<<30 {
		add([]string{"http.max_body_bytes"}, "http.max_body_bytes %d is outside [1024, 1073741824] (1 KiB to 1 GiB)", c.HTTP.MaxBodyBytes)
	}
	if c.HTTP.MaxConnections < 1 {
		add([]string{"http.max_connections"}, "http.max_connections must be positive, got %d", c.HTTP.MaxConnections)
	}
	if n := c.HTTP.MaxConnectionsPerAddress; n < 1 || n > c.HTTP.MaxConnections {
		add([]string{"http.max_connections_per_address", "http.max_connections"}, "http.max_connections_per_address %d is outside [1, http.max_connections (%d)]", n, c.HTTP.MaxConnections)
	}
	errs = appendFlat(errs, c.Log.Validate())
	errs = appendFlat(errs, c.validateStore())

	ids := map[string]int{}
	tokens := map[[32]byte]int{}
	for i, n := range c.Nodes {
		p := fmt.Sprintf("nodes[%d]", i)
		where := p
		id := []string{p + ".id"}
		switch {
		case n.ID == "":
			add(id, "%s: id is required", where)
		case !nodeIDPattern.MatchString(n.ID):
			add(id, "%s: id %q may contain only letters, digits, '.', '_' and '-'", where, n.ID)
		case len(n.ID) > domain.MaxNameLength:
			add(id, "%s: id is %d bytes long, at most %d", where, len(n.ID), domain.MaxNameLength)
		case n.ID == "." || n.ID == "..":
			add(id, "%s: id %q is not allowed (it is a relative path segment)", where, n.ID)
		default:
			where = fmt.Sprintf("nodes[%d] (id %q)", i, n.ID)
			if j, dup := ids[n.ID]; dup {
				add(id, "%s: id is already used by nodes[%d]", where, j)
			} else {
				ids[n.ID] = i
			}
		}
		if paths, err := n.checkAdapters(p); err != nil {
			add(paths, "%s: %s", where, err)
		}
		tokenKeys := []string{p + ".token", p + ".token_env", p + ".token_sha256"}
		if !resolveEnv && n.envTokenOnly() {
			continue // the token is in the environment, unread
		}
		digest, err := n.tokenDigest()
		if err != nil {
			add(append(entryPaths(p, err.Error(), nodeTokenKeys), tokenKeys...), "%s: %w", where, err)
			continue
		}
		if j, dup := tokens[digest]; dup {
			add(tokenKeys, "%s: token is the same as the token of nodes[%d]; every node needs its own", where, j)
		} else {
			tokens[digest] = i
		}
	}
	errs = appendFlat(errs, c.checkSampleTokens(t.Listen, resolveEnv))
	return errors.Join(errs...)
}

// SampleNodeToken is the token of node local in the repository's
// configs/edge.yaml (and scripts/run.sh): published, so anyone knows it.
const SampleNodeToken = "dev-token-change-me"

// CheckSampleTokens refuses a node whose token (given as token, token_env or
// token_sha256) is SampleNodeToken when the node link listens on listen and
// that is not a loopback address: anyone who reaches the port could register
// as that node. The edge checks the file's transport.listen at start and
// at reload, and at reload also the address it is listening on. The error
// names the node and how to make a token, never the token.
func (c *EdgeConfig) CheckSampleTokens(listen string) error {
	return c.checkSampleTokens(listen, true)
}

// checkSampleTokens is CheckSampleTokens; with resolveEnv false it skips the
// nodes whose token is given by token_env, whose value it does not read.
func (c *EdgeConfig) checkSampleTokens(listen string, resolveEnv bool) error {
	if IsLoopbackListen(listen) {
		return nil
	}
	sample := sha256.Sum256([]byte(SampleNodeToken))
	var errs []error
	for i, n := range c.Nodes {
		if !resolveEnv && n.envTokenOnly() {
			continue
		}
		digest, err := n.tokenDigest()
		if err != nil || digest != sample {
			continue
		}
		p := fmt.Sprintf("nodes[%d]", i)
		errs = append(errs, at(fmt.Errorf("nodes[%d] (id %q): the token is the sample token published in iop's configs/edge.yaml, and transport.listen %q is not a loopback address: "+
			"anyone who reaches it could register as node %q; generate a token (TOKEN=$(openssl rand -hex 32)), "+
			"replace this node's token with token_sha256: <the output of echo -n \"$TOKEN\" | iop-edge hash-token>, "+
			"and start the node with the new token (iop-edge join %s prints how)", i, n.ID, listen, n.ID, n.ID),
			p+".token", p+".token_env", p+".token_sha256", "transport.listen"))
	}
	return errors.Join(errs...)
}

// checkAdapters runs on the node's adapters and providers the checks
// domain.NodeRecord.BuildConfig applies when a reload or a registration
// builds the node's config: a name and a type for every adapter, what its
// type needs (an http(s) base_url, exec commands, ...). The error is the
// message alone, without the config_error code; paths are the keys under
// base (the node's path) it is about, best first.
func (n NodeEntry) checkAdapters(base string) (paths []string, err error) {
	// BuildConfig stops at the first entry it refuses: adding the entries
	// one at a time tells which one that is.
	r := domain.NodeRecord{ID: n.ID}
	for i, a := range n.Adapters {
		p := fmt.Sprintf("%s.adapters[%d]", base, i)
		if a.Name != "" && !nodeIDPattern.MatchString(a.Name) {
			return []string{p + ".name"}, fmt.Errorf("adapter %q: a name may contain only letters, digits, '.', '_' and '-'", a.Name)
		}
		r.Adapters = append(r.Adapters, a.toDomain())
		if _, err := r.BuildConfig(0); err != nil {
			msg := domain.MessageOf(err)
			return adapterPaths(p, msg), errors.New(msg)
		}
	}
	for i, pr := range n.Providers {
		p := fmt.Sprintf("%s.providers[%d]", base, i)
		if pr.Name != "" && !nodeIDPattern.MatchString(pr.Name) {
			return []string{p + ".name"}, fmt.Errorf("provider %q: a name may contain only letters, digits, '.', '_' and '-'", pr.Name)
		}
		r.Providers = append(r.Providers, pr.toDomain())
		if _, err := r.BuildConfig(0); err != nil {
			msg := domain.MessageOf(err)
			return append(entryPaths(p, msg, providerKeys), p), errors.New(msg)
		}
	}
	return nil, nil
}

var (
	nodeTokenKeys = []string{"token", "token_env", "token_sha256"}
	adapterKeys   = yamlKeys(reflect.TypeFor[AdapterEntry]())
	targetKeys    = yamlKeys(reflect.TypeFor[TargetEntry]())
	providerKeys  = yamlKeys(reflect.TypeFor[ProviderEntry]())
	// reTarget finds the exec target a BuildConfig message is about.
	reTarget = regexp.MustCompile(` target ("(?:[^"\\]|\\.)*")`)
)

// adapterPaths lists the keys of the adapter entry at p (or of its exec
// target) that msg, BuildConfig's message about it, names.
func adapterPaths(p, msg string) []string {
	if m := reTarget.FindStringSubmatch(msg); m != nil {
		if name, err := strconv.Unquote(m[1]); err == nil {
			tp := p + ".targets." + name
			return append(entryPaths(tp, msg, targetKeys), tp)
		}
	}
	return append(entryPaths(p, msg, adapterKeys), p)
}

// tokenDigest returns the SHA-256 of the node's token, from whichever of
// token, token_env and token_sha256 is set, checking the token's length.
func (n NodeEntry) tokenDigest() ([32]byte, error) {
	if n.TokenSHA256 != "" {
		if n.Token != "" || n.TokenEnv != "" {
			return [32]byte{}, errors.New("set only one of token, token_env and token_sha256")
		}
		return parseTokenSHA256(n.TokenSHA256)
	}
	tok, err := n.ResolveToken()
	if err != nil {
		return [32]byte{}, err
	}
	if len(tok) < MinTokenLength {
		return [32]byte{}, fmt.Errorf("token must be at least %d characters", MinTokenLength)
	}
	return sha256.Sum256([]byte(tok)), nil
}

// envTokenOnly reports whether the node's token is given by token_env alone.
func (n NodeEntry) envTokenOnly() bool {
	return n.TokenEnv != "" && n.Token == "" && n.TokenSHA256 == ""
}

// parseTokenSHA256 decodes token_sha256: 64 hex digits, optionally after
// "sha256:".
func parseTokenSHA256(s string) ([32]byte, error) {
	var d [32]byte
	b, err := hex.DecodeString(trimSHA256Prefix(s))
	if err != nil || len(b) != len(d) {
		return d, errors.New("token_sha256 must be 64 hex digits (the output of iop-edge hash-token)")
	}
	copy(d[:], b)
	return d, nil
}

// trimSHA256Prefix drops a "sha256:" prefix (either case) from a digest:
// key_sha256 and token_sha256 both take one. It is applied where a digest
// is read (ResolveKeyHash, parseTokenSHA256, Records), never by rewriting
// the parsed config, so an entry built in code takes the prefix too.
func trimSHA256Prefix(h string) string {
	if len(h) > 7 && strings.EqualFold(h[:7], "sha256:") {
		return h[7:]
	}
	return h
}

// TokenHash is what iop-edge hash-token prints: the hex SHA-256 of token,
// the form token_sha256 takes.
func TokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// ResolveToken returns the node's token: Token, or the value of the edge's
// environment variable TokenEnv. It fails when neither or both are set, or
// when the variable is unset or empty; with only TokenSHA256 set it returns
// "" (the edge never learns that token). Errors never contain the token.
func (n NodeEntry) ResolveToken() (string, error) {
	switch {
	case n.Token != "" && n.TokenEnv != "":
		return "", errors.New("set only one of token and token_env")
	case n.TokenSHA256 != "" && n.Token == "" && n.TokenEnv == "":
		return "", nil
	case n.Token != "":
		return string(n.Token), nil
	case n.TokenEnv != "":
		v := os.Getenv(n.TokenEnv)
		if v == "" {
			return "", unsetEnvError("token_env", n.TokenEnv, "token")
		}
		return v, nil
	default:
		return "", errors.New("one of token, token_env and token_sha256 is required")
	}
}

// Records converts the nodes to directory records. Call it on a validated
// config: a node whose token cannot be resolved gets an empty token, which
// never authenticates. The records share no slices or maps with c.
func (c *EdgeConfig) Records() []domain.NodeRecord {
	out := make([]domain.NodeRecord, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		tok, _ := n.ResolveToken()
		r := domain.NodeRecord{ID: n.ID, Token: tok}
		if tok == "" {
			r.TokenSHA256 = strings.ToLower(trimSHA256Prefix(n.TokenSHA256))
		}
		for _, a := range n.Adapters {
			r.Adapters = append(r.Adapters, a.toDomain())
		}
		for _, p := range n.Providers {
			r.Providers = append(r.Providers, p.toDomain())
		}
		out = append(out, r)
	}
	return out
}

func (a AdapterEntry) toDomain() domain.AdapterConfig {
	d := domain.AdapterConfig{
		Name:            a.Name,
		Type:            a.Type,
		MaxConcurrency:  a.MaxConcurrency,
		BaseURL:         a.BaseURL,
		PathPrefix:      a.PathPrefix,
		APIKeyEnv:       a.APIKeyEnv,
		Models:          slices.Clone(a.Models),
		Command:         a.Command,
		Args:            slices.Clone(a.Args),
		WorkDir:         a.WorkDir,
		Timeout:         a.Timeout.Std(),
		Env:             maps.Clone(a.Env),
		InheritEnv:      slices.Clone(a.InheritEnv),
		MaxHistoryBytes: a.MaxHistoryBytes,
	}
	if a.Targets != nil {
		d.Targets = make(map[string]domain.ExecTarget, len(a.Targets))
		for name, t := range a.Targets {
			d.Targets[name] = domain.ExecTarget{
				Command:    slices.Clone(t.Command),
				Timeout:    t.Timeout.Std(),
				Dir:        t.Dir,
				Env:        maps.Clone(t.Env),
				InheritEnv: slices.Clone(t.InheritEnv),
			}
		}
	}
	return d
}

func (p ProviderEntry) toDomain() domain.ProviderConfig {
	return domain.ProviderConfig{
		Name:       p.Name,
		Type:       p.Type,
		BaseURL:    p.BaseURL,
		PathPrefix: p.PathPrefix,
		APIKeyEnv:  p.APIKeyEnv,
		Models:     slices.Clone(p.Models),
	}
}
