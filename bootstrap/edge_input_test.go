package bootstrap_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/bootstrap"
)

// startEdgeAndNode runs both graphs in-process and waits for n1 to register.
func startEdgeAndNode(t *testing.T) (httpAddr string) {
	t.Helper()
	tAddr, hAddr := freeAddr(t), freeAddr(t)
	es := edgeSettings(t, tAddr, hAddr)
	edge := fxtest.New(t, bootstrap.Edge(es), fx.NopLogger)
	edge.RequireStart()
	t.Cleanup(edge.RequireStop)
	node := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{
		Edge: tAddr, Token: "graph-test-token", Logger: quiet(), Transport: nodeLink(t, es),
		DB: "file:" + filepath.Join(t.TempDir(), "n.db") + "?cache=shared&mode=rwc",
	}), fx.NopLogger)
	node.RequireStart()
	t.Cleanup(node.RequireStop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + hAddr + "/v1/nodes")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), `"id":"n1"`) {
				return hAddr
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("node never registered")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A run input that cannot fit in one frame on the node link (but fits the
// HTTP body limit) must be answered with a clear error at once, not
// dropped on the wire while the caller's stream waits forever.
func TestOversizedRunInputIsRefused(t *testing.T) {
	hAddr := startEdgeAndNode(t)
	body, _ := json.Marshal(map[string]any{"adapter": "exec", "target": "echo", "input": strings.Repeat("a", 5<<20)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+hAddr+"/v1/runs", bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the run stream hung (status %d, read %d bytes): %v", resp.StatusCode, len(b), err)
	}
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"code":"invalid_request"`) {
		t.Fatalf("status %d body %.300s", resp.StatusCode, b)
	}
	// The refused run holds no slot.
	resp, err = http.Get("http://" + hAddr + "/v1/nodes/n1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var n struct {
		RunsInFlight int `json:"runs_in_flight"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&n)
	if n.RunsInFlight != 0 {
		t.Fatalf("runs in flight %d after a refused run", n.RunsInFlight)
	}
}

// The same holds for node command arguments: a clear 400, not a 30 s wait
// for a reply to a request the link dropped.
func TestOversizedCommandArgsAreRefused(t *testing.T) {
	hAddr := startEdgeAndNode(t)
	body, _ := json.Marshal(map[string]any{"command": "capabilities", "args": map[string]string{"pad": strings.Repeat("a", 5<<20)}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+hAddr+"/v1/nodes/n1/commands", bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"code":"invalid_request"`) {
		t.Fatalf("status %d body %.300s", resp.StatusCode, b)
	}
}
