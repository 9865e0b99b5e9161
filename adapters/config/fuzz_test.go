package config_test

import (
	"os"
	"strings"
	"testing"

	"iop/adapters/config"
)

// FuzzParseConfig feeds arbitrary YAML to the edge and node config
// parsers: they must never panic, and must return a config or an error
// that names the file.
func FuzzParseConfig(f *testing.F) {
	for _, p := range []string{"../../configs/edge.yaml", "../../configs/node.yaml"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, strings.Contains(p, "node"))
	}
	for _, s := range []string{
		"", "---\n", "a: 1\n---\nb: 2\n", "transport:\n\tlisten: x\n", "transport: [1, 2]\n",
		"nodes:\n  - id: n1\n    token: short\n    adapters: {x: 1}\n", "http:\n  api_keys: !!binary aGk=\n",
		"&a [*a, *a]\n", "log:\n  level: loud\n  nope: 1\n", "edge:\n  address: \"::1:99999\"\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, node bool) {
		const name = "/etc/iop/fuzz.yaml"
		var err error
		var ok bool
		if node {
			var c *config.NodeConfig
			c, err = config.ParseNode(name, data)
			ok = c != nil
			if ok {
				_ = c.Validate() // locating its problems in data must not panic
			}
		} else {
			var c *config.EdgeConfig
			c, err = config.ParseEdge(name, data)
			ok = c != nil
		}
		if (err == nil) != ok {
			t.Fatalf("config %v with error %v", ok, err)
		}
		if err != nil && !strings.HasPrefix(err.Error(), name) {
			t.Fatalf("error does not name the file: %v", err)
		}
	})
}
