package config_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"iop/adapters/config"
)

const reloadBase = `
transport: {listen: "127.0.0.1:7700", max_frame_size: 4194304}
http:
  listen: "127.0.0.1:7701"
  api_keys:
    - {name: ops, key_sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", scopes: [admin]}
log: {level: info}
nodes:
  - {id: a, token: aaaaaaaa}
`

func parseReload(t *testing.T, text string) *config.EdgeConfig {
	t.Helper()
	c, err := config.ParseEdge("edge.yaml", []byte(text))
	if err != nil {
		t.Fatalf("ParseEdge: %v", err)
	}
	return c
}

// A reload applies nodes[] only: every other change is named, in the file's
// order, as one that takes a restart, and the names carry no values.
func TestRestartKeysNamesChangesOutsideNodes(t *testing.T) {
	running := parseReload(t, reloadBase)
	if got := running.RestartKeys(parseReload(t, reloadBase)); len(got) != 0 {
		t.Fatalf("same file: RestartKeys = %v, want none", got)
	}
	// nodes[] changes alone: a reload applies them.
	onlyNodes := strings.Replace(reloadBase, "{id: a, token: aaaaaaaa}", "{id: b, token: bbbbbbbb}", 1)
	if got := running.RestartKeys(parseReload(t, onlyNodes)); len(got) != 0 {
		t.Fatalf("nodes changed: RestartKeys = %v, want none", got)
	}
	// A default written out is no change.
	explicit := strings.Replace(reloadBase, "log: {level: info}", "log: {level: info, format: text}", 1)
	if got := running.RestartKeys(parseReload(t, explicit)); len(got) != 0 {
		t.Fatalf("default written out: RestartKeys = %v, want none", got)
	}

	next := strings.NewReplacer(
		`max_frame_size: 4194304`, `max_frame_size: 8388608, heartbeat_interval: 5s, heartbeat_timeout: 10s`,
		`listen: "127.0.0.1:7701"`, `listen: "127.0.0.1:7801"`+"\n  max_body_bytes: 2048",
		"  api_keys:\n    - {name: ops, key_sha256: \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\", scopes: [admin]}\n", "",
		`log: {level: info}`, "log: {level: debug}\nmetrics: {listen: \"127.0.0.1:9100\"}\nstore: {retention: 1h}",
	).Replace(reloadBase)
	got := running.RestartKeys(parseReload(t, next))
	want := []string{
		"transport.heartbeat_interval", "transport.heartbeat_timeout", "transport.max_frame_size",
		"http.listen", "http.max_body_bytes", "http.api_keys",
		"log.level", "store.retention", "metrics.listen",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("RestartKeys = %v, want %v", got, want)
	}
	for _, k := range got {
		if strings.Contains(k, "9f86d0") || strings.Contains(k, "ops") {
			t.Fatalf("RestartKeys leaks a value: %q", k)
		}
	}
}

// A setting written another way to the same effect is no change: a reload
// answered "needs_restart": ["http.api_keys"] for an API key's key_env
// replaced by its key_sha256 (as docs/security.md recommends) or for keys
// listed in another order, and ["log.access"] for the default written out,
// sending the operator to a restart, which drops every node link, that
// changed nothing.
func TestRestartKeysIgnoresASettingWrittenAnotherWay(t *testing.T) {
	const key = "reload-test-api-key-0123456789"
	sum := sha256.Sum256([]byte(key))
	digest := hex.EncodeToString(sum[:])
	t.Setenv("IOP_RELOAD_TEST_KEY", key)
	const ci = "    - {name: ci, key_sha256: \"60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752\", scopes: [runs, read], nodes: [b, a]}\n"
	doc := func(keyField, log string, ciFirst ...bool) string {
		keys := "    - {name: ops, " + keyField + ", scopes: [admin]}\n" + ci
		if len(ciFirst) > 0 {
			keys = strings.ReplaceAll(ci, "[runs, read], nodes: [b, a]", "[read, runs, read], nodes: [a, b]") + "    - {name: ops, " + keyField + ", scopes: [admin], nodes: ~}\n"
		}
		return "http:\n  listen: \"127.0.0.1:7701\"\n  api_keys:\n" + keys +
			log + "nodes:\n  - {id: a, token: aaaaaaaa}\n  - {id: b, token: bbbbbbbb}\n"
	}
	running := parseReload(t, doc("key_env: IOP_RELOAD_TEST_KEY", ""))
	for _, same := range []string{
		doc(`key_sha256: "`+digest+`"`, ""),
		doc(`key_sha256: "`+strings.ToUpper(digest)+`"`, ""),
		doc(`key_sha256: "sha256:`+digest+`"`, ""),
		doc("key_env: IOP_RELOAD_TEST_KEY", "log: {access: true}\n"),
		doc("key_env: IOP_RELOAD_TEST_KEY", "", true), // keys, scopes and nodes in another order
	} {
		if got := running.RestartKeys(parseReload(t, same)); len(got) != 0 {
			t.Errorf("RestartKeys = %v for the same settings written another way:\n%s", got, same)
		}
	}
	other := sha256.Sum256([]byte("another-api-key-0123456789"))
	changed := doc(`key_sha256: "`+hex.EncodeToString(other[:])+`"`, "log: {access: false}\n")
	if got, want := running.RestartKeys(parseReload(t, changed)), []string{"http.api_keys", "log.access"}; !slices.Equal(got, want) {
		t.Errorf("RestartKeys = %v for another key and the access log off; want %v", got, want)
	}
}

