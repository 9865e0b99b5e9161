package domain

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The runtime adapter types this code base builds. Which of them a node
// supports is the node's to say when it registers (NodeInfo.AdapterTypes).
const (
	AdapterExec       = "exec"
	AdapterOllama     = "ollama"
	AdapterOpenAI     = "openai"
	AdapterClaudeCode = "claude-code"
	AdapterCodex      = "codex"
	AdapterGemini     = "gemini"
)

// Provider types for the raw tunnel.
const (
	ProviderOpenAI    = "openai"
	ProviderOllama    = "ollama"
	ProviderAnthropic = "anthropic"
)

// KnownProviderTypes lists the provider types, in documentation order.
var KnownProviderTypes = []string{ProviderOpenAI, ProviderOllama, ProviderAnthropic}

// NodeRecord is one entry of the edge's node directory (edge.yaml nodes[]).
type NodeRecord struct {
	ID    string
	Token string
	// TokenSHA256 is the hex SHA-256 of the token when the config holds
	// only the digest; Token is then empty.
	TokenSHA256 string
	Adapters    []AdapterConfig
	Providers   []ProviderConfig
}

// TokenDigest is the SHA-256 of the node's token, whichever way the config
// gives it: hashed from Token (token, or token_env read at load), or
// decoded from TokenSHA256 (hex digits of either case). Two records with
// equal digests accept the same token, so swapping a token for its digest
// changes nothing a node sees. ok is false when the record has neither a
// token nor a well-formed digest; such a record accepts no token.
func (r NodeRecord) TokenDigest() (digest [sha256.Size]byte, ok bool) {
	if r.Token != "" {
		return sha256.Sum256([]byte(r.Token)), true
	}
	b, err := hex.DecodeString(r.TokenSHA256)
	if err != nil || len(b) != sha256.Size {
		return digest, false
	}
	copy(digest[:], b)
	return digest, true
}

// SameToken reports whether r and o accept the same token; records that
// accept none match nothing, not even each other.
func (r NodeRecord) SameToken(o NodeRecord) bool {
	a, aok := r.TokenDigest()
	b, bok := o.TokenDigest()
	return aok && bok && a == b
}

// ExecTarget is one command an exec adapter may run.
type ExecTarget struct {
	Command []string
	Timeout time.Duration
	Dir     string
	Env     map[string]string
	// InheritEnv names variables of the node's environment the command
	// gets besides the clean base set (for secrets it needs).
	InheritEnv []string
}

// AdapterConfig configures one runtime adapter instance on a node. Which
// fields matter depends on Type.
type AdapterConfig struct {
	Name           string
	Type           string
	MaxConcurrency int
	Targets        map[string]ExecTarget // exec
	BaseURL        string                // ollama, openai
	PathPrefix     string                // openai: replaces "/v1"
	APIKeyEnv      string                // openai: env var on the node holding the key
	Models         []string
	Command        string   // claude-code, codex, gemini: the binary
	Args           []string // extra argv before the prompt
	WorkDir        string
	Timeout        time.Duration
	// Env and InheritEnv shape the environment of the processes the adapter
	// starts (exec: for every target; claude-code, codex, gemini): Env declares
	// plain values, InheritEnv names variables copied from the node's own
	// environment. Nothing else of the node's environment is passed on.
	Env        map[string]string
	InheritEnv []string
	// MaxHistoryBytes bounds the stored history a session turn replays
	// (ollama, openai): the JSON of its messages. 0 means
	// DefaultMaxHistoryBytes.
	MaxHistoryBytes int
}

// ProviderConfig declares an upstream server a node can reach for the raw tunnel.
type ProviderConfig struct {
	Name       string
	Type       string
	BaseURL    string
	PathPrefix string
	APIKeyEnv  string
	Models     []string
}

// NodeConfig is the configuration the edge pushes to a node.
type NodeConfig struct {
	NodeID    string
	Version   uint64
	Adapters  []AdapterConfig
	Providers []ProviderConfig
}

