package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"iop/adapters/config"
)

// writeFile writes body to a file called name in a fresh directory.
func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A value node.yaml sets that Validate refuses is reported as
// "FILE: line N: message", as a YAML error is: each problem on its own
// line, with the line of its key.
func TestNodeValueErrorsNameFileAndLine(t *testing.T) {
	path := writeFile(t, "node.yaml", `# node config
edge: "edge.example"
token: node-secret
db: "file:n.db"
log:
  level: loud
  format: json
reconnect:
  min: 2s
  max: 1s
store:
  retention: 5m
ca_pin: sha256:abc
cert: node.pem
`)
	c, err := config.LoadNode(path)
	if err != nil {
		t.Fatalf("LoadNode: %v", err)
	}
	err = c.Validate()
	if err == nil {
		t.Fatal("Validate accepted the file")
	}
	want := []string{
		path + `: line 2: edge "edge.example" is not host:port: missing port in address`,
		path + `: line 6: log.level "loud" is not one of debug, info, warn, error`,
		path + `: line 13: ca_pin: pin "sha256:abc" must be "sha256:" followed by 64 hex digits`,
		path + `: line 14: cert and key go together: pass both or neither`,
		path + `: line 10: reconnect.max (1s) must not be less than reconnect.min (2s)`,
		path + `: line 12: store.retention must be at least 1h (the store is pruned hourly), or negative to keep everything; got 5m0s`,
	}
	got := strings.Split(err.Error(), "\n")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Validate =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if strings.Contains(err.Error(), "node-secret") {
		t.Errorf("error %q reveals the token", err)
	}
}

// A value a flag replaced is not the file's: its error names no line of
// the file. A problem about something the file does not set names none
// either, and ErrNoTrust is still ErrNoTrust.
func TestNodeValueErrorsFromFlagsNameNoLine(t *testing.T) {
	path := writeFile(t, "node.yaml", "edge: \"edge.example:7700\"\nlog: {level: info}\n")
	c, err := config.LoadNode(path)
	if err != nil {
		t.Fatal(err)
	}
	c.Edge = "::1:7700"    // --edge
	c.Log.Level = "chatty" // --log-level
	err = c.Validate()
	want := []string{
		`edge "::1:7700" is not host:port: too many colons in address (an IPv6 address goes in brackets, and in YAML in quotes: "[::1]:7700")`,
		`a token is required: pass --token, set $IOP_NODE_TOKEN, or set token or token_env in the node config`,
		`log.level "chatty" is not one of debug, info, warn, error`,
		config.ErrNoTrust.Error(),
	}
	if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("Validate =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !errors.Is(err, config.ErrNoTrust) {
		t.Errorf("Validate = %v, want it to match ErrNoTrust", err)
	}
}

