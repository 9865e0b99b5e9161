package config_test

import (
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
