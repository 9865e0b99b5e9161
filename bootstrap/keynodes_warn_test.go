package bootstrap_test

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/bootstrap"
	"iop/internal/lockedbuf"
)

const warnKeyNode = "an API key is limited to a node that nodes[] does not list"

// An API key limited to a node id nodes[] does not list (a misspelt
// "gpu1" for "gpu-1") reaches no node: every request of it is answered as
// if the node were not connected. The edge says so at start, naming the
// key and the id; a key naming listed nodes only is not warned about.
func TestEdgeWarnsOfAKeyLimitedToAnUnlistedNode(t *testing.T) {
	start := func(nodes string) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "edge.yaml")
		cfg, err := config.ParseEdge(path, []byte(`transport: {listen: "`+freeAddr(t)+`"}
http:
  listen: "`+freeAddr(t)+`"
  api_keys:
    - {name: app, key_sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", scopes: [inference], nodes: `+nodes+`}
    - {name: ops, key_sha256: "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752", scopes: [admin]}
nodes:
  - {id: gpu-1, token: aaaaaaaa}
`))
		if err != nil {
			t.Fatal(err)
		}
		var logs lockedbuf.Buffer
		app := fxtest.New(t, bootstrap.Edge(bootstrap.EdgeSettings{Config: cfg, ConfigPath: path,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))}), fx.NopLogger)
		app.RequireStart()
		app.RequireStop()
		return logs.String()
	}
	logs := start("[gpu-1, gpu1]")
	if strings.Count(logs, warnKeyNode) != 1 || !strings.Contains(logs, "key=app node=gpu1") || !strings.Contains(logs, "level=WARN") {
		t.Errorf("a key limited to an unlisted node was not warned about once, naming key and node:\n%s", logs)
	}
	if logs := start("[gpu-1]"); strings.Contains(logs, warnKeyNode) {
		t.Errorf("a key limited to listed nodes was warned about:\n%s", logs)
	}
}
