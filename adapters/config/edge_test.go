package config_test

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"iop/adapters/config"
	"iop/domain"
)

const fullEdge = `
transport:
  listen: "127.0.0.1:7700"
  heartbeat_interval: 10s
  heartbeat_timeout: 25s
  max_frame_size: 1048576
http:
  listen: "0.0.0.0:7701"
  api_keys:
    - {name: ci, key_sha256: "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08", scopes: [read, runs], nodes: [local]}
    - {name: ops, key_env: IOP_TEST_OPS_KEY, scopes: [admin]}
  tls: {cert_file: /etc/iop/api.crt, key_file: /etc/iop/api.key}
  max_connections: 1000
  max_connections_per_address: 50
log:
  level: debug
  format: json
nodes:
  - id: local
    token: dev-token
    adapters:
      - name: exec
        type: exec
        max_concurrency: 2
        timeout: 1m
        targets:
          upper: {command: ["tr", "a-z", "A-Z"], timeout: 30s, dir: "/tmp", env: {K: V}, inherit_env: [HF_TOKEN]}
      - name: llm
        type: ollama
        base_url: http://127.0.0.1:11434
        path_prefix: ""
        api_key_env: ""
        models: [llama3.2]
        command: ""
        args: []
        work_dir: ""
      - name: agent
        type: claude-code
        command: claude
        args: ["--verbose"]
        work_dir: /srv/work
        env: {ANTHROPIC_BASE_URL: "http://127.0.0.1:9"}
        inherit_env: [ANTHROPIC_API_KEY]
    providers:
      - {name: local-ollama, type: ollama, base_url: "http://127.0.0.1:11434", path_prefix: "", api_key_env: "", models: [llama3.2]}
      - {name: vllm, type: openai, base_url: "http://gpu:8000", path_prefix: /openai, api_key_env: VLLM_KEY}
  - id: gpu-1.east_2
    token_env: IOP_TEST_GPU_TOKEN
`

func TestParseEdgeFull(t *testing.T) {
	t.Setenv("IOP_TEST_GPU_TOKEN", "gpu-secret-token")
	t.Setenv("IOP_TEST_OPS_KEY", "ops-key-0123456789")
	c, err := config.ParseEdge("edge.yaml", []byte(fullEdge))
	if err != nil {
		t.Fatalf("ParseEdge: %v", err)
	}
	if got, want := c.Transport, (config.TransportConfig{
		Listen:            "127.0.0.1:7700",
		HeartbeatInterval: config.Duration(10 * time.Second),
		HeartbeatTimeout:  config.Duration(25 * time.Second),
		MaxFrameSize:      1 << 20,
		TLS:               config.LinkTLS{Mode: config.TLSAuto},
	}); !reflect.DeepEqual(got, want) {
		t.Errorf("transport = %+v, want %+v", got, want)
	}
	if c.HTTP.Listen != "0.0.0.0:7701" {
		t.Errorf("http.listen = %q", c.HTTP.Listen)
	}
	if c.HTTP.TLS == nil || *c.HTTP.TLS != (config.HTTPTLSConfig{CertFile: "/etc/iop/api.crt", KeyFile: "/etc/iop/api.key"}) {
		t.Errorf("http.tls = %+v", c.HTTP.TLS)
	}
	if c.HTTP.MaxConnections != 1000 || c.HTTP.MaxConnectionsPerAddress != 50 {
		t.Errorf("http.max_connections = %d, max_connections_per_address = %d", c.HTTP.MaxConnections, c.HTTP.MaxConnectionsPerAddress)
	}
	keys := c.HTTP.ResolvedKeys()
	wantKeys := []config.APIKey{
		{SHA256: sha256.Sum256([]byte("test")), Principal: domain.Principal{Name: "ci", Scopes: []string{"read", "runs"}, Nodes: []string{"local"}}},
		{SHA256: sha256.Sum256([]byte("ops-key-0123456789")), Principal: domain.Principal{Name: "ops", Scopes: []string{"admin"}}},
	}
	if !reflect.DeepEqual(keys, wantKeys) {
		t.Errorf("ResolvedKeys() =\n%+v\nwant\n%+v", keys, wantKeys)
	}
	if c.Log != (config.LogConfig{Level: "debug", Format: "json"}) || c.Log.SlogLevel() != slog.LevelDebug {
		t.Errorf("log = %+v", c.Log)
	}

	want := []domain.NodeRecord{
		{
			ID:    "local",
			Token: "dev-token",
			Adapters: []domain.AdapterConfig{
				{
					Name: "exec", Type: "exec", MaxConcurrency: 2, Timeout: time.Minute,
					Targets: map[string]domain.ExecTarget{
						"upper": {Command: []string{"tr", "a-z", "A-Z"}, Timeout: 30 * time.Second, Dir: "/tmp", Env: map[string]string{"K": "V"}, InheritEnv: []string{"HF_TOKEN"}},
					},
				},
				{Name: "llm", Type: "ollama", BaseURL: "http://127.0.0.1:11434", Models: []string{"llama3.2"}, Args: []string{}},
				{Name: "agent", Type: "claude-code", Command: "claude", Args: []string{"--verbose"}, WorkDir: "/srv/work",
					Env: map[string]string{"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}, InheritEnv: []string{"ANTHROPIC_API_KEY"}},
			},
			Providers: []domain.ProviderConfig{
				{Name: "local-ollama", Type: "ollama", BaseURL: "http://127.0.0.1:11434", Models: []string{"llama3.2"}},
				{Name: "vllm", Type: "openai", BaseURL: "http://gpu:8000", PathPrefix: "/openai", APIKeyEnv: "VLLM_KEY"},
			},
		},
		{ID: "gpu-1.east_2", Token: "gpu-secret-token"},
	}
	got := c.Records()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Records() =\n%#v\nwant\n%#v", got, want)
	}
	for _, r := range got {
		if _, err := r.BuildConfig(1); err != nil {
			t.Errorf("BuildConfig(%s): %v", r.ID, err)
		}
	}

	// The records share nothing with the config.
	got[0].Adapters[0].Targets["upper"].Env["K"] = "changed"
	got[0].Adapters[0].Targets["upper"].Command[0] = "changed"
	got[0].Providers[0].Models[0] = "changed"
	if again := c.Records(); !reflect.DeepEqual(again, want) {
		t.Errorf("mutating Records() output changed the config:\n%#v", again)
	}
}

func TestParseEdgeDefaults(t *testing.T) {
	for name, doc := range map[string]string{
		"nodes only": "nodes:\n  - {id: a, token: aaaaaaaa}\n",
		"empty":      "",
		"comment":    "# nothing here\n",
		"null":       "~\n",
	} {
		t.Run(name, func(t *testing.T) {
			c, err := config.ParseEdge("edge.yaml", []byte(doc))
			if err != nil {
				t.Fatalf("ParseEdge: %v", err)
			}
			want := config.TransportConfig{
				Listen:            config.DefaultTransportListen,
				HeartbeatInterval: config.Duration(30 * time.Second),
				HeartbeatTimeout:  config.Duration(45 * time.Second),
				MaxFrameSize:      4 << 20,
				TLS:               config.LinkTLS{Mode: config.TLSAuto},
			}
			if !reflect.DeepEqual(c.Transport, want) {
				t.Errorf("transport = %+v, want %+v", c.Transport, want)
			}
			if c.HTTP.Listen != "127.0.0.1:7701" {
				t.Errorf("http.listen = %q", c.HTTP.Listen)
			}
			if c.HTTP.MaxConnections != 8192 || c.HTTP.MaxConnectionsPerAddress != 256 {
				t.Errorf("http.max_connections = %d, max_connections_per_address = %d; want 8192 and 256",
					c.HTTP.MaxConnections, c.HTTP.MaxConnectionsPerAddress)
			}
			if c.Log != (config.LogConfig{Level: "info", Format: "text"}) {
				t.Errorf("log = %+v", c.Log)
			}
		})
	}
}

func TestParseEdgeYAMLErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string // substrings, in order
	}{
		{
			name: "unknown field names file and line",
			doc: `transport:
  listen: "127.0.0.1:7700"
http:
  listen: "127.0.0.1:7701"
nodes:
  - id: local
    tokn: dev-token
`,
			want: []string{"edge.yaml: line 7: unknown key \"nodes[0].tokn\""},
		},
		{
			name: "unknown top-level field",
			doc:  "transprt:\n  listen: x\n",
			want: []string{"edge.yaml: line 1: unknown key \"transprt\""},
		},
		{
			name: "unknown field in exec target",
			doc:  "nodes:\n  - id: a\n    token: aaaaaaaa\n    adapters:\n      - name: e\n        type: exec\n        targets:\n          t: {command: [x], tiemout: 1s}\n",
			want: []string{"edge.yaml: line 8: unknown key \"nodes[0].adapters[0].targets.t.tiemout\""},
		},
		{
			name: "bad duration",
			doc:  "transport:\n  heartbeat_interval: 30 seconds\n",
			want: []string{"edge.yaml: line 2: transport.heartbeat_interval: invalid duration \"30 seconds\""},
		},
		{
			name: "duration without unit",
			doc:  "transport:\n  heartbeat_timeout: 45\n",
			want: []string{"edge.yaml: line 2: transport.heartbeat_timeout: invalid duration \"45\""},
		},
		{
			name: "duration as a list",
			doc:  "transport:\n  heartbeat_timeout: [1s]\n",
			want: []string{"edge.yaml: line 2: transport.heartbeat_timeout: a duration must be a string"},
		},
		{
			name: "wrong type",
			doc:  "transport:\n  max_frame_size: big\n",
			want: []string{"edge.yaml: line 2: transport.max_frame_size: expected a whole number, got a string \"big\""},
		},
		{
			name: "several errors each on its own line",
			doc:  "transport:\n  listn: x\n  heartbeat_interval: soon\n",
			want: []string{"edge.yaml: line 2: unknown key \"transport.listn\"", "\nedge.yaml: line 3: transport.heartbeat_interval: invalid duration \"soon\""},
		},
		{
			name: "syntax error",
			doc:  "nodes:\n  - id: a\n   token: b\n",
			want: []string{"edge.yaml: line ", "did not find expected"},
		},
		{
			name: "duplicate key",
			doc:  "http:\n  listen: a:1\n  listen: b:2\n",
			want: []string{"edge.yaml: line 3:", "already defined"},
		},
		{
			name: "second document",
			doc:  "log: {level: info}\n---\nlog: {level: debug}\n",
			want: []string{"edge.yaml: line 2: a second YAML document is not allowed"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.ParseEdge("edge.yaml", []byte(tt.doc))
			if err == nil {
				t.Fatal("ParseEdge succeeded, want an error")
			}
			assertContainsInOrder(t, err.Error(), tt.want)
			if strings.Contains(err.Error(), "yaml: unmarshal errors") {
				t.Errorf("error keeps yaml's preamble: %q", err)
			}
		})
	}
}

