package edge_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
	"iop/internal/lockedbuf"
)

const (
	ucTokA = "reload-token-a-0123456789"
	ucTokB = "reload-token-b-0123456789"
	ucTokC = "reload-token-c-0123456789"
)

func ucReloadRecords() []domain.NodeRecord {
	return []domain.NodeRecord{
		{ID: "a", Token: ucTokA, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 2, "upper")}},
		{ID: "b", Token: ucTokB, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 2, "upper")}},
		{ID: "c", Token: ucTokC, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 2, "upper")}},
	}
}

func TestReloadUseCase(t *testing.T) {
	edit := func(f func(recs []domain.NodeRecord) []domain.NodeRecord) []domain.NodeRecord {
		return f(ucReloadRecords())
	}
	tests := []struct {
		name      string
		next      []domain.NodeRecord
		loadErr   error
		pushErr   map[string]error
		wantCode  string
		want      edge.ReloadResult
		wantClose map[string]string // node → reason its link was closed with
		// wantAdapters is the exec target set each refreshed node now has.
		wantTargets map[string][]string
	}{
		{name: "invalid source changes nothing",
			loadErr:  errors.New("edge.yaml:12: field tokn not found in type config.NodeEntry"),
			wantCode: domain.CodeConfigError},
		{name: "unchanged pushes nothing",
			next: ucReloadRecords(),
			want: edge.ReloadResult{Nodes: 3, Unchanged: []string{"a", "b", "c"}}},
		{name: "changed adapters are pushed",
			next: edit(func(r []domain.NodeRecord) []domain.NodeRecord {
				r[0].Adapters = []domain.AdapterConfig{ucExecAdapter("exec", 2, "upper", "lower")}
				return r
			}),
			want:        edge.ReloadResult{Nodes: 3, Refreshed: []string{"a"}, Unchanged: []string{"b", "c"}},
			wantTargets: map[string][]string{"a": {"lower", "upper"}}},
		{name: "removed node and changed token are disconnected",
			next: edit(func(r []domain.NodeRecord) []domain.NodeRecord {
				r[2].Token = "reload-token-c-rotated-000"
				return r[1:]
			}),
			want:      edge.ReloadResult{Nodes: 2, Disconnected: []string{"a", "c"}, Unchanged: []string{"b"}},
			wantClose: map[string]string{"a": "removed from config", "c": "token changed"}},
		{name: "a push that fails is reported and the old config stays",
			next: edit(func(r []domain.NodeRecord) []domain.NodeRecord {
				r[0].Adapters[0].MaxConcurrency = 9
				r[1].Adapters[0].MaxConcurrency = 9
				return r
			}),
			pushErr:     map[string]error{"a": domain.Errorf(domain.CodeConfigError, "the node cannot build it")},
			want:        edge.ReloadResult{Nodes: 3, Refreshed: []string{"b"}, Unchanged: []string{"c"}, Failed: []string{"a: config_error: the node cannot build it"}},
			wantTargets: map[string][]string{"b": {"upper"}}},
		{name: "a record that cannot be built rejects the whole reload",
			next: edit(func(r []domain.NodeRecord) []domain.NodeRecord {
				r[0].Adapters = append(r[0].Adapters, domain.AdapterConfig{Name: "x"})
				r[1].Adapters[0].MaxConcurrency = 9
				return r
			}),
			wantCode: domain.CodeConfigError},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir, reg, bus := &ucDir{recs: ucReloadRecords()}, edge.NewRegistry(), newUCBus()
			versions := &edge.ConfigVersions{}
			reg1 := edge.NewRegisterHandler(dir, reg, bus, versions, nil)
			links := map[string]*ucLink{}
			before := map[string]domain.NodeConfig{}
			for id, tok := range map[string]string{"a": ucTokA, "b": ucTokB, "c": ucTokC} {
				l := &ucLink{id: id, pushErr: tc.pushErr[id]}
				l.onClose = func(reason string) { reg1.Disconnected(id, l, reason) } // as the transport does
				cfg, err := reg1.Register(context.Background(), tok, domain.NodeInfo{}, "r-"+id, l)
				if err != nil {
					t.Fatalf("register %s: %v", id, err)
				}
				links[id], before[id] = l, cfg
			}
			busBefore := len(bus.all())
			oldRecs := dir.Records()

			h := edge.NewReloadHandler(&ucSource{recs: tc.next, err: tc.loadErr}, dir, reg, bus, versions, nil)
			res, err := h.Handle(context.Background())
			if got := ucCode(err); got != tc.wantCode {
				t.Fatalf("Handle = %+v, %v (code %q), want code %q", res, err, got, tc.wantCode)
			}
			newEvents := bus.all()[busBefore:]
			if tc.wantCode != "" {
				if dir.replacements() != 0 || !reflect.DeepEqual(dir.Records(), oldRecs) {
					t.Fatal("a rejected reload changed the directory")
				}
				if len(newEvents) != 0 {
					t.Fatalf("a rejected reload published %s", ucDescribe(newEvents))
				}
				for id, l := range links {
					_, _, _, _, pushed, closes := l.snapshot()
					if len(pushed) != 0 || len(closes) != 0 {
						t.Fatalf("node %s: pushed %v, closed %v after a rejected reload", id, pushed, closes)
					}
					if n, ok := reg.Get(id); !ok || !reflect.DeepEqual(n.Config, before[id]) {
						t.Fatalf("node %s changed after a rejected reload: %+v", id, n)
					}
				}
				return
			}
			ucNormalize := func(s []string) []string {
				if s == nil {
					return []string{}
				}
				return s
			}
			want := tc.want
			want.Refreshed, want.Disconnected, want.Unchanged = ucNormalize(want.Refreshed), ucNormalize(want.Disconnected), ucNormalize(want.Unchanged)
			if !reflect.DeepEqual(res, want) {
				t.Fatalf("result = %+v, want %+v", res, want)
			}
			if !reflect.DeepEqual(dir.Records(), tc.next) {
				t.Fatal("the directory does not hold the new records")
			}
			for id, l := range links {
				_, _, _, _, pushed, closes := l.snapshot()
				// Pushes.
				if targets, ok := tc.wantTargets[id]; ok {
					if len(pushed) != 1 {
						t.Fatalf("node %s got %d pushes, want 1", id, len(pushed))
					}
					cfg := pushed[0]
					if cfg.Version <= before[id].Version || cfg.NodeID != id {
						t.Fatalf("node %s pushed %+v, want a version above %d", id, cfg, before[id].Version)
					}
					var got []string
					for name := range cfg.Adapters[0].Targets {
						got = append(got, name)
					}
					slices.Sort(got)
					if !slices.Equal(got, targets) {
						t.Fatalf("node %s pushed targets %v, want %v", id, got, targets)
					}
					if n, _ := reg.Get(id); !reflect.DeepEqual(n.Config, cfg) {
						t.Fatalf("registry config of %s = %+v, want the pushed %+v", id, n.Config, cfg)
					}
					if !slices.ContainsFunc(newEvents, func(ev domain.BusEvent) bool {
						return ev.Type == domain.BusNodeConfigRefreshed && ev.Node == id
					}) {
						t.Fatalf("no node.config_refreshed for %s: %s", id, ucDescribe(newEvents))
					}
				} else {
					if len(pushed) != 0 {
						t.Fatalf("node %s got pushes %+v, want none", id, pushed)
					}
					if slices.ContainsFunc(newEvents, func(ev domain.BusEvent) bool {
						return ev.Type == domain.BusNodeConfigRefreshed && ev.Node == id
					}) {
						t.Fatalf("node.config_refreshed for %s without a push", id)
					}
					if n, ok := reg.Get(id); ok && !reflect.DeepEqual(n.Config, before[id]) {
						t.Fatalf("registry config of %s changed without a push", id)
					}
				}
				// Disconnects.
				if reason, ok := tc.wantClose[id]; ok {
					if !slices.Equal(closes, []string{reason}) {
						t.Fatalf("node %s closed with %v, want [%s]", id, closes, reason)
					}
					if _, still := reg.Get(id); still {
						t.Fatalf("node %s is still registered", id)
					}
					if !slices.ContainsFunc(newEvents, func(ev domain.BusEvent) bool {
						return ev.Type == domain.BusNodeDisconnected && ev.Node == id && ev.Reason == reason
					}) {
						t.Fatalf("no node.disconnected for %s with reason %q: %s", id, reason, ucDescribe(newEvents))
					}
				} else if len(closes) != 0 {
					t.Fatalf("node %s closed: %v", id, closes)
				}
			}
			if !slices.ContainsFunc(newEvents, func(ev domain.BusEvent) bool { return ev.Type == domain.BusConfigReloaded }) {
				t.Fatalf("no config.reloaded event: %s", ucDescribe(newEvents))
			}
		})
	}
}

