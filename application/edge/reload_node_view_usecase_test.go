package edge_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"iop/adapters/runtime/factory"
	"iop/application/edge"
	nodeapp "iop/application/node"
	"iop/domain"
	"iop/ports"
)

// ucApplyLink is a ucLink whose config pushes reach a real node runtime,
// as the transport delivers them.
type ucApplyLink struct {
	*ucLink
	apply *nodeapp.ApplyConfigHandler
}

func (l ucApplyLink) PushConfig(ctx context.Context, cfg domain.NodeConfig) error {
	return l.apply.ApplyConfig(ctx, cfg)
}

func ucAdapterNames(cfg domain.NodeConfig) []string {
	var out []string
	for _, a := range cfg.Adapters {
		out = append(out, a.Name)
	}
	slices.Sort(out)
	return out
}

// TestReloadTheNodeRefusesLeavesBothViewsAlike: a refresh the node cannot
// build in full is refused by it as a whole, so the config the edge keeps
// for it (its view on a failed push) is still the one the node runs.
func TestReloadTheNodeRefusesLeavesBothViewsAlike(t *testing.T) {
	ucNoLeaks(t)
	rt := nodeapp.NewRuntime(factory.New(map[string]factory.Builder{
		// This node has no ollama to run: a failure only the node can see.
		domain.AdapterOllama: func(domain.AdapterConfig) (ports.RuntimeAdapter, error) {
			return nil, errors.New("ollama is not installed on this node")
		},
	}), nil)
	link := ucApplyLink{ucLink: &ucLink{id: "gpu"}, apply: nodeapp.NewApplyConfigHandler(rt, nil)}

	const tok = "reload-token-gpu-0123456789"
	recs := []domain.NodeRecord{{ID: "gpu", Token: tok, Adapters: []domain.AdapterConfig{ucExecAdapter("old", 1, "t")}}}
	dir, reg, bus, versions := &ucDir{recs: recs}, edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}
	cfg, err := edge.NewRegisterHandler(dir, reg, bus, versions, nil).Register(context.Background(), tok, domain.NodeInfo{}, "r", link)
	if err != nil {
		t.Fatal(err)
	}
	if err := link.PushConfig(context.Background(), cfg); err != nil { // as the node does on registering
		t.Fatal(err)
	}

	next := []domain.NodeRecord{{ID: "gpu", Token: tok, Adapters: []domain.AdapterConfig{
		ucExecAdapter("new", 1, "t"),
		{Name: "llm", Type: domain.AdapterOllama, BaseURL: "http://127.0.0.1:11435", MaxConcurrency: 1},
	}}}
	res, err := edge.NewReloadHandler(&ucSource{recs: next}, dir, reg, bus, versions, nil).Handle(context.Background())
	if err != nil || len(res.Failed) != 1 {
		t.Fatalf("reload = %+v, %v; want gpu's refresh failed", res, err)
	}
	n, _ := reg.Get("gpu")
	var nodeSide []string
	for _, s := range rt.Statuses() {
		nodeSide = append(nodeSide, s.Name)
	}
	if edgeSide := ucAdapterNames(n.Config); !slices.Equal(edgeSide, nodeSide) {
		t.Fatalf("the edge believes gpu runs %v, gpu runs %v", edgeSide, nodeSide)
	}
	if _, v := rt.Version(); v != n.Config.Version {
		t.Fatalf("the edge believes gpu runs version %d, gpu runs %d", n.Config.Version, v)
	}
}

// TestReloadRefusesABaseURLWithoutScheme: a base_url the node's adapter
// would refuse is refused by the reload as a whole, naming node and
// adapter, before anything is pushed.
func TestReloadRefusesABaseURLWithoutScheme(t *testing.T) {
	const tok = "reload-token-gpu-0123456789"
	recs := []domain.NodeRecord{{ID: "gpu", Token: tok, Adapters: []domain.AdapterConfig{ucExecAdapter("old", 1, "t")}}}
	dir, reg, bus, versions := &ucDir{recs: recs}, edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}
	l := &ucLink{id: "gpu"}
	if _, err := edge.NewRegisterHandler(dir, reg, bus, versions, nil).Register(context.Background(), tok, domain.NodeInfo{}, "r", l); err != nil {
		t.Fatal(err)
	}
	next := []domain.NodeRecord{{ID: "gpu", Token: tok, Adapters: []domain.AdapterConfig{
		ucExecAdapter("new", 1, "t"),
		{Name: "llm", Type: domain.AdapterOllama, BaseURL: "127.0.0.1:11435"},
	}}}
	_, err := edge.NewReloadHandler(&ucSource{recs: next}, dir, reg, bus, versions, nil).Handle(context.Background())
	if ucCode(err) != domain.CodeConfigError || !strings.Contains(err.Error(), "node gpu") || !strings.Contains(err.Error(), `"llm"`) {
		t.Fatalf("reload = %v, want config_error naming node gpu and adapter llm", err)
	}
	if _, _, _, _, pushed, _ := l.snapshot(); len(pushed) != 0 {
		t.Fatalf("pushed %d configs for a refused reload", len(pushed))
	}
}

// ucReconnectingLink is a link whose node drops it while the edge pushes
// a config and registers again on a new link (getting the new config
// then): the push fails on the old link.
type ucReconnectingLink struct {
	*ucLink
	reconnect func()
}

