package main

import (
	"bytes"
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
