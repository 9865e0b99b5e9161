package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	httpapi "iop/adapters/http"
	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// queryHistory is an edge history that records the queries it is asked.
type queryHistory struct {
	mu     sync.Mutex
	runs   []domain.RunQuery
	usages []domain.UsageQuery
}

func (h *queryHistory) GetRun(context.Context, string) (domain.RunRecord, error) {
	return domain.RunRecord{}, domain.ErrRunNotFound
}

func (h *queryHistory) ListRuns(_ context.Context, q domain.RunQuery) (domain.RunPage, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.runs = append(h.runs, q)
	return domain.RunPage{}, nil
}

func (h *queryHistory) Usage(_ context.Context, q domain.UsageQuery) ([]domain.UsageTotal, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.usages = append(h.usages, q)
	return nil, nil
}

// The zero time means "no bound" to the history, so a since or until that
// is the zero time is refused: until=0001-01-01 listed every run, though it
// bounds every one away.
func TestHistoryRefusesTheZeroTime(t *testing.T) {
	h := &queryHistory{}
	e := newEnvWithDeps(t, nil, func(_ *env, d *httpapi.Deps) { d.History = edge.NewRunHistoryHandler(h) })
	for _, q := range []string{
		"/v1/runs?until=0001-01-01", "/v1/runs?since=0001-01-01T00:00:00Z", "/v1/runs?until=0001-01-01T01:00:00%2B01:00",
		"/v1/usage?until=0001-01-01", "/v1/usage?since=0001-01-01",
	} {
		wantError(t, e.do("GET", q, ""), 400, "invalid_request")
	}
	h.mu.Lock()
	asked := len(h.runs) + len(h.usages)
	h.mu.Unlock()
	if asked != 0 {
		t.Fatalf("the history was asked %d queries", asked)
	}
	// A time past the zero one is a bound like any other.
	readJSON(t, e.do("GET", "/v1/runs?until=0001-01-02", ""), 200)
	readJSON(t, e.do("GET", "/v1/usage?since=2026-01-01", ""), 200)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.runs) != 1 || h.runs[0].Until.IsZero() || len(h.usages) != 1 || h.usages[0].Since.IsZero() {
		t.Fatalf("queries %+v %+v", h.runs, h.usages)
	}
}

// The bounds /v1/usage echoes are in UTC, as every other time the API
// answers with, whatever offset the caller wrote them in: a caller that
// compares them with created_at or a day group must not have to convert.
func TestUsageEchoesItsBoundsInUTC(t *testing.T) {
	h := &queryHistory{}
	e := newEnvWithDeps(t, nil, func(_ *env, d *httpapi.Deps) { d.History = edge.NewRunHistoryHandler(h) })
	got := readJSON(t, e.do("GET", "/v1/usage?since=2026-03-01T02:00:00%2B02:00&until=2026-03-02T00:00:00.5-05:00", ""), 200)
	if got["since"] != "2026-03-01T00:00:00Z" || got["until"] != "2026-03-02T05:00:00.5Z" {
		t.Fatalf("since %v, until %v; want 2026-03-01T00:00:00Z and 2026-03-02T05:00:00.5Z", got["since"], got["until"])
	}
}

// A "+" in an offset sent unescaped (curl, a browser's address bar) arrives
// as a space; it is taken as the "+" it was, not refused. Other spaces are
// still refused.
func TestHistoryTakesAnUnescapedPlusInAnOffset(t *testing.T) {
	h := &queryHistory{}
	e := newEnvWithDeps(t, nil, func(_ *env, d *httpapi.Deps) { d.History = edge.NewRunHistoryHandler(h) })
	readJSON(t, e.do("GET", "/v1/runs?since=2026-03-01T09:00:00+02:00", ""), 200)
	got := readJSON(t, e.do("GET", "/v1/usage?until=2026-03-01T09:00:00+02:00", ""), 200)
	if got["until"] != "2026-03-01T07:00:00Z" {
		t.Fatalf("until %v, want 2026-03-01T07:00:00Z", got["until"])
	}
	h.mu.Lock()
	if len(h.runs) != 1 || !h.runs[0].Since.Equal(time.Date(2026, 3, 1, 7, 0, 0, 0, time.UTC)) {
		t.Fatalf("run queries %+v", h.runs)
	}
	h.mu.Unlock()
	for _, q := range []string{"/v1/runs?since=2026-03-01+09:00:00", "/v1/runs?since=2026-03-01T09:00:00+-02:00", "/v1/runs?since=+2026-03-01"} {
		wantError(t, e.do("GET", q, ""), 400, "invalid_request")
	}
}