func TestParseEdgeTrailingSeparator(t *testing.T) {
	if _, err := config.ParseEdge("edge.yaml", []byte("log: {level: warn}\n---\n")); err != nil {
		t.Fatalf("a trailing empty document should be accepted: %v", err)
	}
}

func TestEdgeValidate(t *testing.T) {
	t.Setenv("IOP_TEST_EMPTY", "")
	t.Setenv("IOP_TEST_SHORT", "short")
	t.Setenv("IOP_TEST_DUP", "aaaaaaaa")
	t.Setenv("IOP_TEST_KEY", "key-0123456789abcdef")
	const h = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	keys := func(entries string) string { return "http:\n  api_keys:\n" + entries }
	node := func(extra string) string {
		return "nodes:\n" + extra
	}
	tests := []struct {
		name string
		doc  string
		want string
	}{
		{"transport listen without port", "transport: {listen: localhost}\n", `transport.listen "localhost" is not host:port: missing port in address`},
		{"transport listen bad port", "transport: {listen: \"127.0.0.1:http\"}\n", `transport.listen "127.0.0.1:http": port "http" is not a number`},
		{"transport listen port too large", "transport: {listen: \"127.0.0.1:70000\"}\n", `port "70000" is not a number from 0 to 65535`},
		{"http listen", "http: {listen: \"127.0.0.1\"}\n", `http.listen "127.0.0.1" is not host:port`},
		{"same listen", "transport: {listen: \":9000\"}\nhttp: {listen: \":9000\"}\n", `http.listen and transport.listen are both ":9000"`},
		{"metrics on the http listen", "http: {listen: \"127.0.0.1:9000\"}\nmetrics: {listen: \"127.0.0.1:9000\"}\n", `metrics.listen and http.listen are both "127.0.0.1:9000"; they need different ports`},
		{"metrics on the transport listen", "transport: {listen: \"127.0.0.1:9000\"}\nmetrics: {listen: \"127.0.0.1:9000\"}\n", `metrics.listen and transport.listen are both "127.0.0.1:9000"`},
		// Spelt differently, the same port on a host both bind: the second
		// listener failed the start as "in use by another process".
		{"metrics on all hosts, http on loopback", "http: {listen: \"127.0.0.1:9000\"}\nmetrics: {listen: \":9000\"}\n", `metrics.listen ":9000" and http.listen "127.0.0.1:9000" bind the same port on the same host`},
		{"localhost and 127.0.0.1", "transport: {listen: \"localhost:9000\"}\nhttp: {listen: \"127.0.0.1:9000\"}\n", `http.listen "127.0.0.1:9000" and transport.listen "localhost:9000" bind the same port`},
		{"IPv6 any and IPv4 any", "transport: {listen: \"[::]:9000\"}\nmetrics: {listen: \"0.0.0.0:9000\"}\n", `metrics.listen "0.0.0.0:9000" and transport.listen "[::]:9000" bind the same port`},
		{"interval not positive", "transport: {heartbeat_interval: -1s}\n", "transport.heartbeat_interval must be positive"},
		{"timeout equal to interval", "transport: {heartbeat_interval: 45s}\n", "transport.heartbeat_timeout (45s) must be greater than transport.heartbeat_interval (45s)"},
		{"timeout below interval", "transport: {heartbeat_interval: 10s, heartbeat_timeout: 5s}\n", "transport.heartbeat_timeout (5s) must be greater"},
		// Sent to nodes as 32-bit milliseconds: 720h would wrap to 6h57m.
		{"interval too long", "transport: {heartbeat_interval: 720h, heartbeat_timeout: 1200h}\n", "transport.heartbeat_interval 720h0m0s is outside [10ms, 24h0m0s] (nodes are told it in milliseconds"},
		{"timeout too long", "transport: {heartbeat_interval: 30s, heartbeat_timeout: 1200h}\n", "transport.heartbeat_timeout 1200h0m0s is outside [10ms, 24h0m0s]"},
		{"interval below a millisecond", "transport: {heartbeat_interval: 500us, heartbeat_timeout: 2s}\n", "transport.heartbeat_interval 500µs is outside [10ms, 24h0m0s]"},
		{"frame too small", "transport: {max_frame_size: 65535}\n", "transport.max_frame_size 65535 is outside [65536, 67108864]"},
		{"frame too large", "transport: {max_frame_size: 67108865}\n", "transport.max_frame_size 67108865 is outside"},
		{"log level", "log: {level: verbose}\n", `log.level "verbose" is not one of debug, info, warn, error`},
		{"log format", "log: {format: xml}\n", `log.format "xml" is not one of text, json`},
		{"missing id", node("  - {token: aaaaaaaa}\n"), "nodes[0]: id is required"},
		{"id with slash", node("  - {id: a/b, token: aaaaaaaa}\n"), `nodes[0]: id "a/b" may contain only letters`},
		{"id with space", node("  - {id: \"a b\", token: aaaaaaaa}\n"), `nodes[0]: id "a b" may contain only`},
		{"id too long", node("  - {id: " + strings.Repeat("n", 129) + ", token: aaaaaaaa}\n"), `nodes[0]: id is 129 bytes long, at most 128`},
		{"id dot dot", node("  - {id: \"..\", token: aaaaaaaa}\n"), `nodes[0]: id ".." is not allowed`},
		{"duplicate id", node("  - {id: a, token: aaaaaaaa}\n  - {id: a, token: bbbbbbbb}\n"), `nodes[1] (id "a"): id is already used by nodes[0]`},
		{"no token", node("  - {id: a}\n"), `nodes[0] (id "a"): one of token, token_env and token_sha256 is required`},
		{"token and token_env", node("  - {id: a, token: aaaaaaaa, token_env: X}\n"), `nodes[0] (id "a"): set only one of token and token_env`},
		{"token_env unset", node("  - {id: a, token_env: IOP_TEST_SURELY_UNSET}\n"), `nodes[0] (id "a"): token_env: environment variable IOP_TEST_SURELY_UNSET is unset or empty`},
		{"token_env empty", node("  - {id: a, token_env: IOP_TEST_EMPTY}\n"), `nodes[0] (id "a"): token_env: environment variable IOP_TEST_EMPTY is unset or empty`},
		{"short token", node("  - {id: a, token: short12}\n"), `nodes[0] (id "a"): token must be at least 8 characters`},
		{"short token from env", node("  - {id: a, token_env: IOP_TEST_SHORT}\n"), `nodes[0] (id "a"): token must be at least 8 characters`},
		{"duplicate token", node("  - {id: a, token: aaaaaaaa}\n  - {id: b, token: aaaaaaaa}\n"), `nodes[1] (id "b"): token is the same as the token of nodes[0]`},
		{"token_sha256 not hex", node("  - {id: a, token_sha256: xyz}\n"), `nodes[0] (id "a"): token_sha256 must be 64 hex digits`},
		{"token_sha256 too short", node("  - {id: a, token_sha256: abcd}\n"), `token_sha256 must be 64 hex digits`},
		{"token and token_sha256", node("  - {id: a, token: aaaaaaaa, token_sha256: " + config.TokenHash("x") + "}\n"), `nodes[0] (id "a"): set only one of token, token_env and token_sha256`},
		{"duplicate token via sha256", node("  - {id: a, token: aaaaaaaa}\n  - {id: b, token_sha256: " + config.TokenHash("aaaaaaaa") + "}\n"), `nodes[1] (id "b"): token is the same as the token of nodes[0]`},
		{"tls mode unknown", "transport: {tls: {mode: on}}\n", `transport.tls.mode "on" is not one of auto, files, off`},
		{"tls off on all interfaces", "transport: {listen: \":7700\", tls: {mode: off}}\n", `transport.tls.mode off sends node tokens and all run data in clear; it is allowed only when transport.listen is a loopback address, and ":7700" is not`},
		{"tls off on a public address", "transport: {listen: \"203.0.113.5:7700\", tls: {mode: off}}\n", `allowed only when transport.listen is a loopback address`},
		{"tls files without key", "transport: {tls: {mode: files, cert_file: a.pem}}\n", "transport.tls.mode files needs both cert_file and key_file"},
		{"tls auto with files", "transport: {tls: {cert_file: a.pem, key_file: a.key}}\n", "cert_file and key_file are used only with mode: files"},
		{"tls bind without client ca", "transport: {tls: {bind_node_identity: true}}\n", "bind_node_identity needs client_ca_file"},
		{"tls off with client ca", "transport: {tls: {mode: off, client_ca_file: ca.pem}}\n", "need TLS (mode is off)"},
		{"tls bad host", "transport: {tls: {hosts: [\"not a host\"]}}\n", `transport.tls.hosts: "not a host" is neither an IP address nor a DNS name`},
		{"duplicate token via env", node("  - {id: a, token: aaaaaaaa}\n  - {id: b, token_env: IOP_TEST_DUP}\n"), `nodes[1] (id "b"): token is the same as the token of nodes[0]`},
		{"public listen without keys", "http: {listen: \"0.0.0.0:7701\"}\n", `http.listen "0.0.0.0:7701" is not a loopback address and http.api_keys is empty`},
		{"all interfaces without keys", "http: {listen: \":7701\"}\n", `http.listen ":7701" is not a loopback address`},
		{"key without name", keys("    - {key_sha256: " + h + ", scopes: [read]}\n"), "http.api_keys[0]: name is required"},
		{"key name too long", keys("    - {name: " + strings.Repeat("k", 129) + ", key_sha256: " + h + ", scopes: [read]}\n"), "http.api_keys[0]: name is 129 bytes long, at most 128"},
		{"key named anonymous", keys("    - {name: anonymous, key_sha256: " + h + ", scopes: [read]}\n"), `must not be "anonymous"`},
		{"key without scopes", keys("    - {name: a, key_sha256: " + h + "}\n"), `http.api_keys[0] (name "a"): scopes is required`},
		{"unknown scope", keys("    - {name: a, key_sha256: " + h + ", scopes: [write]}\n"), `unknown scope "write" (known: read, runs, inference, admin)`},
		{"no key", keys("    - {name: a, scopes: [read]}\n"), "one of key_sha256 and key_env is required"},
		{"both keys", keys("    - {name: a, key_sha256: " + h + ", key_env: IOP_TEST_KEY, scopes: [read]}\n"), "set only one of key_sha256 and key_env"},
		{"bad hash", keys("    - {name: a, key_sha256: abc, scopes: [read]}\n"), "key_sha256 must be 64 hex digits"},
		{"key_env unset", keys("    - {name: a, key_env: IOP_TEST_SURELY_UNSET, scopes: [read]}\n"), "key_env: environment variable IOP_TEST_SURELY_UNSET is unset or empty"},
		{"key_env short", keys("    - {name: a, key_env: IOP_TEST_SHORT, scopes: [read]}\n"), "must be at least 16 characters"},
		{"duplicate key name", keys("    - {name: a, key_sha256: " + h + ", scopes: [read]}\n    - {name: a, key_env: IOP_TEST_KEY, scopes: [read]}\n"), `http.api_keys[1] (name "a"): name is already used by http.api_keys[0]`},
		{"duplicate key", keys("    - {name: a, key_env: IOP_TEST_KEY, scopes: [read]}\n    - {name: b, key_env: IOP_TEST_KEY, scopes: [read]}\n"), "the key is the same as the key of http.api_keys[0]"},
		{"empty node limit", keys("    - {name: a, key_sha256: " + h + ", scopes: [read], nodes: []}\n"), `http.api_keys[0] (name "a"): nodes is empty, which would give the key every node`},
		{"bad node limit", keys("    - {name: a, key_sha256: " + h + ", scopes: [read], nodes: [\"a/b\"]}\n"), `nodes: "a/b" is not a node id`},
		{"tls half", "http: {tls: {cert_file: /x}}\n", "http.tls needs both cert_file and key_file"},
		{"http max connections", "http: {max_connections: -1}\n", "http.max_connections must be positive, got -1"},
		{"http per address over total", "http: {max_connections: 10, max_connections_per_address: 11}\n", "http.max_connections_per_address 11 is outside [1, http.max_connections (10)]"},
		// Sent to nodes in whole milliseconds: 500µs would arrive as 0, no timeout.
		{"adapter timeout below a millisecond", node("  - id: n\n    token: aaaaaaaa\n    adapters:\n      - {name: l, type: ollama, base_url: \"http://127.0.0.1:1\", timeout: 500us}\n"),
			`adapter "l": timeout 500µs is under the 1ms timeouts are counted in`},
		{"target timeout below a millisecond", node("  - id: n\n    token: aaaaaaaa\n    adapters:\n      - {name: sh, type: exec, targets: {t: {command: [x], timeout: 999us}}}\n"),
			`adapter "sh" target "t": timeout 999µs is under the 1ms timeouts are counted in`},
		{"http per address negative", "http: {max_connections_per_address: -1}\n", "http.max_connections_per_address -1 is outside [1, http.max_connections (8192)]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.ParseEdge("edge.yaml", []byte(tt.doc))
			if err == nil {
				t.Fatalf("ParseEdge succeeded, want error containing %q", tt.want)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "edge.yaml: ") {
				t.Errorf("error %q does not start with the file name", msg)
			}
			if !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not contain %q", msg, tt.want)
			}
			for _, secret := range []string{"aaaaaaaa", "bbbbbbbb", "short12", "short\n", "short;", "key-0123456789abcdef"} {
				if strings.Contains(msg, secret) {
					t.Errorf("error %q reveals a token", msg)
				}
			}
		})
	}
}