// MaxNameLength bounds a node id and an adapter or provider name in the config: all
// label metrics (cut there at 128 bytes, so two longer names alike up to
// that point would make one series and fail the scrape) and fill history
// columns.
const MaxNameLength = 128

// Bounds of the node link's heartbeat interval and timeout. The edge sends
// both to its nodes in whole milliseconds (32 bits: at most ≈ 49 days), and
// each end refuses values outside these: the edge at start (its config), the
// node in the register response (a broken or hostile edge could otherwise
// have it beat every millisecond, or never time the link out).
const (
	MinHeartbeat = 10 * time.Millisecond
	MaxHeartbeat = 24 * time.Hour
)

// DefaultMaxConcurrency applies when an adapter leaves max_concurrency
// unset; MaxMaxConcurrency bounds it (far above what a node runs at once).
const (
	DefaultMaxConcurrency = 4
	MaxMaxConcurrency     = 1 << 16
)

// The history a chat session turn replays (AdapterConfig.MaxHistoryBytes):
// 1 MiB unless configured, between 1 KiB and 64 MiB. The node holds a turn's
// history in memory, more than once while it sends it upstream, for every
// session run in flight, so the upper bound keeps max_concurrency turns of
// it well within a node's memory.
const (
	DefaultMaxHistoryBytes = 1 << 20
	MinMaxHistoryBytes     = 1 << 10
	MaxMaxHistoryBytes     = 64 << 20
)

// BuildConfig turns a directory record into the payload pushed to the node,
// checking everything the node would otherwise fail on. Errors are ErrConfig.
func (r NodeRecord) BuildConfig(version uint64) (NodeConfig, error) {
	cfg := NodeConfig{NodeID: r.ID, Version: version}
	names := map[string]bool{}
	for i, a := range r.Adapters {
		if a.Name == "" {
			return NodeConfig{}, Errorf(CodeConfigError, "adapter #%d has no name", i+1)
		}
		if len(a.Name) > MaxNameLength {
			return NodeConfig{}, Errorf(CodeConfigError, "adapter #%d: its name is %d bytes long, at most %d", i+1, len(a.Name), MaxNameLength)
		}
		if names[a.Name] {
			return NodeConfig{}, Errorf(CodeConfigError, "adapter %q is declared twice", a.Name)
		}
		names[a.Name] = true
		// Which types exist is the node's to say (NodeInfo.AdapterTypes,
		// checked at registration); here a type is only required.
		if a.Type == "" {
			return NodeConfig{}, Errorf(CodeConfigError, "adapter %q has no type", a.Name)
		}
		if a.MaxConcurrency < 0 {
			return NodeConfig{}, Errorf(CodeConfigError, "adapter %q: max_concurrency must not be negative", a.Name)
		}
		if a.MaxConcurrency > MaxMaxConcurrency {
			// It travels as a uint32: a larger one wrapped, so the edge
			// counted slots the node never had.
			return NodeConfig{}, Errorf(CodeConfigError, "adapter %q: max_concurrency %d is more than %d", a.Name, a.MaxConcurrency, MaxMaxConcurrency)
		}
		if a.MaxConcurrency == 0 {
			a.MaxConcurrency = DefaultMaxConcurrency
		}
		if a.Timeout < 0 {
			return NodeConfig{}, Errorf(CodeConfigError, "adapter %q: timeout must not be negative", a.Name)
		}
		if a.Timeout > 0 && a.Timeout < time.Millisecond {
			// Timeouts travel in whole milliseconds: this one would reach
			// the node as 0, no timeout at all.
			return NodeConfig{}, Errorf(CodeConfigError, "adapter %q: timeout %s is under the 1ms timeouts are counted in", a.Name, a.Timeout)
		}
		if err := checkAdapter(a); err != nil {
			return NodeConfig{}, err
		}
		cfg.Adapters = append(cfg.Adapters, a)
	}
	pnames := map[string]bool{}
	for i, p := range r.Providers {
		if p.Name == "" {
			return NodeConfig{}, Errorf(CodeConfigError, "provider #%d has no name", i+1)
		}
		if len(p.Name) > MaxNameLength {
			return NodeConfig{}, Errorf(CodeConfigError, "provider #%d: its name is %d bytes long, at most %d", i+1, len(p.Name), MaxNameLength)
		}
		if pnames[p.Name] {
			return NodeConfig{}, Errorf(CodeConfigError, "provider %q is declared twice", p.Name)
		}
		pnames[p.Name] = true
		if !slices.Contains(KnownProviderTypes, p.Type) {
			return NodeConfig{}, Errorf(CodeConfigError, "provider %q has unknown type %q (known: %s)", p.Name, p.Type, strings.Join(KnownProviderTypes, ", "))
		}
		if p.BaseURL == "" {
			return NodeConfig{}, Errorf(CodeConfigError, "provider %q has no base_url", p.Name)
		}
		if p.APIKeyEnv != "" && !envVarName(p.APIKeyEnv) {
			return NodeConfig{}, Errorf(CodeConfigError, "provider %q: %s", p.Name, apiKeyEnvMessage)
		}
		// The node's provider client can use nothing else: caught here, a
		// start or reload says so, instead of every request failing later.
		// The provider client keeps base_url's query (Azure's api-version)
		// before the caller's; a fragment it would not send.
		if msg := checkBaseURL(p.BaseURL, true); msg != "" {
			return NodeConfig{}, Errorf(CodeConfigError, "provider %q (%s): %s", p.Name, p.Type, msg)
		}
		cfg.Providers = append(cfg.Providers, p)
	}
	return cfg, nil
}

