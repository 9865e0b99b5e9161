package config_test

import (
	"path/filepath"
	"slices"
	"testing"

	"iop/adapters/config"
)

func TestLinkTLSDefaultsAndPaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	c, err := config.ParseEdge(path, []byte("transport: {listen: \"127.0.0.1:7700\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Transport.TLS.Mode != config.TLSAuto {
		t.Errorf("default tls mode = %q, want auto", c.Transport.TLS.Mode)
	}
	if want := filepath.Join(dir, "edge-state"); c.StateDir != want || config.DefaultStateDir(path) != want {
		t.Errorf("default state_dir = %q (DefaultStateDir %q), want %q (next to the config file)", c.StateDir, config.DefaultStateDir(path), want)
	}
	rc, err := config.ParseEdge(filepath.Join("configs", "edge.yaml"), []byte("transport: {listen: \"127.0.0.1:7700\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join("configs", "edge-state"); rc.StateDir != want {
		t.Errorf("default state_dir of a relative config path = %q, want %q", rc.StateDir, want)
	}
	hosts := c.CertHosts()
	for _, h := range []string{"127.0.0.1", "localhost", "::1"} {
		if !slices.Contains(hosts, h) {
			t.Errorf("CertHosts() = %v, missing %s", hosts, h)
		}
	}

	c, err = config.ParseEdge(path, []byte(`state_dir: st
transport:
  listen: "10.1.2.3:7700"
  tls: {mode: files, cert_file: certs/edge.pem, key_file: /etc/iop/edge.key, client_ca_file: nodes-ca.pem, bind_node_identity: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	tl := c.Transport.TLS
	if c.StateDir != filepath.Join(dir, "st") || tl.CertFile != filepath.Join(dir, "certs/edge.pem") || tl.KeyFile != "/etc/iop/edge.key" || tl.ClientCAFile != filepath.Join(dir, "nodes-ca.pem") {
		t.Errorf("paths not resolved against the config's directory: state_dir %q, tls %+v", c.StateDir, tl)
	}

	c, err = config.ParseEdge(path, []byte("transport: {listen: \"10.1.2.3:7700\", tls: {hosts: [edge.example.com, 198.51.100.4]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CertHosts(); !slices.Contains(got, "10.1.2.3") || !slices.Contains(got, "edge.example.com") || !slices.Contains(got, "198.51.100.4") {
		t.Errorf("CertHosts() = %v, want the listen host and tls.hosts", got)
	}
	// Plaintext is fine on loopback.
	for _, l := range []string{"127.0.0.1:7700", "[::1]:7700", "localhost:7700"} {
		if _, err := config.ParseEdge(path, []byte("transport: {listen: \""+l+"\", tls: {mode: off}}\n")); err != nil {
			t.Errorf("tls off on %s: %v", l, err)
		}
	}
}
