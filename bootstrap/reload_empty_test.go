package bootstrap_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/bootstrap"
	"iop/internal/lockedbuf"
)

// A reload that finds edge.yaml empty (truncated by a writer that has not
// yet written it again) keeps the running config and its nodes connected,
// and says why. It used to apply the empty file as "no nodes": every node
// was disconnected, removed and refused from then on.
func TestReloadOfAnEmptyFileKeepsTheNodes(t *testing.T) {
	file := strings.Replace(refusedEdge, "TOKEN", "empty-reload-token", 1)
	e := startFileEdge(t, file)
	var nodeLogs lockedbuf.Buffer
	node := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{
		Edge: e.link, Token: "empty-reload-token", Transport: nodeLink(t, e.settings),
		Logger:     slog.New(slog.NewTextHandler(&nodeLogs, nil)),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		DB: "file:" + filepath.Join(t.TempDir(), "n.db") + "?cache=shared&mode=rwc",
	}), fx.NopLogger)
	node.RequireStart()
	defer node.RequireStop()
	connected := func() bool {
		var list struct {
			Nodes []struct {
				ID        string `json:"id"`
				Connected bool   `json:"connected"`
			} `json:"nodes"`
		}
		e.call(t, "GET", "/v1/nodes", nil, 200, &list)
		return len(list.Nodes) == 1 && list.Nodes[0].ID == "n1" && list.Nodes[0].Connected
	}
	waitFor(t, 10*time.Second, "the node to register", connected)

	for _, text := range []string{"", "# being written\n"} {
		if err := os.WriteFile(e.path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post("http://"+e.http+"/v1/admin/reload", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var answer struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		_ = json.Unmarshal(body, &answer)
		if resp.StatusCode != http.StatusUnprocessableEntity || answer.Error.Code != "config_error" || !strings.Contains(answer.Error.Message, "the file is empty") {
			t.Fatalf("reload of %q: %d %s; want 422 config_error saying the file is empty", text, resp.StatusCode, body)
		}
		if !connected() {
			t.Fatalf("after a refused reload of %q node n1 is no longer connected", text)
		}
	}
	if !strings.Contains(e.logs.String(), "reload rejected; old config stays in force") {
		t.Fatalf("the refused reload was not logged:\n%s", e.logs.String())
	}
	// The file written back in full reloads as before.
	e.write(t, file)
	var res struct {
		Nodes     int      `json:"nodes"`
		Unchanged []string `json:"unchanged"`
	}
	e.call(t, "POST", "/v1/admin/reload", nil, 200, &res)
	if res.Nodes != 1 || len(res.Unchanged) != 1 || !connected() {
		t.Fatalf("reload of the full file = %+v; want n1 unchanged and connected", res)
	}
}