// TestReloadRetriesAFailedPush: a node whose push failed still runs its old
// config, so reloading the same file pushes to it again (it is not
// "unchanged": the comparison is with what the node runs).
func TestReloadRetriesAFailedPush(t *testing.T) {
	dir, reg, bus := &ucDir{recs: ucReloadRecords()}, edge.NewRegistry(), newUCBus()
	versions := &edge.ConfigVersions{}
	reg1 := edge.NewRegisterHandler(dir, reg, bus, versions, nil)
	l := &ucLink{id: "a", pushErr: domain.Errorf(domain.CodeConfigError, "the node cannot build it")}
	if _, err := reg1.Register(context.Background(), ucTokA, domain.NodeInfo{}, "r-a", l); err != nil {
		t.Fatal(err)
	}
	next := ucReloadRecords()
	next[0].Adapters[0].MaxConcurrency = 9
	h := edge.NewReloadHandler(&ucSource{recs: next}, dir, reg, bus, versions, nil)
	if res, err := h.Handle(context.Background()); err != nil || len(res.Failed) != 1 {
		t.Fatalf("first reload = %+v, %v; want a's push failed", res, err)
	}
	l.mu.Lock()
	l.pushErr = nil // the node answers now
	l.mu.Unlock()
	res, err := h.Handle(context.Background())
	if err != nil || !slices.Contains(res.Refreshed, "a") {
		t.Fatalf("second reload of the same file = %+v, %v; want a refreshed", res, err)
	}
	if n, _ := reg.Get("a"); n.Config.Adapters[0].MaxConcurrency != 9 {
		t.Fatalf("a runs max_concurrency %d, want 9", n.Config.Adapters[0].MaxConcurrency)
	}
	if res, _ := h.Handle(context.Background()); !slices.Contains(res.Unchanged, "a") {
		t.Fatalf("third reload = %+v; want a unchanged now", res)
	}
}