func TestEdgeValidateReportsEveryProblem(t *testing.T) {
	doc := "log: {level: loud, format: xml}\nnodes:\n  - {id: \"\", token: aaaaaaaa}\n  - {id: b}\n"
	_, err := config.ParseEdge("edge.yaml", []byte(doc))
	if err == nil {
		t.Fatal("want an error")
	}
	want := []string{
		`edge.yaml: line 1: log.level "loud" is not one of debug, info, warn, error`,
		`edge.yaml: line 1: log.format "xml" is not one of text, json`,
		`edge.yaml: line 3: nodes[0]: id is required`,
		`edge.yaml: line 4: nodes[1] (id "b"): one of token, token_env and token_sha256 is required`,
	}
	if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("error lines =\n%q\nwant\n%q", got, want)
	}
}

func TestEdgeAllowsEphemeralPortsAndNoNodes(t *testing.T) {
	c, err := config.ParseEdge("edge.yaml", []byte("transport: {listen: \"127.0.0.1:0\"}\nhttp: {listen: \"127.0.0.1:0\"}\n"))
	if err != nil {
		t.Fatalf("ParseEdge: %v", err)
	}
	if len(c.Records()) != 0 {
		t.Errorf("Records() = %v, want none", c.Records())
	}
}

// An adapter type the edge has never heard of loads and builds: whether
// the node supports it is checked against what the node reports when it
// registers (config_error then), so a new type needs no edge upgrade.
func TestUnknownAdapterTypeLoads(t *testing.T) {
	doc := "nodes:\n  - id: a\n    token: aaaaaaaa\n    adapters:\n      - {name: x, type: telepathy}\n"
	c, err := config.ParseEdge("edge.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("ParseEdge: %v", err)
	}
	recs := c.Records()
	cfg, err := recs[0].BuildConfig(1)
	if err != nil {
		t.Fatalf("BuildConfig err = %v", err)
	}
	if err := cfg.CheckAdapterTypes(domain.NodeInfo{AdapterTypes: []string{"exec"}}); !errors.Is(err, domain.ErrConfig) {
		t.Fatalf("CheckAdapterTypes err = %v, want ErrConfig", err)
	}
}

