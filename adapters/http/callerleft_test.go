package httpapi_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"iop/adapters/eventbus"
	httpapi "iop/adapters/http"
	"iop/application/edge"
	"iop/domain"
)

// racingLink is a node the edge's cancel overtakes: the run is on its way
// (the node has not registered it), so the cancel is answered
// run_not_found, and the node cancels the run when it arrives.
type racingLink struct{ *fakeLink }

func (l racingLink) CancelRun(ctx context.Context, runID, reason string) error {
	_ = l.fakeLink.CancelRun(ctx, runID, reason)
	return domain.Errorf(domain.CodeRunNotFound, "run %s is not known on this node (should it arrive, it is cancelled)", runID)
}

// A caller that hangs up before its run is admitted is no internal error:
// the access line records 499, nothing is logged at ERROR, and the
// cancel that overtook the run (which ends cancelled anyway) is no warning.
func TestCallerLeavingBeforeAdmissionIsNoInternalError(t *testing.T) {
	buf := &lockedBuf{}
	log := slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	reg := edge.NewRegistry()
	link := newFakeLink() // no events: the node never admits the run
	if err := reg.Admit(&edge.LiveNode{ID: "n1", Link: racingLink{link}, Config: domain.NodeConfig{NodeID: "n1",
		Adapters: []domain.AdapterConfig{{Name: "exec", Type: domain.AdapterExec, MaxConcurrency: 2}}}}); err != nil {
		t.Fatal(err)
	}
	bus := eventbus.New()
	tracker := edge.NewRunTracker(0)
	submit := edge.NewSubmitRunHandler(reg, tracker, bus, log)
	cmds := edge.NewNodeCommandHandler(reg)
	api := httpapi.New(httpapi.Deps{Registry: reg, Submit: submit, Cancel: edge.NewCancelRunHandler(reg, tracker),
		Terminate: edge.NewTerminateSessionHandler(reg), Commands: cmds, GetRun: edge.NewGetRunHandler(reg, tracker, cmds),
		ListRuns: edge.NewListRunsHandler(reg, cmds), Events: bus}, "127.0.0.1:0", log)
	api.AccessLog = true
	srv := httptest.NewServer(api.Handler())
	defer func() {
		srv.Close()
		submit.Stop()
		bus.Close()
	}()

	for _, background := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		body := `{"node":"n1","adapter":"exec","background":` + map[bool]string{false: "false", true: "true"}[background] + `}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/runs", strings.NewReader(body))
		// Counted before the request goes: it may reach the node at once.
		before, logged := len(link.requests()), len(buf.lines())
		done := make(chan error, 1)
		go func() {
			resp, err := srv.Client().Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		waitFor(t, "the run to reach the node", func() bool { return len(link.requests()) > before })
		cancel()
		if err := <-done; err == nil {
			t.Fatal("the request outlived its cancelled context")
		}
		waitFor(t, "the access line", func() bool { return len(buf.lines()) > logged })
	}
	// Stop waits for the edge's follow of the withdrawn runs: what they
	// log is in by then.
	submit.Stop()

	for _, l := range buf.lines() {
		if l["status"] != float64(499) {
			t.Errorf("a caller that left is logged with status %v, want 499: %+v", l["status"], l)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["level"] == "ERROR" || m["level"] == "WARN" {
			t.Errorf("a caller that left is logged at %v: %s", m["level"], line)
		}
	}
}