// A node's token given another way — its token_sha256 in either case of
// hex, or the token again — is the same token: reload keeps the node
// connected and pushes nothing. The check is by digest, so a digest of
// another token still disconnects it.
func TestReloadKeepsANodeWhoseTokenIsGivenAnotherWay(t *testing.T) {
	sum := sha256.Sum256([]byte(ucTokA))
	digest := hex.EncodeToString(sum[:])
	other := sha256.Sum256([]byte(ucTokB + "-rotated"))
	with := func(tok, digest string) []domain.NodeRecord {
		return []domain.NodeRecord{{ID: "a", Token: tok, TokenSHA256: digest, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 2, "upper")}}}
	}
	dir, reg, bus := &ucDir{recs: with(ucTokA, "")}, edge.NewRegistry(), newUCBus()
	versions := &edge.ConfigVersions{}
	rh := edge.NewRegisterHandler(dir, reg, bus, versions, nil)
	l := &ucLink{id: "a"}
	l.onClose = func(reason string) { rh.Disconnected("a", l, reason) }
	if _, err := rh.Register(context.Background(), ucTokA, domain.NodeInfo{}, "r-a", l); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name string
		recs []domain.NodeRecord
	}{
		{"token to token_sha256", with("", digest)},
		{"lower to upper case hex", with("", strings.ToUpper(digest))},
		{"token_sha256 back to the token", with(ucTokA, "")},
	} {
		res, err := edge.NewReloadHandler(&ucSource{recs: step.recs}, dir, reg, bus, versions, nil).Handle(context.Background())
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		_, _, _, _, pushed, closes := l.snapshot()
		if len(closes) != 0 || !slices.Equal(res.Unchanged, []string{"a"}) || len(pushed) != 0 {
			t.Fatalf("%s: closes=%v pushed=%d result=%+v; want the node kept, unchanged", step.name, closes, len(pushed), res)
		}
	}
	res, err := edge.NewReloadHandler(&ucSource{recs: with("", hex.EncodeToString(other[:]))}, dir, reg, bus, versions, nil).Handle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, _, _, closes := l.snapshot(); !slices.Equal(closes, []string{"token changed"}) || !slices.Equal(res.Disconnected, []string{"a"}) {
		t.Fatalf("digest of another token: closes=%v result=%+v; want a disconnected, token changed", closes, res)
	}
}