func TestLoadEdge(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(path, []byte("nodes:\n  - {id: a, token: aaaaaaaa}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.LoadEdge(path)
	if err != nil {
		t.Fatalf("LoadEdge: %v", err)
	}
	if len(c.Nodes) != 1 || c.Nodes[0].ID != "a" {
		t.Errorf("nodes = %+v", c.Nodes)
	}

	if err := os.WriteFile(path, []byte("nodes:\n  - {id: a, tokn: aaaaaaaa}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = config.LoadEdge(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+": line 2: unknown key \"nodes[0].tokn\"") {
		t.Errorf("LoadEdge error = %v, want it to start with the path and line", err)
	}

	_, err = config.LoadEdge(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadEdge(missing) = %v, want ErrNotExist", err)
	}
}

// The repository's sample config must always load.
func TestRepoEdgeConfig(t *testing.T) {
	path := filepath.Join("..", "..", "configs", "edge.yaml")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		t.Skip("configs/edge.yaml does not exist yet")
	}
	c, err := config.LoadEdge(path)
	if err != nil {
		t.Fatalf("LoadEdge: %v", err)
	}
	for _, r := range c.Records() {
		if _, err := r.BuildConfig(1); err != nil {
			t.Errorf("node %s: BuildConfig: %v", r.ID, err)
		}
	}
}

func TestSecretIsNeverPrinted(t *testing.T) {
	const tok = "super-secret-token"
	c, err := config.ParseEdge("edge.yaml", []byte("nodes:\n  - {id: a, token: "+tok+"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var logged strings.Builder
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("cfg", "config", c, "token", c.Nodes[0].Token)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("cfg", "node", c.Nodes[0], "token", c.Nodes[0].Token)
	outputs := []string{
		fmt.Sprintf("%v %+v %#v %s %q %x %d", c, c, c, c.Nodes[0].Token, c.Nodes[0].Token, c.Nodes[0].Token, c.Nodes[0].Token),
		fmt.Sprint(*c, c.Nodes[0]),
		string(js),
		logged.String(),
	}
	for _, out := range outputs {
		if strings.Contains(out, tok) {
			t.Errorf("output reveals the token: %s", out)
		}
	}
	if !strings.Contains(outputs[0], "[redacted]") {
		t.Errorf("expected a redaction marker in %s", outputs[0])
	}
	if got := string(c.Nodes[0].Token); got != tok {
		t.Errorf("string(Token) = %q, want the value", got)
	}
}

func assertContainsInOrder(t *testing.T, s string, parts []string) {
	t.Helper()
	rest := s
	for _, p := range parts {
		i := strings.Index(rest, p)
		if i < 0 {
			t.Errorf("error %q does not contain %q (in order)", s, p)
			return
		}
		rest = rest[i+len(p):]
	}
}

func TestPublicListenAllowedWithKeysOrExplicitOptOut(t *testing.T) {
	for _, doc := range []string{
		"http: {listen: \"0.0.0.0:7701\", allow_unauthenticated: true}\n",
		"http: {listen: \"0.0.0.0:7701\", api_keys: [{name: a, key_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, scopes: [read]}]}\n",
		"http: {listen: \"[::1]:7701\"}\n",
		"http: {listen: \"localhost:7701\"}\n",
		"http: {listen: \"127.0.0.2:7701\"}\n",
	} {
		if _, err := config.ParseEdge("edge.yaml", []byte(doc)); err != nil {
			t.Errorf("%s: %v", doc, err)
		}
	}
}

// No Go type names reach the user; a tab-indented file gets a line number
// and the reason.
func TestYAMLErrorsInTheFilesTerms(t *testing.T) {
	for in, want := range map[string]string{
		"nodes: 5\n":                         `edge.yaml: line 1: nodes: expected a list, got a number`,
		"nodes:\n  - id: [1]\n":              `edge.yaml: line 2: nodes[0].id: expected a string, got a list`,
		"\ttransport:\n\t\tlisten: x\n":      `edge.yaml: line 1: found character that cannot start any token (YAML is indented with spaces, not tabs)`,
		"transport:\n\tlisten: x\n":          `edge.yaml: line 2: found character that cannot start any token (YAML is indented with spaces, not tabs)`,
		"nodes:\n- id: a\n\ttoken: x\n":      `(YAML is indented with spaces, not tabs; the first tab is on line 3)`,
		"transport:\n  listen: {a: 1}\n":     `edge.yaml: line 2: transport.listen: expected a string, got a mapping`,
		"http:\n  listen: x\n  nope: true\n": `edge.yaml: line 3: unknown key "http.nope"`,
	} {
		_, err := config.ParseEdge("edge.yaml", []byte(in))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "config.") || strings.Contains(err.Error(), "Go ") {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
}

// A secret written where a list or mapping belongs (the key itself as an
// api_keys item, a token as a node) is not quoted in the error, which
// reaches stderr, the log and a reload's answer: yaml.v3 quoted up to 10
// characters of it, the whole of a short token.
func TestYAMLTypeErrorsDoNotQuoteASecretInPlaceOfAnEntry(t *testing.T) {
	for in, want := range map[string]string{
		"http:\n  api_keys:\n    - sk-live-0123456789abcdef\n": "line 3: http.api_keys[0]: expected a mapping, got a string",
		"http:\n  api_keys: sk-live-0123456789abcdef\n":        "line 2: http.api_keys: expected a list, got a string",
		"nodes:\n  - s3cr3t-tok\n":                             "line 2: nodes[0]: expected a mapping, got a string",
		"nodes:\n  - 1234567890\n":                             "line 2: nodes[0]: expected a mapping, got a number",
	} {
		_, err := config.ParseEdge("edge.yaml", []byte(in))
		if err == nil || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("%q: error %v, want one ending %q", in, err, want)
		}
		for _, secret := range []string{"sk-live", "s3cr3t", "1234567"} {
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Errorf("%q: error %v shows the secret", in, err)
			}
		}
	}
	// A scalar setting keeps its value in the message: no secret goes there.
	_, err := config.ParseEdge("edge.yaml", []byte("transport: {max_frame_size: big}\n"))
	if err == nil || !strings.Contains(err.Error(), `got a string "big"`) {
		t.Errorf("max_frame_size: big: error %v, want the value quoted", err)
	}
}

// A total below the per-address default, given alone, is also the
// per-address cap: the edge does not refuse a setting the user never wrote.
func TestMaxConnectionsAloneBoundsThePerAddressDefault(t *testing.T) {
	c, err := config.ParseEdge("edge.yaml", []byte("http: {max_connections: 100}\n"))
	if err != nil {
		t.Fatalf("max_connections: 100 alone refused: %v", err)
	}
	if c.HTTP.MaxConnections != 100 || c.HTTP.MaxConnectionsPerAddress != 100 {
		t.Fatalf("caps %d / %d per address, want 100 / 100", c.HTTP.MaxConnections, c.HTTP.MaxConnectionsPerAddress)
	}
	if _, err := config.ParseEdge("edge.yaml", []byte("http: {max_connections: 100, max_connections_per_address: 200}\n")); err == nil ||
		!strings.Contains(err.Error(), "max_connections_per_address 200") {
		t.Fatalf("a per-address cap above the total: %v", err)
	}
}

// max_history_bytes reaches the adapter's config; out of range (1 KiB to
// 64 MiB), or on an adapter that replays no chat history, the file is
// refused (at start and at reload alike) naming it.
func TestAdapterMaxHistoryBytes(t *testing.T) {
	parse := func(adapter string) domain.NodeRecord {
		t.Helper()
		c, err := config.ParseEdge("edge.yaml", []byte("nodes:\n  - id: a\n    token: aaaaaaaa\n    adapters:\n      - "+adapter+"\n"))
		if err != nil {
			t.Fatalf("ParseEdge(%s): %v", adapter, err)
		}
		return c.Records()[0]
	}
	cfg, err := parse("{name: llm, type: openai, base_url: \"http://127.0.0.1:8000\", max_history_bytes: 4194304}").BuildConfig(1)
	if err != nil || cfg.Adapters[0].MaxHistoryBytes != 4<<20 {
		t.Fatalf("BuildConfig = %+v, %v; want max_history_bytes 4194304", cfg.Adapters, err)
	}
	cfg, err = parse("{name: llm, type: ollama, base_url: \"http://127.0.0.1:11434\"}").BuildConfig(1)
	if err != nil || cfg.Adapters[0].MaxHistoryBytes != 0 {
		t.Fatalf("unset: BuildConfig = %+v, %v; want 0 (the node's default)", cfg.Adapters, err)
	}
	for _, bad := range []string{
		"{name: llm, type: ollama, base_url: \"http://127.0.0.1:11434\", max_history_bytes: -1}",
		"{name: llm, type: ollama, base_url: \"http://127.0.0.1:11434\", max_history_bytes: 512}",
		"{name: llm, type: openai, base_url: \"http://127.0.0.1:8000\", max_history_bytes: 67108865}",
		"{name: sh, type: exec, max_history_bytes: 4096}",
		"{name: cc, type: claude-code, max_history_bytes: 4096}",
	} {
		_, err := config.ParseEdge("edge.yaml", []byte("nodes:\n  - id: a\n    token: aaaaaaaa\n    adapters:\n      - "+bad+"\n"))
		if err == nil || !strings.Contains(err.Error(), `edge.yaml: line 5: nodes[0] (id "a"): adapter`) || !strings.Contains(err.Error(), "max_history_bytes") {
			t.Errorf("%s: ParseEdge = %v, want an error naming the node and max_history_bytes", bad, err)
		}
	}
	if _, err := config.ParseEdge("edge.yaml", []byte("nodes:\n  - id: a\n    token: aaaaaaaa\n    adapters:\n      - {name: llm, type: ollama, max_history_bytes: lots}\n")); err == nil {
		t.Error("max_history_bytes: lots parsed")
	}
}

// An adapter or provider entry a reload would refuse (domain.NodeRecord.
// BuildConfig) is refused when the file is loaded, so the edge does not
// start on it either: before, an adapter without a type started the edge
// and its node was refused config_error at every registration.
func TestBadAdapterEntryRefusedAtLoad(t *testing.T) {
	node := func(entries string) string {
		return "nodes:\n  - {id: ok, token: bbbbbbbb}\n  - id: gpu\n    token: aaaaaaaa\n" + entries
	}
	for _, tc := range []struct{ doc, want string }{
		{node("    adapters:\n      - {name: llm, base_url: \"http://127.0.0.1:11434\"}\n"),
			`line 6: nodes[1] (id "gpu"): adapter "llm" has no type`},
		{node("    adapters:\n      - {type: exec}\n"),
			`line 6: nodes[1] (id "gpu"): adapter #1 has no name`},
		{node("    adapters:\n      - {name: llm, type: ollama}\n      - {name: llm, type: exec}\n"),
			`line 6: nodes[1] (id "gpu"): adapter "llm" (ollama) has no base_url`},
		{node("    adapters:\n      - {name: x, type: exec}\n      - {name: x, type: exec}\n"),
			`line 7: nodes[1] (id "gpu"): adapter "x" is declared twice`},
		{node("    adapters:\n      - {name: llm, type: openai, base_url: \"127.0.0.1:8000\"}\n"),
			`line 6: nodes[1] (id "gpu"): adapter "llm" (openai): base_url "127.0.0.1:8000" must be an http(s) URL`},
		{node("    adapters:\n      - {name: sh, type: exec, targets: {t: {command: []}}}\n"),
			`line 6: nodes[1] (id "gpu"): adapter "sh" target "t" has an empty command`},
		{node("    adapters:\n      - {name: sh, type: exec, targets: {\"a\\tb\": {command: [x]}}}\n"),
			`line 6: nodes[1] (id "gpu"): adapter "sh" target "a\tb": its name has a control character (U+0009) at byte 1, so no run could name it`},
		{node("    adapters:\n      - {name: sh, type: exec, targets: {" + strings.Repeat("t", 257) + ": {command: [x]}}}\n"),
			`line 6: nodes[1] (id "gpu"): adapter "sh" target "` + strings.Repeat("t", 257) + `": its name is too long: 257 bytes, at most 256`},
		{node("    providers:\n      - {name: p, type: grpc, base_url: \"http://x\"}\n"),
			`line 6: nodes[1] (id "gpu"): provider "p" has unknown type "grpc"`},
		{node("    providers:\n      - {name: p, type: ollama, base_url: \"127.0.0.1:11434\"}\n"),
			`line 6: nodes[1] (id "gpu"): provider "p" (ollama): base_url "127.0.0.1:11434" must be an http(s) URL`},
		// A query (a key in it, often) is never quoted; an adapter's is
		// refused (requests append their path after it), a provider's
		// kept (Azure's api-version), a fragment refused alike.
		{node("    adapters:\n      - {name: llm, type: openai, base_url: \"https://g.example/v1beta/openai?key=AIzaSECRET\"}\n"),
			`line 6: nodes[1] (id "gpu"): adapter "llm" (openai): base_url "https://g.example/v1beta/openai?…" has a query`},
		{node("    providers:\n      - {name: p, type: openai, base_url: \"https://g.example/v1#AIzaSECRET\"}\n"),
			`line 6: nodes[1] (id "gpu"): provider "p" (openai): base_url "https://g.example/v1?…" has a fragment`},
		{node("    providers:\n      - {name: p, type: openai, base_url: \"g.example/v1beta/openai?key=AIzaSECRET\"}\n"),
			`line 6: nodes[1] (id "gpu"): provider "p" (openai): base_url "g.example/v1beta/openai?…" must be an http(s) URL`},
		{node("    adapters:\n      - {name: llm, type: openai, base_url: \"http://127.0.0.1:8000/v1#AIzaSECRET\"}\n"),
			`line 6: nodes[1] (id "gpu"): adapter "llm" (openai): base_url "http://127.0.0.1:8000/v1?…" has a fragment`},
		{node("    providers:\n      - {name: p, type: openai, base_url: \"ftp://x\"}\n"),
			`line 6: nodes[1] (id "gpu"): provider "p" (openai): base_url "ftp://x" must be an http(s) URL`},
		{node("    providers:\n      - {name: \"p q/r\", type: openai, base_url: \"http://x\"}\n"),
			`line 6: nodes[1] (id "gpu"): provider "p q/r": a name may contain only letters, digits, '.', '_' and '-'`},
		{node("    adapters:\n      - {name: \"my llm\", type: exec}\n"),
			`line 6: nodes[1] (id "gpu"): adapter "my llm": a name may contain only letters, digits, '.', '_' and '-'`},
		{node("    providers:\n      - {name: " + strings.Repeat("p", 129) + ", type: openai, base_url: \"http://x\"}\n"),
			`line 6: nodes[1] (id "gpu"): provider #1: its name is 129 bytes long, at most 128`},
	} {
		path := filepath.Join(t.TempDir(), "edge.yaml")
		if err := os.WriteFile(path, []byte(tc.doc), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := config.LoadEdge(path)
		if err == nil || !strings.Contains(err.Error(), path+": "+tc.want) {
			t.Errorf("LoadEdge(%q) = %v, want an error containing %q", tc.doc, err, path+": "+tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), "config_error") || strings.Contains(err.Error(), "nodes[0]") || strings.Contains(err.Error(), "SECRET")) {
			t.Errorf("LoadEdge(%q) = %v: names the code or the good node, or quotes a secret", tc.doc, err)
		}
	}
}

// The sample token of configs/edge.yaml is published: a node link that
// others can reach refuses it, whichever of token, token_env and
// token_sha256 gives it, naming the node and how to make a token; on a
// loopback link (make run) it still loads.
func TestSampleTokenRefusedOnAPublicLink(t *testing.T) {
	t.Setenv("IOP_TEST_SAMPLE", config.SampleNodeToken)
	for _, tok := range []string{
		"token: " + config.SampleNodeToken,
		"token_env: IOP_TEST_SAMPLE",
		"token_sha256: " + config.TokenHash(config.SampleNodeToken),
	} {
		nodes := "nodes:\n  - {id: ok, token: a-real-token-0123}\n  - {id: local, " + tok + "}\n"
		for _, listen := range []string{"0.0.0.0:7700", ":7700", "203.0.113.5:7700", "[::]:7700"} {
			_, err := config.ParseEdge("edge.yaml", []byte("transport: {listen: \""+listen+"\"}\n"+nodes))
			if err == nil {
				t.Fatalf("%s on %s: loaded", tok, listen)
			}
			msg := err.Error()
			for _, want := range []string{`nodes[1] (id "local"): the token is the sample token`, `transport.listen "` + listen + `" is not a loopback address`, "openssl rand -hex 32", "iop-edge hash-token", "iop-edge join local"} {
				if !strings.Contains(msg, want) {
					t.Errorf("%s on %s: error %q does not contain %q", tok, listen, msg, want)
				}
			}
			if !strings.HasPrefix(msg, "edge.yaml: line 4: ") {
				t.Errorf("error %q does not name the node's line", msg)
			}
			if strings.Contains(msg, config.SampleNodeToken) || strings.Contains(msg, "a-real-token") {
				t.Errorf("error %q shows a token", msg)
			}
		}
		for _, listen := range []string{"127.0.0.1:7700", "localhost:7700", "[::1]:7700"} {
			if _, err := config.ParseEdge("edge.yaml", []byte("transport: {listen: \""+listen+"\"}\n"+nodes)); err != nil {
				t.Errorf("%s on loopback %s: %v", tok, listen, err)
			}
		}
	}
	// The repository's own file, made to listen on all interfaces as
	// README "Adding a node on another machine" says.
	data, err := os.ReadFile(filepath.Join("..", "..", "configs", "edge.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	public := strings.Replace(string(data), `listen: "127.0.0.1:7700"`, `listen: "0.0.0.0:7700"`, 1)
	if public == string(data) {
		t.Fatal("configs/edge.yaml has no transport listen 127.0.0.1:7700")
	}
	if _, err := config.ParseEdge(filepath.Join(t.TempDir(), "edge.yaml"), []byte(public)); err == nil || !strings.Contains(err.Error(), `(id "local"): the token is the sample token`) {
		t.Errorf("configs/edge.yaml listening on 0.0.0.0: %v", err)
	}
}

// A refused base_url is quoted without its password.
func TestBadBaseURLErrorHidesThePassword(t *testing.T) {
	doc := "nodes:\n  - id: n\n    token: aaaaaaaa\n    adapters:\n      - {name: llm, type: ollama, base_url: \"ftp://ops:hunter2@gpu:11434\"}\n"
	_, err := config.ParseEdge("edge.yaml", []byte(doc))
	if err == nil || !strings.Contains(err.Error(), `base_url "ftp://ops:xxxxx@gpu:11434" must be an http(s) URL`) {
		t.Fatalf("ParseEdge: %v", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error shows the password: %v", err)
	}
}

// unsetEnv unsets the variables for the test and restores them after it.
func unsetEnv(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		t.Setenv(n, "") // registers the restore
		if err := os.Unsetenv(n); err != nil {
			t.Fatal(err)
		}
	}
}

// LoadEdgeShape checks a file whose key_env/token_env variables are unset
// (iop-edge join and --print-ca-pin run from a shell without the service's
// secrets); LoadEdge still refuses it. Every check that needs no secret
// stays, the sample-token check of a token or token_sha256 included.
func TestLoadEdgeShapeReadsNoSecret(t *testing.T) {
	unsetEnv(t, "IOP_SHAPE_KEY", "IOP_SHAPE_TOKEN_A", "IOP_SHAPE_TOKEN_B")
	dir := t.TempDir()
	write := func(doc string) string {
		path := filepath.Join(dir, "edge.yaml")
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const head = "transport: {listen: \"0.0.0.0:7700\"}\nhttp:\n  listen: \"0.0.0.0:8080\"\n  api_keys:\n    - {name: ci, key_env: IOP_SHAPE_KEY, scopes: [runs]}\n"
	path := write(head + "nodes:\n  - {id: a, token_env: IOP_SHAPE_TOKEN_A}\n  - {id: b, token_env: IOP_SHAPE_TOKEN_B}\n")
	c, err := config.LoadEdgeShape(path)
	if err != nil {
		t.Fatalf("LoadEdgeShape: %v", err)
	}
	if len(c.Nodes) != 2 || c.Nodes[1].TokenEnv != "IOP_SHAPE_TOKEN_B" || c.Transport.TLS.Mode != config.TLSAuto {
		t.Errorf("LoadEdgeShape = nodes %+v, tls mode %q", c.Nodes, c.Transport.TLS.Mode)
	}
	_, err = config.LoadEdge(path)
	for _, want := range []string{"IOP_SHAPE_KEY is unset or empty", "IOP_SHAPE_TOKEN_A is unset or empty", "IOP_SHAPE_TOKEN_B is unset or empty"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadEdge = %v, want it to say %q", err, want)
		}
	}

	for _, tc := range []struct{ nodes, want string }{
		{"  - {id: a, token: " + config.SampleNodeToken + "}\n", `(id "a"): the token is the sample token`},
		{"  - {id: a, token_sha256: " + config.TokenHash(config.SampleNodeToken) + "}\n", `(id "a"): the token is the sample token`},
		{"  - {id: a, token_env: IOP_SHAPE_TOKEN_A, token: aaaaaaaa}\n", "set only one of token and token_env"},
		{"  - {id: a, token_env: IOP_SHAPE_TOKEN_A, token_sha256: " + config.TokenHash("x") + "}\n", "set only one of token, token_env and token_sha256"},
		{"  - {id: a, token_env: IOP_SHAPE_TOKEN_A}\n  - {id: a, token_env: IOP_SHAPE_TOKEN_B}\n", "id is already used by nodes[0]"},
		{"  - {id: a}\n", "one of token, token_env and token_sha256 is required"},
	} {
		_, err := config.LoadEdgeShape(write(head + "nodes:\n" + tc.nodes))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadEdgeShape with nodes\n%s= %v, want %q", tc.nodes, err, tc.want)
		}
	}
	_, err = config.LoadEdgeShape(write("http:\n  api_keys:\n    - {name: ci, key_env: IOP_SHAPE_KEY, key_sha256: " + config.TokenHash("x") + ", scopes: [runs]}\n"))
	if err == nil || !strings.Contains(err.Error(), "set only one of key_sha256 and key_env") {
		t.Errorf("LoadEdgeShape with key_env and key_sha256 = %v", err)
	}
}

// A token or key pasted into token_env or key_env itself (the slip of
// writing the secret where its variable's name goes) is never quoted back:
// the message reaches stderr, the edge's log and the reload API's answer.
// A name of the usual shape is still named.
func TestEnvKeyHoldingTheSecretIsNotEchoed(t *testing.T) {
	secrets := []string{
		"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", // openssl rand -hex 32
		"sk-proj-Abc123_secretKEYvalue",
		"Zm9vYmFyYmF6cXV4cXV1eA==",
		"9F86D081884C7D659A2FEAA0C55AD015",     // upper-case hex
		"kJ8_3nXqLr2w9VtYhP0sBc4dEf6gHi7jKl1m", // mixed case, letters, digits, _
	}
	for _, s := range secrets {
		docs := map[string]string{
			"token_env": "nodes:\n  - {id: a, token_env: \"" + s + "\"}\n",
			"key_env":   "http:\n  api_keys:\n    - {name: a, key_env: \"" + s + "\", scopes: [read]}\nnodes:\n  - {id: a, token: aaaaaaaa}\n",
		}
		for key, doc := range docs {
			_, err := config.ParseEdge("edge.yaml", []byte(doc))
			if err == nil {
				t.Fatalf("%s %q: ParseEdge succeeded", key, s)
			}
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error quotes the value, which may be the secret: %v", key, err)
			}
			if !strings.Contains(err.Error(), key+": the environment variable it names is unset or empty") {
				t.Errorf("%s %q: error %v does not say the variable is unset", key, s, err)
			}
		}
	}
	for _, name := range []string{"IOP_TEST_SURELY_UNSET", "ABC", "X1"} {
		_, err := config.ParseEdge("edge.yaml", []byte("nodes:\n  - {id: a, token_env: "+name+"}\n"))
		if err == nil || !strings.Contains(err.Error(), "token_env: environment variable "+name+" is unset or empty") {
			t.Errorf("token_env %s: %v", name, err)
		}
	}
}

// "KEY=VALUE" written where a variable name goes (inherit_env, or env's
// keys) is refused without quoting the value, which may be a secret.
func TestEnvNameHoldingAValueIsNotEchoed(t *testing.T) {
	const secret = "sk-proj-not-for-the-log"
	docs := map[string]string{
		"adapter inherit_env": "      - {name: c, type: claude-code, inherit_env: [\"ANTHROPIC_API_KEY=" + secret + "\"]}\n",
		"adapter env":         "      - {name: c, type: claude-code, env: {\"ANTHROPIC_API_KEY=" + secret + "\": x}}\n",
		"target inherit_env":  "      - {name: e, type: exec, targets: {t: {command: [env], inherit_env: [\"OPENAI_API_KEY=" + secret + "\"]}}}\n",
		"target env NUL":      "      - {name: e, type: exec, targets: {t: {command: [env], env: {\"OPENAI_API_KEY\\0" + secret + "\": x}}}}\n",
	}
	for name, adapter := range docs {
		doc := "nodes:\n  - id: n\n    token: aaaaaaaa\n    adapters:\n" + adapter
		_, err := config.ParseEdge("edge.yaml", []byte(doc))
		if err == nil {
			t.Fatalf("%s: ParseEdge succeeded", name)
		}
		if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "invalid variable name") ||
			!strings.Contains(err.Error(), "_API_KEY…") {
			t.Errorf("%s: %v", name, err)
		}
	}
	_, err := config.ParseEdge("edge.yaml", []byte("nodes:\n  - id: n\n    token: aaaaaaaa\n    adapters:\n      - {name: c, type: claude-code, inherit_env: [\"\"]}\n"))
	if err == nil || !strings.Contains(err.Error(), `inherit_env has an invalid variable name ""`) {
		t.Errorf("empty name: %v", err)
	}
}

// The key itself written where api_key_env's variable name goes crossed to
// the node, which found no such variable and sent every request without a
// key (401 upstream, no hint). It is refused at load, on the line of the
// key, without quoting the value; a variable name loads, set or not (it is
// the node's environment that holds it).
func TestAPIKeyEnvHoldingTheKeyIsRefused(t *testing.T) {
	for _, s := range []string{
		"sk-proj-Abc123_secretKEYvalue",
		"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"9F86D081884C7D659A2FEAA0C55AD015",
		"9f86d081884c7d659a2feaa0c55ad015",
		"OPENAI API KEY",
	} {
		for kind, entry := range map[string]string{
			"adapter":  "    adapters:\n      - name: llm\n        type: openai\n        base_url: \"http://127.0.0.1:8000\"\n        api_key_env: \"" + s + "\"\n",
			"provider": "    providers:\n      - name: llm\n        type: anthropic\n        base_url: \"https://api.anthropic.com\"\n        api_key_env: \"" + s + "\"\n",
		} {
			doc := "nodes:\n  - id: n\n    token: aaaaaaaa\n" + entry
			_, err := config.ParseEdge("edge.yaml", []byte(doc))
			if err == nil {
				t.Fatalf("%s api_key_env %q: ParseEdge succeeded", kind, s)
			}
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error quotes the value, which may be the key: %v", kind, err)
			}
			want := `edge.yaml: line 8: nodes[0] (id "n"): ` + kind + ` "llm": api_key_env takes the name of an environment variable`
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s api_key_env %q: error %v does not contain %q", kind, s, err, want)
			}
		}
	}
	unsetEnv(t, "IOP_TEST_SURELY_UNSET_KEY")
	doc := "nodes:\n  - id: n\n    token: aaaaaaaa\n    adapters:\n      - {name: llm, type: openai, base_url: \"http://x\", api_key_env: IOP_TEST_SURELY_UNSET_KEY}\n" +
		"    providers:\n      - {name: p, type: openai, base_url: \"http://x\", api_key_env: OPENAI_API_KEY}\n" +
		"      - {name: q, type: openai, base_url: \"http://y\", api_key_env: openai_api_key}\n"
	if _, err := config.ParseEdge("edge.yaml", []byte(doc)); err != nil {
		t.Errorf("api_key_env naming a variable: %v", err)
	}
}

// A provider's base_url keeps its query (Azure's api-version): the
// provider client sends it before the caller's.
func TestProviderBaseURLWithAQueryLoads(t *testing.T) {
	doc := "nodes:\n  - id: n\n    token: aaaaaaaa\n    providers:\n" +
		"      - {name: az, type: openai, base_url: \"https://r.openai.azure.com/openai/deployments/d?api-version=2024-10-21\", api_key_env: AZURE_KEY}\n"
	if _, err := config.ParseEdge("edge.yaml", []byte(doc)); err != nil {
		t.Fatalf("ParseEdge: %v", err)
	}
}
