package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"iop/application/node"
	"iop/domain"
	"iop/ports"
)

// A provider a config removes (or renames) leaves the node's stats when
// the config is applied: its first-byte series used to stay at the edge
// until the node restarted and, with at most 256 names kept for the node's
// lifetime, a node whose providers had been renamed often enough stopped
// measuring new ones.
func TestProviderLatenciesFollowTheConfig(t *testing.T) {
	rt := node.NewRuntime(tnFactory{}, nil)
	lat := node.NewProviderLatencies()
	apply := node.NewApplyConfigHandler(rt, slog.New(slog.DiscardHandler))
	apply.Latencies = lat
	c := &tnClient{resp: &ports.ProviderResponse{Status: 200, Body: &tnBody{}, Usage: func() *domain.Usage { return nil }}}
	tunnels := node.NewTunnelHandler(rt, c, nil)
	tunnels.Latencies = lat
	stats := node.NewStats(rt, lat, nil)
	names := func() []string {
		var out []string
		for _, p := range stats.NodeStats().Providers {
			out = append(out, p.Name)
		}
		return out
	}
	for i := range 300 {
		name := fmt.Sprintf("p%d", i)
		pc := tnProvider
		pc.Name = name
		if err := apply.ApplyConfig(context.Background(), domain.NodeConfig{NodeID: "n1", Version: uint64(i + 1), Providers: []domain.ProviderConfig{pc}}); err != nil {
			t.Fatal(err)
		}
		if got := names(); len(got) != 0 {
			t.Fatalf("after renaming the provider to %s: stats report %v, want none yet", name, got)
		}
		sink := &tnSink{}
		tunnels.OpenTunnel(context.Background(), domain.TunnelRequest{Provider: name, Path: "/api/tags"}, nil, sink)
		if got := names(); len(got) != 1 || got[0] != name {
			t.Fatalf("after a request to %s (frames %s): stats report %v, want [%s]", name, sink.kinds(), got, name)
		}
	}
	// A config that fails to apply changes nothing.
	bad := domain.NodeConfig{NodeID: "n1", Version: 999, Adapters: []domain.AdapterConfig{{Name: "x", Type: domain.AdapterExec}}}
	if err := apply.ApplyConfig(context.Background(), bad); err == nil {
		t.Fatal("a config with an adapter the factory cannot build was applied")
	}
	if got := names(); len(got) != 1 || got[0] != "p299" {
		t.Fatalf("after a refused config: stats report %v, want [p299]", got)
	}
}