// stuckPushLink is a node that never answers a config push: PushConfig
// waits for its context, counting the pushes waiting at once in gauge.
type stuckPushLink struct {
	*ucLink
	gauge *pushGauge
}

type pushGauge struct {
	mu            sync.Mutex
	now, max, all int
}

func (g *pushGauge) read() (now, max, all int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.now, g.max, g.all
}

func (l *stuckPushLink) PushConfig(ctx context.Context, _ domain.NodeConfig) error {
	g := l.gauge
	g.mu.Lock()
	g.now++
	g.all++
	g.max = max(g.max, g.now)
	g.mu.Unlock()
	<-ctx.Done()
	g.mu.Lock()
	g.now--
	g.mu.Unlock()
	return ctx.Err()
}

// A reload pushes to the changed nodes side by side, so nodes that never
// answer hold it up for one push timeout, not one per node; at most 16 are
// in flight at once. The pushes here wait until the reload's context ends
// (the edge stopping), far beyond the test's deadline, so a reload pushing
// one node at a time never gets 16 of them waiting.
func TestReloadPushesToChangedNodesConcurrently(t *testing.T) {
	ucNoLeaks(t)
	const nodes, bound = 20, 16
	var recs, next []domain.NodeRecord
	for i := range nodes {
		id := fmt.Sprintf("n%02d", i)
		recs = append(recs, domain.NodeRecord{ID: id, Token: "stuck-push-token-" + id, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 2, "upper")}})
		next = append(next, domain.NodeRecord{ID: id, Token: "stuck-push-token-" + id, Adapters: []domain.AdapterConfig{ucExecAdapter("exec", 3, "upper")}})
	}
	dir, reg, bus := &ucDir{recs: recs}, edge.NewRegistry(), newUCBus()
	versions := &edge.ConfigVersions{}
	rh := edge.NewRegisterHandler(dir, reg, bus, versions, nil)
	gauge := &pushGauge{}
	for _, r := range recs {
		l := &stuckPushLink{ucLink: &ucLink{id: r.ID}, gauge: gauge}
		if _, err := rh.Register(context.Background(), r.Token, domain.NodeInfo{}, "r-"+r.ID, l); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type outcome struct {
		res edge.ReloadResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := edge.NewReloadHandler(&ucSource{recs: next}, dir, reg, bus, versions, nil).Handle(ctx)
		done <- outcome{res, err}
	}()
	ucEventually(t, fmt.Sprintf("%d pushes waiting at once", bound), func() bool {
		now, _, _ := gauge.read()
		return now >= bound
	})
	cancel()
	var out outcome
	select {
	case out = <-done:
	case <-time.After(ucWait):
		t.Fatal("the reload did not return once its context ended")
	}
	if out.err != nil {
		t.Fatal(out.err)
	}
	if _, most, all := gauge.read(); most > bound || all != nodes {
		t.Fatalf("%d pushes, at most %d at once; want %d, at most %d at once", all, most, nodes, bound)
	}
	if len(out.res.Failed) != nodes || !slices.IsSorted(out.res.Failed) {
		t.Fatalf("failed = %q, want every node's push, sorted", out.res.Failed)
	}
}