func checkAdapter(a AdapterConfig) error {
	if err := checkEnv(a.Env, a.InheritEnv); err != nil {
		return Errorf(CodeConfigError, "adapter %q: %s", a.Name, err.Message)
	}
	if (len(a.Env) > 0 || len(a.InheritEnv) > 0) && (a.Type == AdapterOllama || a.Type == AdapterOpenAI) {
		return Errorf(CodeConfigError, "adapter %q (%s) starts no process: env and inherit_env apply to exec, claude-code, codex and gemini", a.Name, a.Type)
	}
	if (a.PathPrefix != "" || a.APIKeyEnv != "") && a.Type == AdapterOllama {
		// The ollama adapter calls /api/chat with no key; accepting them
		// would leave a user behind an auth proxy with 401s and no hint.
		return Errorf(CodeConfigError, "adapter %q (ollama): path_prefix and api_key_env apply to openai adapters only (an openai adapter can call Ollama's /v1 with a key)", a.Name)
	}
	if a.APIKeyEnv != "" && !envVarName(a.APIKeyEnv) {
		return Errorf(CodeConfigError, "adapter %q: %s", a.Name, apiKeyEnvMessage)
	}
	if err := checkHistoryBytes(a); err != nil {
		return err
	}
	switch a.Type {
	case AdapterExec:
		for name, t := range a.Targets {
			// A run names its target in the request, which refuses what
			// CheckID refuses: such a target could never be run.
			if err := CheckID("its name", name); err != nil {
				return Errorf(CodeConfigError, "adapter %q target %q: %s, so no run could name it", a.Name, name, MessageOf(err))
			}
			if len(t.Command) == 0 || t.Command[0] == "" {
				return Errorf(CodeConfigError, "adapter %q target %q has an empty command", a.Name, name)
			}
			for _, arg := range t.Command {
				if strings.ContainsRune(arg, 0) {
					return Errorf(CodeConfigError, "adapter %q target %q: a command argument holds a NUL byte", a.Name, name)
				}
			}
			if t.Timeout < 0 {
				return Errorf(CodeConfigError, "adapter %q target %q: timeout must not be negative", a.Name, name)
			}
			if t.Timeout > 0 && t.Timeout < time.Millisecond {
				return Errorf(CodeConfigError, "adapter %q target %q: timeout %s is under the 1ms timeouts are counted in", a.Name, name, t.Timeout)
			}
			if err := checkEnv(t.Env, t.InheritEnv); err != nil {
				return Errorf(CodeConfigError, "adapter %q target %q: %s", a.Name, name, err.Message)
			}
		}
	case AdapterOllama, AdapterOpenAI:
		if a.BaseURL == "" {
			return Errorf(CodeConfigError, "adapter %q (%s) has no base_url", a.Name, a.Type)
		}
		// The node's adapter refuses anything else; caught here, a reload
		// is refused whole and a registration refused with the reason,
		// instead of a node that cannot apply what the edge pushed.
		if msg := checkBaseURL(a.BaseURL, false); msg != "" {
			return Errorf(CodeConfigError, "adapter %q (%s): %s", a.Name, a.Type, msg)
		}
	}
	return nil
}