// since after until within one second is refused naming both as given, to
// the nanosecond: at whole seconds the message read "since (…:00Z) must be
// before until (…:00Z)", the same time twice.
func TestHistoryRangeErrorShowsTheBoundsExactly(t *testing.T) {
	e := newEnvWithDeps(t, nil, func(_ *env, d *httpapi.Deps) { d.History = edge.NewRunHistoryHandler(&queryHistory{}) })
	m := readJSON(t, e.do("GET", "/v1/runs?since=2026-03-01T09:00:00.5%2B02:00&until=2026-03-01T07:00:00.25Z", ""), 400)
	msg, _ := m["error"].(map[string]any)["message"].(string)
	if !strings.Contains(msg, "since (2026-03-01T07:00:00.5Z) must be before until (2026-03-01T07:00:00.25Z)") {
		t.Fatalf("message %q", msg)
	}
}

// downHistory is an edge history whose database is unreachable.
type downHistory struct{ queryHistory }

func (h *downHistory) ListRuns(context.Context, domain.RunQuery) (domain.RunPage, error) {
	return domain.RunPage{}, errors.New("list runs: dial tcp 127.0.0.1:5432: connect: connection refused")
}

// A history read the database fails is answered 503 history_unavailable,
// and its log line says so: it read "internal error answered as 500"
// beside an access line of 503, sending the operator after a 500 that
// never went out.
func TestHistoryUnavailableIsLoggedWithTheStatusAnswered(t *testing.T) {
	buf := &lockedBuf{}
	e := newEnvWithDeps(t, nil, func(e *env, d *httpapi.Deps) {
		e.log = slog.New(slog.NewJSONHandler(buf, nil))
		d.History = edge.NewRunHistoryHandler(&downHistory{})
	})
	wantError(t, e.do("GET", "/v1/runs", ""), 503, "history_unavailable")
	var line map[string]any
	buf.mu.Lock()
	logged := buf.b.String()
	buf.mu.Unlock()
	for _, l := range strings.Split(logged, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["level"] == "ERROR" {
			line = m
		}
	}
	if line == nil {
		t.Fatalf("no error line for the failed read in %s", logged)
	}
	if msg, _ := line["msg"].(string); strings.Contains(msg, "500") || line["status"] != float64(503) ||
		!strings.Contains(fmt.Sprint(line["err"]), "connection refused") {
		t.Fatalf("error line %v: want the status answered (503) and the detail", line)
	}
}

// downGetHistory is downHistory whose GetRun fails too.
type downGetHistory struct{ downHistory }

func (h *downGetHistory) GetRun(context.Context, string) (domain.RunRecord, error) {
	return domain.RunRecord{}, errors.New("read run: dial tcp 127.0.0.1:5432: connect: connection refused")
}

// GET /v1/runs/{id} while the history's database is down answers a run a
// connected node knows from that node's store, as for a run the history
// lacks; one no node knows is still 503 history_unavailable (not 404: the
// history may have it). It answered 503 for every run.
func TestHistoryRunFallsBackToTheNodeWhileTheHistoryIsDown(t *testing.T) {
	link := newFakeLink()
	link.command = func(_ context.Context, name string, args []byte) (ports.CommandStream, error) {
		if name == "run_get" && strings.Contains(string(args), `"run_live"`) {
			return &fakeCmdStream{replies: []ports.CommandReply{{Final: true, Result: []byte(
				`{"run_id":"run_live","adapter":"exec","status":"running","background":true,"created_at":"2026-01-01T00:00:01Z"}`)}}}, nil
		}
		return &fakeCmdStream{replies: []ports.CommandReply{{Final: true, Err: domain.Errorf(domain.CodeRunNotFound, "nope")}}}, nil
	}
	e := newEnvWithDeps(t, nil, func(_ *env, d *httpapi.Deps) {
		d.History = edge.NewRunHistoryHandler(&downGetHistory{})
	}, testNode{"n1", link})
	m := readJSON(t, e.do("GET", "/v1/runs/run_live", ""), 200)
	if m["run_id"] != "run_live" || m["node"] != "n1" || m["status"] != "running" {
		t.Fatalf("run with the history down: %v", m)
	}
	wantError(t, e.do("GET", "/v1/runs/run_gone", ""), 503, "history_unavailable")
}