// Value errors of edge.yaml, down to an exec target of an adapter of a
// node, carry the line of the key they are about (or of the entry, for a
// key that is missing).
func TestEdgeValueErrorsNameFileAndLine(t *testing.T) {
	t.Setenv("IOP_TEST_SHORT", "short")
	path := writeFile(t, "edge.yaml", `transport:
  listen: "127.0.0.1:7700"
  heartbeat_interval: 10s
  heartbeat_timeout: 5s
  tls:
    mode: files
    hosts:
      - "not a host"
http:
  listen: "0.0.0.0:7701"
  api_keys:
    - name: ci
      scopes: [read, write]
      key_sha256: abc
  max_connections: -1
metrics:
  listen: "localhost"
store:
  dsn: "mysql://x"
nodes:
  - id: gpu
    token_env: IOP_TEST_SHORT
    adapters:
      - name: sh
        type: exec
        targets:
          ok: {command: [echo]}
          bad:
            command: [x]
            timeout: -1s
      - name: llm
        type: ollama
        max_concurrency: -2
        base_url: "http://127.0.0.1:11434"
      - name: chat
        type: openai
        models: [m]
        base_url: "127.0.0.1:8000"
    providers:
      - name: up
        type: grpc
        base_url: "http://x"
  - id: "a/b"
    token: bbbbbbbbbb
    adapters:
      - name: no-type
        base_url: "http://x"
  - id: c
`)
	_, err := config.LoadEdge(path)
	if err == nil {
		t.Fatal("LoadEdge accepted the file")
	}
	want := []string{
		path + `: line 13: http.api_keys[0] (name "ci"): unknown scope "write" (known: read, runs, inference, admin)`,
		path + `: line 14: http.api_keys[0] (name "ci"): key_sha256 must be 64 hex digits (the SHA-256 of the key, e.g. printf %s KEY | sha256sum)`,
		path + `: line 4: transport.heartbeat_timeout (5s) must be greater than transport.heartbeat_interval (10s)`,
		path + `: line 6: transport.tls.mode files needs both cert_file and key_file`,
		path + `: line 7: transport.tls.hosts is used only with mode: auto (in files mode the certificate names its hosts)`,
		path + `: line 8: transport.tls.hosts: "not a host" is neither an IP address nor a DNS name`,
		path + `: line 15: http.max_connections must be positive, got -1`,
		path + `: line 15: http.max_connections_per_address 1 is outside [1, http.max_connections (-1)]`,
		path + `: line 19: store.dsn: only postgres:// URLs or SQLite file paths are supported`,
		path + `: line 17: metrics.listen "localhost" is not host:port: missing port in address`,
		path + `: line 30: nodes[0] (id "gpu"): adapter "sh" target "bad": timeout must not be negative`,
		path + `: line 22: nodes[0] (id "gpu"): token must be at least 8 characters`,
		path + `: line 43: nodes[1]: id "a/b" may contain only letters, digits, '.', '_' and '-'`,
		path + `: line 46: nodes[1]: adapter "no-type" has no type`,
		path + `: line 48: nodes[2] (id "c"): one of token, token_env and token_sha256 is required`,
	}
	got := strings.Split(err.Error(), "\n")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("LoadEdge =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// One adapter error per node is reported: the others, one at a time,
	// as the ones before are fixed.
	for _, tc := range []struct{ bad, good, want string }{
		{"timeout: -1s", "timeout: 1s", `: line 33: nodes[0] (id "gpu"): adapter "llm": max_concurrency must not be negative`},
		{"max_concurrency: -2", "max_concurrency: 2", `: line 38: nodes[0] (id "gpu"): adapter "chat" (openai): base_url "127.0.0.1:8000" must be an http(s) URL`},
		{`base_url: "127.0.0.1:8000"`, `base_url: "http://127.0.0.1:8000"`, `: line 41: nodes[0] (id "gpu"): provider "up" has unknown type "grpc"`},
	} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(strings.Replace(string(data), tc.bad, tc.good, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = config.LoadEdge(path)
		if err == nil || !strings.Contains(err.Error(), path+tc.want) {
			t.Errorf("after fixing %q: LoadEdge = %v\nwant a line containing %q", tc.bad, err, path+tc.want)
		}
	}
}

// An IPv6 address written without quotes is a YAML syntax error, which
// yaml.v3 reports with no line (on line 1) or the wrong one: the error
// names the line and the key, and shows the quoted form.
func TestUnquotedIPv6Address(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		node      bool
		want      []string
	}{
		{"node edge on line 1", "edge: [::1]:7700\ntoken: x\n", true, []string{
			`: line 1: edge: [::1]:7700 must be quoted: write "[::1]:7700" (unquoted, YAML reads "[" as the start of a list)`}},
		{"node edge further down, with a comment", "# node\ntoken: x\ninsecure: true\nedge: [2001:db8::1]:7700 # the edge\n", true, []string{
			`: line 4: edge: [2001:db8::1]:7700 must be quoted: write "[2001:db8::1]:7700" (unquoted, YAML reads "[" as the start of a list)`}},
		{"edge listen addresses", "transport:\n  listen: [::]:7700\n  tls:\n    hosts: [::1, fe80::1]\nhttp:\n  listen: \"[::1]:7701\"\nmetrics: {listen: [fe80::1%eth0]:9100}\n", false, []string{
			`: line 2: transport.listen: [::]:7700 must be quoted: write "[::]:7700" (unquoted, YAML reads "[" as the start of a list)`,
			`: line 4: transport.tls.hosts: [::1, fe80::1] must be quoted: write ["::1", "fe80::1"] (unquoted, YAML cannot read an address with "::" in a [ ] list)`,
			`: line 7: metrics.listen: [fe80::1%eth0]:9100 must be quoted: write "[fe80::1%eth0]:9100" (unquoted, YAML reads "[" as the start of a list)`}},
		{"list item", "transport:\n  tls:\n    hosts:\n      - [::1]\n", false, []string{
			`: line 4: transport.tls.hosts[0]: [::1] must be quoted: write "[::1]" (unquoted, YAML reads "[" as the start of a list)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			path := writeFile(t, "x.yaml", tc.doc)
			if tc.node {
				_, err = config.LoadNode(path)
			} else {
				_, err = config.LoadEdge(path)
			}
			if err == nil {
				t.Fatal("loaded")
			}
			var want []string
			for _, w := range tc.want {
				want = append(want, path+w)
			}
			if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, want) {
				t.Errorf("error =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			// Quoted as the error says, the file loads.
			fixed := tc.doc
			for _, r := range []string{"[::1]:7700", "[2001:db8::1]:7700", "[::]:7700", "[fe80::1%eth0]:9100"} {
				fixed = strings.Replace(fixed, " "+r, ` "`+r+`"`, 1)
			}
			fixed = strings.Replace(fixed, "[::1, fe80::1]", `["::1", "fe80::1"]`, 1)
			fixed = strings.Replace(fixed, "- [::1]", `- "::1"`, 1)
			if tc.node {
				_, err = config.ParseNode("x.yaml", []byte(fixed))
			} else {
				_, err = config.ParseEdge(filepath.Join(t.TempDir(), "x.yaml"), []byte(fixed))
			}
			if err != nil {
				t.Errorf("quoted, %q: %v", fixed, err)
			}
		})
	}
}

// The address check only explains a syntax error it causes: a list that is
// a list, a quoted address and an unrelated syntax error keep yaml's word.
func TestBracketsThatAreNotAddresses(t *testing.T) {
	for doc, want := range map[string]string{
		"log: [debug]\n": `edge.yaml: line 1: log: expected a mapping, got a list`,
		"transport:\n  tls: {hosts: [\"::1\", a]}\n": "",
		"http:\n  listen: \"[::1]:0\"\n  x: [\n":     `edge.yaml: line 3: did not find expected node content`,
		"a: b\n  c: d\n":                             `edge.yaml: line 2: mapping values are not allowed in this context`,
	} {
		_, err := config.ParseEdge("edge.yaml", []byte(doc))
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: %v", doc, err)
		case want != "" && (err == nil || err.Error() != want):
			t.Errorf("%q: error %v, want %q", doc, err, want)
		}
	}
}

// An IPv6 address without brackets gets the hint to use them (and quotes
// in YAML), with the form to write when the port is clear.
func TestIPv6WithoutBrackets(t *testing.T) {
	for addr, want := range map[string]string{
		"::1:7700":         `(an IPv6 address goes in brackets, and in YAML in quotes: "[::1]:7700")`,
		"2001:db8::5:7700": `(an IPv6 address goes in brackets, and in YAML in quotes: "[2001:db8::5]:7700")`,
		"fe80::1":          `(an IPv6 address goes in brackets before the port, and in YAML in quotes, as in "[::1]:7700")`,
	} {
		c, err := config.ParseNode("node.yaml", []byte("token: node-secret\ninsecure: true\nedge: "+addr+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		err = c.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), "node.yaml: line 3: edge ") || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("edge: %s: Validate = %v, want line 3 and %q", addr, err, want)
		}
	}
}
