package httpapi_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/adapters/eventbus"
	httpapi "iop/adapters/http"
	"iop/application/edge"
	"iop/domain"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far; read under the lock, since the
// server's goroutines may still be logging.
func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuf) lines() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "http request" {
			out = append(out, m)
		}
	}
	return out
}

// accessServer is an API over one fake node whose log goes to buf.
func accessServer(t *testing.T, buf *lockedBuf, access bool) *httptest.Server {
	reg := edge.NewRegistry()
	link := newFakeLink(domain.RunEvent{Seq: 1, Type: domain.EventStart}, domain.RunEvent{Seq: 2, Type: domain.EventComplete})
	if err := reg.Admit(&edge.LiveNode{ID: "n1", Link: link, Config: domain.NodeConfig{NodeID: "n1",
		Adapters: []domain.AdapterConfig{{Name: "exec", Type: domain.AdapterExec, MaxConcurrency: 2}}}}); err != nil {
		t.Fatal(err)
	}
	bus := eventbus.New()
	tracker := edge.NewRunTracker(0)
	submit := edge.NewSubmitRunHandler(reg, tracker, bus, nil)
	cmds := edge.NewNodeCommandHandler(reg)
	log := slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	api := httpapi.New(httpapi.Deps{Registry: reg, Submit: submit, Cancel: edge.NewCancelRunHandler(reg, tracker),
		Terminate: edge.NewTerminateSessionHandler(reg), Commands: cmds, GetRun: edge.NewGetRunHandler(reg, tracker, cmds),
		ListRuns: edge.NewListRunsHandler(reg, cmds), Events: bus}, "127.0.0.1:0", log)
	api.AccessLog = access
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(func() {
		srv.Close()
		submit.Stop()
		bus.Close()
	})
	return srv
}

func TestAccessLogOneLinePerRequest(t *testing.T) {
	buf := &lockedBuf{}
	srv := accessServer(t, buf, true)
	resp, err := http.Post(srv.URL+"/v1/runs?secret=q", "application/json", strings.NewReader(`{"node":"n1","adapter":"exec","background":true,"input":"private"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp, err = http.Get(srv.URL + "/v1/nodes/n9")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// The line is written just after the response: wait for it.
	lines := buf.lines()
	for deadline := time.Now().Add(5 * time.Second); len(lines) < 2 && time.Now().Before(deadline); lines = buf.lines() {
		time.Sleep(5 * time.Millisecond)
	}
	if len(lines) != 2 {
		t.Fatalf("%d access lines: %+v", len(lines), lines)
	}
	run := lines[0]
	if run["method"] != "POST" || run["route"] != "/v1/runs" || run["status"] != float64(202) || run["key"] != domain.AnonymousName ||
		run["node"] != "n1" || !strings.HasPrefix(run["run"].(string), "run_") || run["level"] != "INFO" || run["duration"] == nil {
		t.Fatalf("run line %+v", run)
	}
	if n := lines[1]; n["route"] != "/v1/nodes/{id}" || n["status"] != float64(404) || n["node"] != "n9" {
		t.Fatalf("node line %+v", n)
	}
	all := buf.String()
	if strings.Contains(all, "secret=q") || strings.Contains(all, "private") {
		t.Fatalf("the access log holds the query or body: %s", all)
	}
}

func TestAccessLogOff(t *testing.T) {
	buf := &lockedBuf{}
	srv := accessServer(t, buf, false)
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if lines := buf.lines(); len(lines) != 0 {
		t.Fatalf("log.access off still logs at info: %+v", lines)
	}
}
