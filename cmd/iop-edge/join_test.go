package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --address is taken before or after the node id; a second id is refused.
func TestJoinFlagsAroundTheNodeID(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.yaml")
	doc := "transport: {listen: \"127.0.0.1:7700\", tls: {mode: \"off\"}}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--address", "edge.example.com:7700", "gpu-box"},
		{"gpu-box", "--address", "edge.example.com:7700"},
		{"gpu-box", "--address=edge.example.com:7700"},
	} {
		var out, errOut bytes.Buffer
		if err := join(cfg, &out, &errOut, args); err != nil {
			t.Fatalf("join %q: %v (%s)", args, err, errOut.String())
		}
		if !strings.Contains(out.String(), "iop-node --edge edge.example.com:7700 --insecure\n") {
			t.Errorf("join %q printed:\n%s", args, out.String())
		}
	}
	var out, errOut bytes.Buffer
	if err := join(cfg, &out, &errOut, []string{"gpu-box", "other"}); err == nil || !strings.Contains(err.Error(), "usage:") {
		t.Errorf("join with two ids: %v", err)
	}
}

// A mistake in the command line or the config file exits 2, as the edge's
// own flags and config do; join's other failures (an unknown node) exit 1.
func TestJoinUsageAndConfigErrorsExit2(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("transport: {listen: \"127.0.0.1:7700\", tls: {mode: \"off\"}}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("nodes:\n  - {id: gpu-box, tokn: aaaaaaaa}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg   string
		args  []string
		usage bool
	}{
		{good, []string{"gpu-box", "other"}, true},
		{good, []string{"--nope", "gpu-box"}, true},
		{bad, []string{"gpu-box"}, true},
		{good, []string{"absent"}, false},
	} {
		var out, errOut bytes.Buffer
		err := join(tc.cfg, &out, &errOut, tc.args)
		if err == nil || errors.As(err, new(usageError)) != tc.usage {
			t.Errorf("join %q with %s: %v; want an error, usage (exit 2): %v", tc.args, filepath.Base(tc.cfg), err, tc.usage)
		}
	}
}

// On a wildcard listen address the node dials the first name of the
// edge's certificate that names a host: a wildcard ("*.example.com") does
// not.
func TestJoinSkipsAWildcardHost(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.yaml")
	doc := "transport: {listen: \"0.0.0.0:7700\", tls: {mode: auto, hosts: [\"*.example.com\", edge.example.com]}}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := join(cfg, &out, &errOut, []string{"gpu-box"}); err != nil {
		t.Fatalf("join: %v (%s)", err, errOut.String())
	}
	if !strings.Contains(out.String(), "--edge edge.example.com:7700 ") || strings.Contains(out.String(), "*.") {
		t.Fatalf("join printed:\n%s", out.String())
	}
}