// Settings outside the node directory that changed in the source are named
// in the answer and in one warning (names only): the nodes are applied, the
// rest waits for a restart.
func TestReloadNamesSettingsThatNeedARestart(t *testing.T) {
	dir, reg, bus := &ucDir{recs: ucReloadRecords()}, edge.NewRegistry(), newUCBus()
	var logs lockedbuf.Buffer
	src := &ucSource{recs: ucReloadRecords(), needsRestart: []string{"http.api_keys", "transport.max_frame_size"}}
	h := edge.NewReloadHandler(src, dir, reg, bus, &edge.ConfigVersions{}, slog.New(slog.NewTextHandler(&logs, nil)))
	res, err := h.Handle(context.Background())
	if err != nil || !slices.Equal(res.NeedsRestart, src.needsRestart) || res.Nodes != 3 {
		t.Fatalf("Handle = %+v, %v; want 3 nodes and needs_restart %v", res, err, src.needsRestart)
	}
	if dir.replacements() != 1 {
		t.Fatal("the nodes were not applied")
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), `needs_restart="[http.api_keys transport.max_frame_size]"`) {
		t.Fatalf("want one warning naming the settings:\n%s", logs.String())
	}
	// Nothing to restart for: no warning, and the answer leaves the list out.
	before := len(logs.String())
	src.needsRestart = nil
	res, err = h.Handle(context.Background())
	if later := logs.String()[before:]; err != nil || res.NeedsRestart != nil || strings.Contains(later, "level=WARN") {
		t.Fatalf("Handle = %+v, %v; logs:\n%s", res, err, later)
	}
}

// Accepted hears of a reload once its records are in force, and of no
// reload refused: a source that cannot be read, or a node whose config
// does not build, leaves the old records, and what is said of the new
// ones (the edge warns of an API key limited to a node they no longer
// list) would not be true.
func TestReloadCallsAcceptedOnlyForAnAcceptedReload(t *testing.T) {
	dir, reg, bus := &ucDir{recs: ucReloadRecords()}, edge.NewRegistry(), newUCBus()
	src := &ucSource{}
	h := edge.NewReloadHandler(src, dir, reg, bus, &edge.ConfigVersions{}, slog.New(slog.DiscardHandler))
	var got [][]string
	h.Accepted = func(recs []domain.NodeRecord) {
		var ids []string
		for _, r := range recs {
			ids = append(ids, r.ID)
		}
		got = append(got, ids)
	}
	src.err = errors.New("edge.yaml: bad")
	if _, err := h.Handle(context.Background()); err == nil {
		t.Fatal("an unreadable source was accepted")
	}
	src.err, src.recs = nil, []domain.NodeRecord{{ID: "a", Token: ucTokA}, {ID: "bad", Token: ucTokB, Adapters: []domain.AdapterConfig{{Name: "x"}}}}
	if _, err := h.Handle(context.Background()); domain.CodeOf(err) != domain.CodeConfigError {
		t.Fatalf("a node whose config does not build: %v, want config_error", err)
	}
	if len(got) != 0 || dir.replacements() != 0 {
		t.Fatalf("refused reloads: Accepted called with %v, directory replaced %d times", got, dir.replacements())
	}
	src.recs = ucReloadRecords()[:2]
	if _, err := h.Handle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !slices.Equal(got[0], []string{"a", "b"}) || dir.replacements() != 1 {
		t.Fatalf("an accepted reload: Accepted called with %v (want once, with a and b), directory replaced %d times", got, dir.replacements())
	}
}
