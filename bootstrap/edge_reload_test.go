package bootstrap_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/bootstrap"
	"iop/internal/lockedbuf"
)

// A reload applies nodes[] and names, in its answer and in one warning, the
// other changes to edge.yaml: the edge read them at start and runs on with
// them until it restarts. It used to answer "config reloaded" and say
// nothing of them.
func TestReloadNamesChangesThatNeedARestart(t *testing.T) {
	tAddr := freeAddr(t)
	path, file, hAddr, logs := reloadEdge(t, tAddr)

	reload := func() (res struct {
		Nodes        int      `json:"nodes"`
		NeedsRestart []string `json:"needs_restart"`
	}) {
		t.Helper()
		resp, err := http.Post("http://"+hAddr+"/v1/admin/reload", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("reload: %d %s", resp.StatusCode, body)
		}
		if err := json.Unmarshal(body, &res); err != nil {
			t.Fatalf("reload answer %s: %v", body, err)
		}
		return res
	}
	if res := reload(); res.Nodes != 1 || len(res.NeedsRestart) != 0 {
		t.Fatalf("reload of the same file = %+v, want nothing to restart for", res)
	}
	if strings.Contains(logs.String(), "needs_restart") {
		t.Fatalf("a reload of the same file warned:\n%s", logs.String())
	}

	changed := strings.NewReplacer(
		`transport: {listen: "`+tAddr+`"}`, `transport: {listen: "`+tAddr+`", max_frame_size: 8388608}`,
		`http: {listen: "`+hAddr+`"}`, `http: {listen: "`+hAddr+`", max_body_bytes: 4096}`,
		"nodes:\n", "log: {level: debug}\nnodes:\n  - {id: n2, token: reload-test-token-2}\n",
	).Replace(file)
	if err := os.WriteFile(path, []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	res := reload()
	want := []string{"transport.max_frame_size", "http.max_body_bytes", "log.level"}
	if res.Nodes != 2 || !slices.Equal(res.NeedsRestart, want) {
		t.Fatalf("reload = %+v; want 2 nodes and needs_restart %v", res, want)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "needs_restart=\"[transport.max_frame_size http.max_body_bytes log.level]\"") {
		t.Fatalf("no warning naming the changes that need a restart:\n%s", logs.String())
	}
}

// A reload refuses the sample token of configs/edge.yaml while the node link
// listens where others reach it, as a start does: in a file that says so,
// and in a file that names a loopback address the running edge does not
// listen on (a changed listen address takes a restart).
func TestReloadRefusesTheSampleTokenOnAPublicLink(t *testing.T) {
	// Port 0: a port found free on loopback could be taken on 0.0.0.0 by
	// a parallel test.
	tAddr := "0.0.0.0:0"
	path, file, hAddr, _ := reloadEdge(t, tAddr)

	for _, listen := range []string{tAddr, "127.0.0.1:0"} {
		next := strings.Replace(file, tAddr, listen, 1) + "  - {id: local, token: " + config.SampleNodeToken + "}\n"
		if err := os.WriteFile(path, []byte(next), 0o600); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post("http://"+hAddr+"/v1/admin/reload", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct{ Code, Message string }
		}
		_ = json.Unmarshal(body, &e)
		if resp.StatusCode < 400 || e.Error.Code != "config_error" ||
			!strings.Contains(e.Error.Message, `(id "local"): the token is the sample token`) ||
			!strings.Contains(e.Error.Message, `transport.listen "`+tAddr+`" is not a loopback address`) {
			t.Errorf("reload with transport.listen %s in the file: %d %s; want a config_error naming node local", listen, resp.StatusCode, body)
		}
		if strings.Contains(string(body), config.SampleNodeToken) {
			t.Errorf("reload answer shows the token: %s", body)
		}
	}
}

// A reload's config_error about a base_url does not show its password.
func TestReloadAnswerHidesBaseURLPassword(t *testing.T) {
	tAddr := freeAddr(t)
	path, file, hAddr, logs := reloadEdge(t, tAddr)

	bad := strings.Replace(file, "  - {id: n1, token: reload-test-token}\n",
		"  - id: n1\n    token: reload-test-token\n    providers:\n      - {name: p, type: openai, base_url: \"http://ops:hunter2@gpu:bad port\"}\n", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+hAddr+"/v1/admin/reload", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode < 400 || !strings.Contains(string(body), "config_error") || !strings.Contains(string(body), `ops:xxxxx@gpu:bad port`) {
		t.Errorf("reload: %d %s; want a config_error quoting the redacted base_url", resp.StatusCode, body)
	}
	if strings.Contains(string(body), "hunter2") || strings.Contains(logs.String(), "hunter2") {
		t.Errorf("the password shows: answer %s\nlog:\n%s", body, logs.String())
	}
}

// reloadEdge starts an edge from an edge.yaml with its node link on tAddr,
// its API on a free loopback address and node n1, and returns the file's
// path and text, the API's address and the edge's log.
func reloadEdge(t *testing.T, tAddr string) (path, file, hAddr string, logs *lockedbuf.Buffer) {
	t.Helper()
	hAddr = freeAddr(t)
	path = filepath.Join(t.TempDir(), "edge.yaml")
	file = `
transport: {listen: "` + tAddr + `"}
http: {listen: "` + hAddr + `"}
nodes:
  - {id: n1, token: reload-test-token}
`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadEdge(path)
	if err != nil {
		t.Fatal(err)
	}
	logs = &lockedbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	edge := fxtest.New(t, bootstrap.Edge(bootstrap.EdgeSettings{Config: cfg, ConfigPath: path, Logger: log}), fx.NopLogger)
	edge.RequireStart()
	t.Cleanup(edge.RequireStop)
	return path, file, hAddr, logs
}
