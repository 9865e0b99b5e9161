package openaiapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	openaiapi "iop/adapters/http/openai"
	"iop/adapters/provider/models"
	"iop/adapters/store/edgestore"
	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// historyEnv is newEnv's edge with a history: its tunnels are recorded in
// hist, and it recalls from resp the stored responses it does not
// remember.
func historyEnv(t *testing.T, hist ports.RunHistory, resp ports.ResponseHistory) *env {
	t.Helper()
	e := &env{reg: edge.NewRegistry(), ledger: edge.NewUsageLedger(), bus: &fakeBus{}}
	e.catalog = edge.NewModelCatalog(e.reg, models.Lists{}, nil)
	tunnels := edge.NewSubmitProviderTunnelHandler(e.reg, e.bus, e.catalog, e.ledger, nil)
	tunnels.Observe = edge.Observers{History: hist}
	tunnels.Responses = resp
	e.h = openaiapi.New(openaiapi.Deps{Tunnels: tunnels, Models: e.catalog}, nil)
	e.srv = httptest.NewServer(e.h)
	t.Cleanup(e.srv.Close)
	return e
}

// as serves e's handler to callers of key name with scopes.
func (e *env) as(t *testing.T, name string, scopes ...string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.h.ServeHTTP(w, r.WithContext(domain.WithPrincipal(r.Context(), domain.Principal{Name: name, Scopes: scopes})))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// openHistory opens the SQLite edge history at path.
func openHistory(t *testing.T, path string) *edgestore.Store {
	t.Helper()
	db, err := edgestore.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	s := edgestore.New(db, edgestore.Options{EdgeID: "e1", Retention: -1, FlushInterval: 10 * time.Millisecond})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// A stored response stays its creating key's after the edge restarts (or
// forgets its id among 10,000 newer ones): the edge finds in its history
// which key, node and provider created it. Another key — its node pinned
// with X-IOP-Node, as the id alone used to need — is refused as for a
// remembered response, without reaching the provider; the creating key's
// follow-ups go to that node and provider without a pin.
func TestResponsesStayTheirKeysAcrossARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.db")
	created := `{"id":"resp_x","object":"response","status":"completed","output":"the secret"}`
	nodes := func(e *env) (a, b *fakeLink) {
		a = e.node(t, "a", serve(response(200, "application/json", created)...),
			provider("p", domain.ProviderOpenAI, "m"), provider("q", domain.ProviderOpenAI, "m2"))
		b = e.node(t, "b", serve(response(200, "application/json", `{"id":"resp_b"}`)...), provider("p", domain.ProviderOpenAI, "m", "m2"))
		return a, b
	}

	st := openHistory(t, path)
	e := historyEnv(t, st, st)
	a, _ := nodes(e)
	x := e.as(t, "x", domain.ScopeInference)
	if got := readAll(t, do(t, http.MethodPost, x.URL+"/v1/responses", `{"model":"m2"}`, "X-IOP-Node", "a")); got != created {
		t.Fatalf("create: %q", got)
	}
	if o := a.last(t); o.req.Provider != "q" {
		t.Fatalf("the create went to provider %q, want q", o.req.Provider)
	}
	waitFor(t, "the create in the history", func() bool {
		_, found, err := st.ResponseOrigin(context.Background(), "resp_x")
		return err == nil && found
	})
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// The edge restarts: a new handler that remembers nothing, on the same
	// history.
	st = openHistory(t, path)
	e = historyEnv(t, st, st)
	a, b := nodes(e)
	x, y, ops := e.as(t, "x", domain.ScopeInference), e.as(t, "y", domain.ScopeInference), e.as(t, "ops", domain.ScopeAdmin)
	for _, c := range []struct{ method, path, body, code string }{
		{http.MethodGet, "/v1/responses/resp_x", "", "response_not_found"},
		{http.MethodDelete, "/v1/responses/resp_x", "", "response_not_found"},
		{http.MethodPost, "/v1/responses/resp_x/cancel", "", "response_not_found"},
		{http.MethodGet, "/v1/responses/resp_x/input_items", "", "response_not_found"},
		{http.MethodPost, "/v1/responses", `{"model":"m2","previous_response_id":"resp_x"}`, "previous_response_not_found"},
		{http.MethodPost, "/v1/responses/input_tokens", `{"model":"m2","previous_response_id":"resp_x"}`, "previous_response_not_found"},
	} {
		resp := do(t, c.method, y.URL+c.path, c.body, "X-IOP-Node", "a")
		if got := readAll(t, resp); resp.StatusCode != 404 || !strings.Contains(got, `"`+c.code+`"`) || strings.Contains(got, "secret") {
			t.Errorf("y after a restart: %s %s = %d %s, want 404 %s", c.method, c.path, resp.StatusCode, got, c.code)
		}
	}
	if a.count() != 0 || b.count() != 0 {
		t.Fatalf("another key's follow-ups reached a node (a: %d, b: %d tunnels)", a.count(), b.count())
	}
	// The creating key, and an admin key, follow it up at its node and
	// provider, with no pin (two nodes serve the OpenAI API).
	for i, srv := range []*httptest.Server{x, ops} {
		resp := do(t, http.MethodGet, srv.URL+"/v1/responses/resp_x", "")
		if got := readAll(t, resp); resp.StatusCode != 200 || got != created {
			t.Fatalf("follow-up %d after a restart: %d %s", i, resp.StatusCode, got)
		}
		if o := a.last(t); a.count() != i+1 || o.req.Path != "/v1/responses/resp_x" || o.req.Provider != "q" {
			t.Fatalf("follow-up %d went to %+v (%d tunnels on a)", i, o.req, a.count())
		}
	}
	// A continuation of it goes there too, over a less busy node's pin.
	if got := readAll(t, do(t, http.MethodPost, x.URL+"/v1/responses", `{"model":"m2","previous_response_id":"resp_x"}`, "X-IOP-Node", "b")); got != created {
		t.Fatalf("continuation: %q", got)
	}
	if o := a.last(t); a.count() != 3 || o.req.Provider != "q" || b.count() != 0 {
		t.Fatalf("continuation went to %+v (a: %d, b: %d tunnels)", o.req, a.count(), b.count())
	}
}

// failingResponses is a history that cannot be read.
type failingResponses struct{}

func (failingResponses) ResponseOrigin(context.Context, string) (domain.TunnelRecord, bool, error) {
	return domain.TunnelRecord{}, false, errors.New("connection refused")
}

// A history that cannot be read cannot say whose a response the edge does
// not remember is: a key is refused (503 history_unavailable) rather than
// risk another key's response; an admin key's follow-up goes on as one of
// an id the history does not hold.
func TestResponseFollowUpWithoutAReadableHistory(t *testing.T) {
	e := historyEnv(t, nil, failingResponses{})
	a := e.node(t, "a", serve(response(200, "application/json", `{"id":"resp_x"}`)...), provider("p", domain.ProviderOpenAI, "m"))
	y, ops := e.as(t, "y", domain.ScopeInference), e.as(t, "ops", domain.ScopeAdmin)
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/responses/resp_x", ""},
		{http.MethodPost, "/v1/responses", `{"model":"m","previous_response_id":"resp_x"}`},
	} {
		resp := do(t, c.method, y.URL+c.path, c.body)
		if got := readAll(t, resp); resp.StatusCode != 503 || !strings.Contains(got, `"history_unavailable"`) {
			t.Errorf("y: %s %s = %d %s, want 503 history_unavailable", c.method, c.path, resp.StatusCode, got)
		}
	}
	if a.count() != 0 {
		t.Fatal("a follow-up whose owner is unknown reached the provider")
	}
	resp := do(t, http.MethodGet, ops.URL+"/v1/responses/resp_x", "")
	if got := readAll(t, resp); resp.StatusCode != 200 || a.count() != 1 {
		t.Fatalf("admin: %d %s (%d tunnels)", resp.StatusCode, got, a.count())
	}
}

