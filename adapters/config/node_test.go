package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/adapters/config"
)

func TestParseNode(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want config.NodeConfig
	}{
		{
			name: "defaults",
			doc:  "",
			want: config.NodeConfig{
				Edge: "127.0.0.1:7700",
				DB:   "file:iop.db?cache=shared&mode=rwc",
				Log:  config.LogConfig{Level: "info", Format: "text"},
				Reconnect: config.ReconnectConfig{
					Min: config.Duration(500 * time.Millisecond),
					Max: config.Duration(30 * time.Second),
				},
				Store: config.NodeStoreConfig{Retention: config.Duration(30 * 24 * time.Hour)},
			},
		},
		{
			name: "everything set",
			doc: `edge: "edge.example:7700"
token_env: IOP_NODE_TOKEN
db: "file:/var/lib/iop/node.db"
log: {level: warn, format: json}
reconnect: {min: 1s, max: 1m}
store: {retention: 168h}
`,
			want: config.NodeConfig{
				Edge:     "edge.example:7700",
				TokenEnv: "IOP_NODE_TOKEN",
				DB:       "file:/var/lib/iop/node.db",
				Log:      config.LogConfig{Level: "warn", Format: "json"},
				Reconnect: config.ReconnectConfig{
					Min: config.Duration(time.Second),
					Max: config.Duration(time.Minute),
				},
				Store: config.NodeStoreConfig{Retention: config.Duration(7 * 24 * time.Hour)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := config.ParseNode("node.yaml", []byte(tt.doc))
			if err != nil {
				t.Fatalf("ParseNode: %v", err)
			}
			if got := c.WithoutSource(); got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseNodeTypeErrors(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"unknown field", "edge: a:1\ntokn: x\n", "node.yaml: line 2: unknown key \"tokn\""},
		{"nested unknown field", "reconnect:\n  minimum: 1s\n", "node.yaml: line 2: unknown key \"reconnect.minimum\""},
		{"bad duration", "reconnect: {max: forever}\n", `node.yaml: line 1: reconnect.max: invalid duration "forever"`},
		{"wrong type", "log: [debug]\n", "node.yaml: line 1: log: expected a mapping, got a list"},
		{"bad retention", "store:\n  retention: 30d\n", `node.yaml: line 2: store.retention: invalid duration "30d"`},
		{"unknown store key", "store: {dsn: x.db}\n", `node.yaml: line 1: unknown key "store.dsn"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.ParseNode("node.yaml", []byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseNode error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// Parsing leaves value checks to Validate so that a --token flag can fill
// the token after the file is read.
func TestNodeTokenFromFlagAfterParse(t *testing.T) {
	c, err := config.ParseNode("node.yaml", []byte("edge: \"10.0.0.1:7700\"\ninsecure: true\n"))
	if err != nil {
		t.Fatalf("ParseNode without a token: %v", err)
	}
	err = c.Validate()
	if err == nil || !strings.Contains(err.Error(), "a token is required") || !strings.Contains(err.Error(), "$IOP_NODE_TOKEN") {
		t.Fatalf("Validate without token = %v, want a token error", err)
	}
	c.Token = "from-the-flag"
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate after setting the token: %v", err)
	}
	if tok, _ := c.ResolveToken(); tok != "from-the-flag" {
		t.Errorf("ResolveToken = %q", tok)
	}
}

func TestNodeTokenEnv(t *testing.T) {
	t.Setenv("IOP_TEST_NODE_TOKEN", "env-token-value")
	c, err := config.ParseNode("node.yaml", []byte("token_env: IOP_TEST_NODE_TOKEN\nca_file: /etc/iop/ca.pem\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if tok, _ := c.ResolveToken(); tok != "env-token-value" {
		t.Errorf("ResolveToken = %q", tok)
	}
	c.Token = "flag-wins"
	if tok, _ := c.ResolveToken(); tok != "flag-wins" {
		t.Errorf("ResolveToken with both = %q, want the explicit token", tok)
	}
}

func TestNodeValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*config.NodeConfig)
		want   string
	}{
		{"edge without port", func(c *config.NodeConfig) { c.Edge = "edge.example" }, `edge "edge.example" is not host:port`},
		{"edge port zero", func(c *config.NodeConfig) { c.Edge = "edge.example:0" }, `edge "edge.example:0": port must not be 0`},
		// With a CA bundle the certificate is checked against the name
		// dialled: none made every handshake fail, retried for ever.
		{"no host with ca_file", func(c *config.NodeConfig) { c.Edge, c.TLS = ":7700", config.NodeTLS{CAFile: "ca.pem"} }, `edge ":7700" names no host`},
		{"no token", func(c *config.NodeConfig) { c.Token = "" }, "a token is required"},
		{"token_env unset", func(c *config.NodeConfig) { c.Token, c.TokenEnv = "", "IOP_TEST_SURELY_UNSET" }, "token_env: environment variable IOP_TEST_SURELY_UNSET is unset or empty"},
		{"empty db", func(c *config.NodeConfig) { c.DB = "" }, "db must not be empty"},
		{"log level", func(c *config.NodeConfig) { c.Log.Level = "trace" }, `log.level "trace"`},
		{"log format", func(c *config.NodeConfig) { c.Log.Format = "logfmt" }, `log.format "logfmt"`},
		{"reconnect min", func(c *config.NodeConfig) { c.Reconnect.Min = config.Duration(-time.Second) }, "reconnect.min must be positive"},
		{"reconnect max below min", func(c *config.NodeConfig) { c.Reconnect.Max = config.Duration(time.Millisecond) }, "reconnect.max (1ms) must not be less than reconnect.min (500ms)"},
		{"retention too short", func(c *config.NodeConfig) { c.Store.Retention = config.Duration(5 * time.Minute) },
			"store.retention must be at least 1h (the store is pruned hourly), or negative to keep everything; got 5m0s"},
		{"no trust option", func(c *config.NodeConfig) { c.TLS.CAPin = "" }, "pass --ca-pin sha256:<hex>"},
		{"two trust options", func(c *config.NodeConfig) { c.TLS.Insecure = true }, "set only one of ca_pin, ca_file and insecure"},
		{"malformed pin", func(c *config.NodeConfig) { c.TLS.CAPin = "sha256:abc" }, "64 hex digits"},
		{"cert without key", func(c *config.NodeConfig) { c.TLS.Cert = "node.pem" }, "cert and key go together"},
		{"client cert on plaintext", func(c *config.NodeConfig) {
			c.TLS = config.NodeTLS{Insecure: true, Cert: "n.pem", Key: "n.key"}
		}, "cannot be used with insecure"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &config.NodeConfig{Token: "node-secret", TLS: config.NodeTLS{CAPin: testPin}}
			c.SetDefaults()
			if err := c.Validate(); err != nil {
				t.Fatalf("baseline Validate: %v", err)
			}
			tt.mutate(c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "node-secret") {
				t.Errorf("error %q reveals the token", err)
			}
		})
	}
}

func TestLoadNode(t *testing.T) {
	c, err := config.LoadNode("")
	if err != nil {
		t.Fatalf("LoadNode(\"\"): %v", err)
	}
	if c.DB != config.DefaultNodeDB || c.Edge != config.DefaultNodeEdge {
		t.Errorf("LoadNode(\"\") = %+v, want defaults", c)
	}

	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte("db: \"file:x.db\"\ntoken: abcdefgh\nca_pin: "+testPin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = config.LoadNode(path)
	if err != nil {
		t.Fatalf("LoadNode: %v", err)
	}
	if c.DB != "file:x.db" || c.TLS.CAPin != testPin || c.Validate() != nil {
		t.Errorf("LoadNode = %+v (validate: %v)", c, c.Validate())
	}

	if _, err := config.LoadNode(path + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadNode(missing) = %v, want ErrNotExist", err)
	}
}

const testPin = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// A node given no way to trust its edge fails with ErrNoTrust, which
// iop-node turns into exit code 1 and the hint naming the three options.
func TestNodeWithoutTrustIsErrNoTrust(t *testing.T) {
	c := &config.NodeConfig{Token: "node-secret"}
	c.SetDefaults()
	err := c.Validate()
	if !errors.Is(err, config.ErrNoTrust) {
		t.Fatalf("Validate = %v, want ErrNoTrust", err)
	}
	for _, opt := range []string{"--ca-pin", "--ca-file", "--insecure", "--print-ca-pin"} {
		if !strings.Contains(err.Error(), opt) {
			t.Errorf("hint %q does not name %s", err, opt)
		}
	}
}

// store.retention follows the edge's: unset or 0 is 30 days, a negative
// value keeps everything, an hour or more is taken as it is.
func TestNodeStoreRetention(t *testing.T) {
	for doc, want := range map[string]time.Duration{
		"":                          30 * 24 * time.Hour,
		"store: {retention: 0}":     30 * 24 * time.Hour,
		"store: {retention: -1s}":   -time.Second,
		"store: {retention: 1h}":    time.Hour,
		"store: {retention: 2160h}": 90 * 24 * time.Hour,
	} {
		c, err := config.ParseNode("node.yaml", []byte(doc+"\ninsecure: true\ntoken: node-secret\n"))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if c.Store.Retention.Std() != want {
			t.Errorf("%q: retention %s, want %s", doc, c.Store.Retention, want)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%q: Validate: %v", doc, err)
		}
	}
}

// The node's token pasted into node.yaml's token_env is not quoted back.
func TestNodeTokenEnvHoldingTheTokenIsNotEchoed(t *testing.T) {
	const tok = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	c := &config.NodeConfig{TokenEnv: tok, TLS: config.NodeTLS{CAPin: testPin}}
	c.SetDefaults()
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate succeeded with an unset token_env")
	}
	if strings.Contains(err.Error(), tok) || !strings.Contains(err.Error(), "token_env: the environment variable it names is unset or empty") {
		t.Fatalf("Validate = %v", err)
	}
}