// A reload refuses a file with nothing in it, one caught while being
// written: read as all defaults, it had no nodes, and the reload
// disconnected and removed every node. nodes: [] still removes them all.
func TestLoadEdgeReloadRefusesAnEmptyFile(t *testing.T) {
	dir := t.TempDir()
	for _, text := range []string{"", "\n  \n", "# being written\n", "---\n", "~\n"} {
		path := filepath.Join(dir, "edge.yaml")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := config.LoadEdge(path); err != nil {
			t.Fatalf("LoadEdge(%q): %v; the edge starts on it", text, err)
		}
		_, err := config.LoadEdgeReload(path)
		if err == nil || !strings.Contains(err.Error(), path+": the file is empty") || !strings.Contains(err.Error(), "nodes: []") {
			t.Errorf("LoadEdgeReload(%q) = %v; want an error naming the file as empty and nodes: []", text, err)
		}
	}
	path := filepath.Join(dir, "none.yaml")
	if err := os.WriteFile(path, []byte("nodes: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := config.LoadEdgeReload(path); err != nil || len(c.Nodes) != 0 {
		t.Fatalf("LoadEdgeReload(nodes: []) = %v, %v; want a config without nodes", c, err)
	}
	if _, err := config.LoadEdgeReload(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "read edge config") {
		t.Fatalf("LoadEdgeReload(missing file) = %v; want a read error", err)
	}
}

// An edge started on a pipe (--config <(envsubst < edge.yaml)) reads it
// empty at a reload: refused too, rather than taken as "no nodes".
func TestLoadEdgeReloadRefusesAPipeReadAtStart(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	path := fmt.Sprintf("/dev/fd/%d", r.Fd())
	if _, err := os.Stat(path); err != nil {
		t.Skipf("no %s: %v", path, err)
	}
	if _, err := w.WriteString("nodes:\n  - {id: a, token: aaaaaaaa}\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if c, err := config.LoadEdge(path); err != nil || len(c.Nodes) != 1 {
		t.Fatalf("LoadEdge(pipe) at start = %v, %v; want node a", c, err)
	}
	if _, err := config.LoadEdgeReload(path); err == nil || !strings.Contains(err.Error(), "the file is empty") {
		t.Fatalf("LoadEdgeReload(pipe read at start) = %v; want it refused as empty", err)
	}
}

// transport.tls.hosts is a set of names for the certificate: listed in
// another order, in another case or with a final dot, it is no change.
func TestRestartKeysTakesTLSHostsAsASet(t *testing.T) {
	doc := func(hosts string) string {
		return "transport: {tls: {hosts: " + hosts + "}}\nnodes:\n  - {id: a, token: aaaaaaaa}\n"
	}
	running := parseReload(t, doc("[edge.example.com, 10.0.0.5]"))
	if got := running.RestartKeys(parseReload(t, doc("[10.0.0.5, Edge.Example.com., edge.example.com]"))); len(got) != 0 {
		t.Errorf("RestartKeys = %v for the same hosts in another order and case", got)
	}
	if got, want := running.RestartKeys(parseReload(t, doc("[edge.example.com, 10.0.0.6]"))), []string{"transport.tls.hosts"}; !slices.Equal(got, want) {
		t.Errorf("RestartKeys = %v for another host, want %v", got, want)
	}
}