// fixedResponses is a history that recalls one stored response.
type fixedResponses struct{ rec domain.TunnelRecord }

func (f fixedResponses) ResponseOrigin(_ context.Context, id string) (domain.TunnelRecord, bool, error) {
	return f.rec, id == f.rec.Response, nil
}

// A response the history recalls as created on a node not connected here
// (another edge's, sharing a PostgreSQL history behind one load balancer;
// a node gone since) is routed for its key as an id the edge does not
// know — the pin, the only node, the model — instead of a 404 naming the
// absent node; another key is refused still.
func TestRecalledResponseOfANodeNotConnectedHere(t *testing.T) {
	e := historyEnv(t, nil, fixedResponses{domain.TunnelRecord{Response: "resp_x", Node: "other-edges", Provider: "p", Key: "x"}})
	b := e.node(t, "b", serve(response(200, "application/json", `{"id":"resp_x","object":"response"}`)...), provider("p", domain.ProviderOpenAI, "m"))
	c := e.node(t, "c", serve(response(200, "application/json", `{"id":"resp_c"}`)...), provider("p", domain.ProviderOpenAI, "m"))
	x, y := e.as(t, "x", domain.ScopeInference), e.as(t, "y", domain.ScopeInference)

	if resp := do(t, http.MethodGet, x.URL+"/v1/responses/resp_x", "", "X-IOP-Node", "b"); resp.StatusCode != 200 || b.count() != 1 {
		t.Fatalf("x's pinned follow-up: %d %s (b: %d tunnels)", resp.StatusCode, readAll(t, resp), b.count())
	}
	resp := do(t, http.MethodPost, x.URL+"/v1/responses", `{"model":"m","previous_response_id":"resp_x"}`)
	if got := readAll(t, resp); resp.StatusCode != 200 || b.count()+c.count() != 2 {
		t.Fatalf("x's continuation: %d %s (b: %d, c: %d tunnels)", resp.StatusCode, got, b.count(), c.count())
	}
	for _, req := range [][3]string{
		{http.MethodGet, "/v1/responses/resp_x", ""},
		{http.MethodPost, "/v1/responses", `{"model":"m","previous_response_id":"resp_x"}`},
	} {
		resp := do(t, req[0], y.URL+req[1], req[2], "X-IOP-Node", "b")
		if got := readAll(t, resp); resp.StatusCode != 404 || b.count()+c.count() != 2 {
			t.Fatalf("y: %s %s = %d %s", req[0], req[1], resp.StatusCode, got)
		}
	}
}