// apiKeyEnvMessage refuses an api_key_env that is not envVarName. It never
// quotes the value: the key itself written where the variable's name goes
// (api_key_env: sk-…) is an easy slip, the node would look up no such
// variable and send every request without a key, and the message reaches
// stderr, the edge's log and POST /v1/admin/reload's answer.
const apiKeyEnvMessage = "api_key_env takes the name of an environment variable of the node that holds the key, " +
	"in letters, digits and '_' such as OPENAI_API_KEY; this one is not such a name " +
	"and may be the key itself (the value is not shown)"

// envVarName reports whether name can be an environment variable's name
// ([A-Za-z_][A-Za-z0-9_]*) and is not a run of 16 or more hex digits (a
// token): ConventionalEnvName of its ASCII upper case. A key that passes
// (letters and digits only) is caught by the node, which warns of an
// api_key_env it lacks.
func envVarName(name string) bool {
	up := []byte(name)
	for i, c := range up {
		if c >= 'a' && c <= 'z' {
			up[i] = c - 'a' + 'A'
		}
	}
	return ConventionalEnvName(string(up))
}

// ConventionalEnvName reports whether name is an upper-case environment
// variable name ([A-Z_][A-Z0-9_]*) that is not a run of 16 or more hex
// digits: one fit to show. Any other value of a *_env key (token_env,
// key_env, api_key_env) may be the secret itself, written there by mistake.
func ConventionalEnvName(name string) bool {
	if name == "" || (name[0] >= '0' && name[0] <= '9') {
		return false
	}
	hex := true
	for _, c := range []byte(name) {
		switch {
		case c >= 'A' && c <= 'F', c >= '0' && c <= '9':
		case c >= 'G' && c <= 'Z', c == '_':
			hex = false
		default:
			return false
		}
	}
	return !hex || len(name) < 16
}

// checkBaseURL says what is wrong with a base_url ("" if nothing), quoting
// it without a password or query. A runtime adapter appends its request
// path to base_url, so a query or fragment would end up before the path
// (.../v1?key=k/chat/...): a key goes in api_key_env. A provider's client
// keeps a query (withQuery) but no fragment.
func checkBaseURL(s string, withQuery bool) string {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Sprintf("base_url %q must be an http(s) URL such as http://127.0.0.1:11434", RedactBaseURL(s))
	}
	if strings.Contains(s, "#") {
		return fmt.Sprintf("base_url %q has a fragment, which requests to it would not carry: drop it", RedactBaseURL(s))
	}
	if !withQuery && (u.RawQuery != "" || u.ForceQuery) {
		return fmt.Sprintf("base_url %q has a query, which requests to it would not carry (their path is appended): "+
			"drop it (an API key goes in api_key_env; a provider keeps a query such as Azure's api-version)", RedactBaseURL(s))
	}
	return ""
}

// checkHistoryBytes refuses a max_history_bytes out of range, or set on an
// adapter type known to keep no chat history (a CLI agent's session is the
// agent's own; an exec target has none). A type the edge does not know is
// the node's to check.
func checkHistoryBytes(a AdapterConfig) error {
	n := a.MaxHistoryBytes
	if n == 0 {
		return nil
	}
	switch a.Type {
	case AdapterExec, AdapterClaudeCode, AdapterCodex, AdapterGemini:
		return Errorf(CodeConfigError, "adapter %q (%s) replays no chat history: max_history_bytes applies to ollama and openai adapters only", a.Name, a.Type)
	}
	return CheckMaxHistoryBytes(a.Name, n)
}