func (l *ucReconnectingLink) PushConfig(context.Context, domain.NodeConfig) error {
	l.reconnect()
	return errors.New("connection closed")
}

// TestReloadCountsANodeBackWithTheNewConfigAsRefreshed: a node that
// reconnected while its push was failing got the new config when it
// registered; the reload reports it refreshed, not failed.
func TestReloadCountsANodeBackWithTheNewConfigAsRefreshed(t *testing.T) {
	ucNoLeaks(t)
	const tok = "reload-token-gpu-0123456789"
	recs := []domain.NodeRecord{{ID: "gpu", Token: tok, Adapters: []domain.AdapterConfig{ucExecAdapter("old", 1, "t")}}}
	dir, reg, bus, versions := &ucDir{recs: recs}, edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}
	regH := edge.NewRegisterHandler(dir, reg, bus, versions, nil)
	defer regH.Close()
	old := &ucReconnectingLink{ucLink: &ucLink{id: "gpu"}}
	old.reconnect = func() {
		reg.Remove("gpu", old)
		if _, err := regH.Register(context.Background(), tok, domain.NodeInfo{}, "r2", &ucLink{id: "gpu"}); err != nil {
			t.Errorf("re-register: %v", err)
		}
	}
	if _, err := regH.Register(context.Background(), tok, domain.NodeInfo{}, "r", old); err != nil {
		t.Fatal(err)
	}
	next := []domain.NodeRecord{{ID: "gpu", Token: tok, Adapters: []domain.AdapterConfig{ucExecAdapter("new", 1, "t")}}}
	res, err := edge.NewReloadHandler(&ucSource{recs: next}, dir, reg, bus, versions, nil).Handle(context.Background())
	if err != nil || len(res.Failed) != 0 || !slices.Equal(res.Refreshed, []string{"gpu"}) {
		t.Fatalf("reload = %+v, %v; want gpu refreshed", res, err)
	}
	if n, _ := reg.Get("gpu"); !slices.Equal(ucAdapterNames(n.Config), []string{"new"}) {
		t.Fatalf("the edge holds %v for gpu", ucAdapterNames(n.Config))
	}
}

// A reload by a caller limited to some nodes is refused before anything is
// read or pushed: it acts on every node, and its answer names them all.
func TestReloadRefusesANodeLimitedCaller(t *testing.T) {
	src := &ucSource{recs: nil}
	h := edge.NewReloadHandler(src, &ucDir{}, edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}, nil)
	ctx := domain.WithPrincipal(context.Background(), domain.Principal{Name: "n2-admin", Scopes: []string{domain.ScopeAdmin}, Nodes: []string{"n2"}})
	if _, err := h.Handle(ctx); ucCode(err) != domain.CodeForbidden {
		t.Fatalf("reload = %v, want forbidden", err)
	}
}

// A push whose answer never came may still be applied by the node after
// the edge stopped waiting: the edge kept routing by the old config (runs
// of a removed adapter sent there, runs of a new one refused). Its link is
// closed, so the node registers again and gets the new config; a node that
// answered with a refusal keeps its link and its old config.
func TestReloadUnansweredPushClosesTheLink(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		stopped bool // the reload is cancelled (the edge stops)
		closed  bool
	}{
		{"unanswered", domain.Errorf(domain.CodeTimeout, "waiting for config ack: context deadline exceeded"), false, true},
		{"refused", domain.Errorf(domain.CodeConfigError, "adapter \"llm\": ollama is not installed"), false, false},
		// The stop closes the links itself, saying why.
		{"edge stopping", domain.Errorf(domain.CodeCancelled, "stopped waiting for the config ack: context canceled"), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const tok = "reload-token-gpu-0123456789"
			recs := []domain.NodeRecord{{ID: "gpu", Token: tok, Adapters: []domain.AdapterConfig{ucExecAdapter("old", 1, "t")}}}
			dir, reg, bus, versions := &ucDir{recs: recs}, edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}
			l := &ucLink{id: "gpu"}
			if _, err := edge.NewRegisterHandler(dir, reg, bus, versions, nil).Register(context.Background(), tok, domain.NodeInfo{}, "r", l); err != nil {
				t.Fatal(err)
			}
			l.mu.Lock()
			l.pushErr = tc.err
			l.mu.Unlock()
			next := []domain.NodeRecord{{ID: "gpu", Token: tok, Adapters: []domain.AdapterConfig{ucExecAdapter("new", 1, "t")}}}
			ctx, cancel := context.WithCancel(context.Background())
			if tc.stopped {
				cancel()
			}
			defer cancel()
			res, err := edge.NewReloadHandler(&ucSource{recs: next}, dir, reg, bus, versions, nil).Handle(ctx)
			if err != nil || len(res.Failed) != 1 {
				t.Fatalf("reload = %+v, %v; want gpu's refresh failed", res, err)
			}
			l.mu.Lock()
			closes := slices.Clone(l.closes)
			l.mu.Unlock()
			if closed := len(closes) > 0; closed != tc.closed {
				t.Fatalf("link closed: %v (%q), want %v", closed, closes, tc.closed)
			}
		})
	}
}