// Counting a continuation's input tokens needs no model when the previous
// response's node is connected; when the caller's response was created on
// a node not connected here, the refusal says so, rather than suggesting
// the response was not created through this edge.
func TestInputTokensOfAResponseWhoseNodeIsAway(t *testing.T) {
	e := historyEnv(t, nil, fixedResponses{domain.TunnelRecord{Response: "resp_x", Node: "gone", Provider: "p", Key: "x"}})
	b := e.node(t, "b", serve(response(200, "application/json", `{"object":"response.input_tokens","input_tokens":3}`)...), provider("p", domain.ProviderOpenAI, "m"))
	x := e.as(t, "x", domain.ScopeInference)
	resp := do(t, http.MethodPost, x.URL+"/v1/responses/input_tokens", `{"previous_response_id":"resp_x","input":"hi"}`)
	if got := readAll(t, resp); resp.StatusCode != 400 || !strings.Contains(got, `created on node \"gone\", which is not connected`) || b.count() != 0 {
		t.Fatalf("no model, node away: %d %s (b: %d tunnels)", resp.StatusCode, got, b.count())
	}
	resp = do(t, http.MethodPost, x.URL+"/v1/responses/input_tokens", `{"previous_response_id":"resp_x","input":"hi","model":"m"}`)
	if got := readAll(t, resp); resp.StatusCode != 200 || b.count() != 1 {
		t.Fatalf("with a model: %d %s", resp.StatusCode, got)
	}
}

