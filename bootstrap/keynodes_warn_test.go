package bootstrap_test

import (
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/bootstrap"
	"iop/domain"
	"iop/internal/lockedbuf"
	"iop/ports"
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

// keyOnGPU1File lists gpu-1 and an API key (app) limited to it.
const keyOnGPU1File = `
transport: {listen: "{{link}}"}
http:
  listen: "{{http}}"
  api_keys:
    - {name: app, key_sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", scopes: [inference], nodes: [gpu-1]}
    - {name: ops, key_sha256: "b3f35f84350d38edde79de6e254fdaac13a540b46c29f6d7dd2ffe9e7065cfd6", scopes: [admin]}
nodes:
  - {id: gpu-1, token: aaaaaaaa}
`

// A reload that renames or removes a node an API key is limited to warns
// as the start does: the key, read at start, keeps its limit and reaches
// that node no more. It used to say nothing, the key's requests answered
// as if the node were not connected.
func TestReloadWarnsOfAKeyLimitedToANodeItRemoves(t *testing.T) {
	file := keyOnGPU1File
	e := startFileEdge(t, file)
	reload := func() {
		t.Helper()
		if code, body := adminReload(t, e); code != http.StatusOK {
			t.Fatalf("reload: %d %s", code, body)
		}
	}
	reload()
	if strings.Contains(e.logs.String(), warnKeyNode) {
		t.Fatalf("warned of a key whose node is listed:\n%s", e.logs.String())
	}
	e.write(t, strings.Replace(file, "{id: gpu-1,", "{id: gpu-2,", 1))
	reload()
	if logs := e.logs.String(); strings.Count(logs, warnKeyNode) != 1 || !strings.Contains(logs, "key=app node=gpu-1") {
		t.Fatalf("a reload renaming gpu-1 to gpu-2 did not warn once of key app, limited to gpu-1:\n%s", logs)
	}
}

// refusingSource reads the file as the edge does (its checks, and what
// it used to warn of), then adds a node whose config does not build: the
// reload is refused after the source was read (a config error of a node,
// checked for any source), and the old nodes stay in force.
type refusingSource struct{ ports.NodeSource }

func (s refusingSource) LoadNodes() ([]domain.NodeRecord, []string, error) {
	recs, restart, err := s.NodeSource.LoadNodes()
	return append(recs, domain.NodeRecord{ID: "bad", Adapters: []domain.AdapterConfig{{Name: "a"}}}), restart, err
}

// A refused reload does not warn of a key limited to a node its file no
// longer lists: the old config, which lists it, stays in force, and the
// key still reaches it. It used to warn as the file was read, before the
// reload was refused.
func TestRefusedReloadDoesNotWarnOfAKeyLimitedToANodeItWouldRemove(t *testing.T) {
	file := keyOnGPU1File
	e := startFileEdge(t, file, fx.Decorate(func(src ports.NodeSource) ports.NodeSource { return refusingSource{src} }))
	e.write(t, strings.Replace(file, "{id: gpu-1,", "{id: gpu-2,", 1))
	code, body := adminReload(t, e)
	if code == http.StatusOK || !strings.Contains(string(body), "config_error") {
		t.Fatalf("the reload was not refused as a config error: %d %s", code, body)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "reload rejected; old config stays in force") {
		t.Fatalf("the reload was not refused for its node's config:\n%s", logs)
	}
	if strings.Contains(logs, warnKeyNode) {
		t.Errorf("a refused reload warned of a key limited to a node the config in force still lists:\n%s", logs)
	}
}

// adminReload asks e to reload its file, with the admin key of the files
// above, and returns the answer's status and body.
func adminReload(t *testing.T, e *fileEdge) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+e.http+"/v1/admin/reload", nil)
	req.Header.Set("Authorization", "Bearer ops-key-for-the-reload")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}
