package node_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"iop/adapters/store/memory"
	"iop/application/node"
	"iop/domain"
	"iop/ports"
)

type ucProvRunner struct{ provider string }

func (r ucProvRunner) RunCommand(_ context.Context, name string, _ []byte, _ func([]byte) error) ([]byte, error) {
	return []byte(`{"served_by":"` + r.provider + `","command":"` + name + `"}`), nil
}

// ucProvCommands serves ollama.* for ollama providers only.
type ucProvCommands struct{}

func (ucProvCommands) CommandsFor(p domain.ProviderConfig) (ports.CommandRunner, []string, bool) {
	if p.Type != domain.ProviderOllama {
		return nil, nil, false
	}
	return ucProvRunner{provider: p.Name}, []string{"ollama.list", "ollama.pull"}, true
}

func TestProviderServesCommandsWithoutAnAdapter(t *testing.T) {
	rt := node.NewRuntime(&ucFactory{}, nil).WithProviderCommands(ucProvCommands{})
	err := rt.Apply(domain.NodeConfig{NodeID: "n1", Providers: []domain.ProviderConfig{
		{Name: "vllm", Type: domain.ProviderOpenAI, BaseURL: "http://a"},
		{Name: "ol-b", Type: domain.ProviderOllama, BaseURL: "http://b"},
		{Name: "ol-a", Type: domain.ProviderOllama, BaseURL: "http://c"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	store := memory.NewRunStore()
	rm := node.NewRunManager(rt, store, nil)
	defer rm.Stop()
	h := node.NewCommandHandler(rt, rm, node.NewSessionHandler(rt, rm), store, "v")
	ctx := context.Background()
	for _, tc := range []struct{ args, want string }{
		{``, `{"served_by":"ol-a","command":"ollama.list"}`},
		{`{"provider":"ol-b"}`, `{"served_by":"ol-b","command":"ollama.list"}`},
	} {
		got, err := h.RunCommand(ctx, "ollama.list", []byte(tc.args), nil)
		if err != nil || string(got) != tc.want {
			t.Fatalf("args %q: %s %v", tc.args, got, err)
		}
	}
	if _, err := h.RunCommand(ctx, "ollama.list", []byte(`{"provider":"vllm"}`), nil); !errors.Is(err, domain.ErrCommandUnsupported) {
		t.Fatalf("openai provider: %v", err)
	}
	if _, err := h.RunCommand(ctx, "ollama.copy", nil, nil); !errors.Is(err, domain.ErrCommandUnsupported) {
		t.Fatalf("command no provider serves: %v", err)
	}
	caps, _ := h.RunCommand(ctx, "capabilities", nil, nil)
	if !strings.Contains(string(caps), `"ollama.pull"`) {
		t.Fatalf("capabilities lack provider commands: %s", caps)
	}
}