// A background response is queued, with no usage, when created; the first
// retrieval that reports its usage counts it. So it is after the edge
// restarts (or forgets the id among 10,000 newer ones): the history says
// that no tunnel of it counted its usage yet, and then that one did — a
// retrieval after another restart counts nothing more. A response whose
// creation counted its usage is not counted again by its retrievals.
func TestRecalledBackgroundResponseUsageIsCountedOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.db")
	var polls atomic.Int32
	withUsage := func(js string, total int64) []step {
		return []step{status(200), header("Content-Type", "application/json"), body(js),
			{f: domain.TunnelFrame{Kind: domain.TunnelUsage, Usage: &domain.Usage{PromptTokens: total - 2, CompletionTokens: 2, TotalTokens: total}}},
			frame(domain.TunnelEnd)}
	}
	open := func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		switch {
		case req.Method == http.MethodPost && strings.Contains(string(req.Body), "background"):
			return newFakeStream(response(200, "application/json", `{"id":"resp_bg","status":"queued"}`)...), nil
		case req.Method == http.MethodPost:
			return newFakeStream(withUsage(`{"id":"resp_now","status":"completed"}`, 10)...), nil
		case strings.HasSuffix(req.Path, "resp_bg") && polls.Add(1) == 1:
			return newFakeStream(response(200, "application/json", `{"id":"resp_bg","status":"in_progress"}`)...), nil
		case strings.HasSuffix(req.Path, "resp_bg"):
			return newFakeStream(withUsage(`{"id":"resp_bg","status":"completed"}`, 100)...), nil
		}
		return newFakeStream(withUsage(`{"id":"resp_now","status":"completed"}`, 10)...), nil
	}
	tokens := func(e *env) (n int64) {
		for _, l := range e.ledger.Snapshot() {
			n += l.TotalTokens
		}
		return n
	}
	// restart starts the edge afresh on the history, once the tunnels
	// before have all reached it.
	var st *edgestore.Store
	restart := func(tunnels int64) *env {
		t.Helper()
		if st != nil {
			waitFor(t, "the tunnels in the history", func() bool {
				totals, err := st.Usage(context.Background(), domain.UsageQuery{GroupBy: domain.GroupByKey})
				return err == nil && len(totals) == 1 && totals[0].Tunnels == tunnels
			})
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
		}
		st = openHistory(t, path)
		e := historyEnv(t, st, st)
		e.node(t, "a", open, provider("p", domain.ProviderOpenAI, "m"))
		return e
	}

	e := restart(0)
	x := e.as(t, "x", domain.ScopeInference)
	readAll(t, do(t, http.MethodPost, x.URL+"/v1/responses", `{"model":"m"}`))
	readAll(t, do(t, http.MethodPost, x.URL+"/v1/responses", `{"model":"m","background":true}`))
	if got := tokens(e); got != 10 {
		t.Fatalf("tokens counted by the creations: %d, want 10 (resp_now's)", got)
	}

	e = restart(2)
	x = e.as(t, "x", domain.ScopeInference)
	for range 3 { // in progress, then completed twice
		readAll(t, do(t, http.MethodGet, x.URL+"/v1/responses/resp_bg", ""))
		readAll(t, do(t, http.MethodGet, x.URL+"/v1/responses/resp_now", ""))
	}
	if got := tokens(e); got != 100 {
		t.Fatalf("tokens counted by the retrievals after a restart: %d, want 100 (resp_bg's, once)", got)
	}

	e = restart(8)
	x = e.as(t, "x", domain.ScopeInference)
	readAll(t, do(t, http.MethodGet, x.URL+"/v1/responses/resp_bg", ""))
	readAll(t, do(t, http.MethodGet, x.URL+"/v1/responses/resp_now", ""))
	if got := tokens(e); got != 0 {
		t.Fatalf("tokens counted by the retrievals after a second restart: %d, want none", got)
	}
	waitFor(t, "the last tunnels in the history", func() bool {
		totals, err := st.Usage(context.Background(), domain.UsageQuery{GroupBy: domain.GroupByKey})
		return err == nil && len(totals) == 1 && totals[0].Tunnels == 10
	})
	totals, err := st.Usage(context.Background(), domain.UsageQuery{GroupBy: domain.GroupByKey})
	if err != nil || totals[0].TotalTokens != 110 {
		t.Fatalf("the history's usage: %+v, %v; want 110 tokens (10 for resp_now, 100 for resp_bg)", totals, err)
	}
}