// CheckMaxHistoryBytes refuses a max_history_bytes (n, of adapter name)
// outside [MinMaxHistoryBytes, MaxMaxHistoryBytes]; 0, the default, passes.
// Errors are ErrConfig.
func CheckMaxHistoryBytes(name string, n int) error {
	if n != 0 && (n < MinMaxHistoryBytes || n > MaxMaxHistoryBytes) {
		return Errorf(CodeConfigError, "adapter %q: max_history_bytes %d is outside [%d, %d] (1 KiB to 64 MiB; leave it unset for the default, 1 MiB)", name, n, MinMaxHistoryBytes, MaxMaxHistoryBytes)
	}
	return nil
}

// checkEnv refuses variable names a process environment cannot hold.
func checkEnv(env map[string]string, inherit []string) *Error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return Errorf(CodeConfigError, "env has an invalid variable name %s", quoteEnvName(k))
		}
		if strings.ContainsRune(v, 0) {
			// No process can be given it: every run would fail.
			return Errorf(CodeConfigError, "env %s holds a NUL byte", k)
		}
	}
	for _, k := range inherit {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return Errorf(CodeConfigError, "inherit_env has an invalid variable name %s", quoteEnvName(k))
		}
	}
	return nil
}

// quoteEnvName quotes a refused variable name for an error only up to its
// first '=' or NUL: "KEY=VALUE" written where a name goes (inherit_env:
// ["OPENAI_API_KEY=sk-…"]) holds a value, maybe a secret, and the message
// reaches stderr, the edge's log and the reload API's answer.
func quoteEnvName(k string) string {
	i := strings.IndexAny(k, "=\x00")
	if i < 0 {
		return strconv.Quote(k)
	}
	return strconv.Quote(k[:i]+"…") + " (a name holds no '=' or NUL; what follows is not shown)"
}

// Capabilities is what a runtime adapter instance offers.
type Capabilities struct {
	MaxConcurrency int
	Sessions       bool
	Commands       []string // node command names it serves, e.g. "ollama.pull"
}

// AdapterStatus describes one adapter instance on a live node.
type AdapterStatus struct {
	Name           string
	Type           string
	MaxConcurrency int
	InFlight       int
	Sessions       bool
}

// NodeInfo is what a node says about itself when it registers.
type NodeInfo struct {
	Version  string
	Hostname string
	OS       string
	Arch     string
	// Peer is what the edge's transport verified about the connection,
	// unlike the fields above, which the node reports about itself.
	Peer PeerIdentity
	// AdapterTypes are the runtime adapter types the node can build; empty
	// when the node did not say (an older node).
	AdapterTypes []string
}

// CheckAdapterTypes refuses a config with an adapter type the node does not
// support (config_error). A node that reported no types is not checked
// here; it reports what it cannot build when it applies the config.
func (c NodeConfig) CheckAdapterTypes(info NodeInfo) error {
	if len(info.AdapterTypes) == 0 {
		return nil
	}
	for _, a := range c.Adapters {
		if !slices.Contains(info.AdapterTypes, a.Type) {
			return Errorf(CodeConfigError, "adapter %q has type %q, which node %q does not support (it supports: %s)",
				a.Name, a.Type, c.NodeID, strings.Join(info.AdapterTypes, ", "))
		}
	}
	return nil
}

// NodeStats is what a node reports about itself periodically over its link,
// for the edge's metrics (a node has no inbound port to scrape).
type NodeStats struct {
	Adapters       []AdapterSlots
	ChildProcesses int   // processes the node's adapters are running
	StoreBytes     int64 // size of the node's run store on disk; 0 if unknown
	Providers      []ProviderLatency
}

// AdapterSlots is one adapter's concurrency use on its node.
type AdapterSlots struct {
	Name     string
	Max      int // max_concurrency; 0 for an adapter a reload removed whose runs go on
	InFlight int
}

// ProviderLatency sums the time a node's provider took to answer (to its
// first response byte) since the node started.
type ProviderLatency struct {
	Name    string
	Count   int64
	Seconds float64
}
