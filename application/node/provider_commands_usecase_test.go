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

// A node with an ollama adapter ("local") and Ollamas declared as
// providers: a command whose args name a provider goes to that provider
// and no other, even though an adapter serves the command (a delete meant
// for the remote Ollama ran on the local one); a provider or adapter the
// node lacks is an error, never another one's answer.
func TestNamedProviderAnswersEvenBesideAnAdapter(t *testing.T) {
	ucNoLeaks(t)
	local := &ucCommandAdapter{
		ucAdapter: newUCAdapter("local", domain.Capabilities{MaxConcurrency: 1, Commands: []string{"ollama.list", "ollama.delete"}}, nil),
		result:    `{"served_by":"local"}`,
	}
	factory := &ucFactory{build: func(domain.AdapterConfig) ports.RuntimeAdapter { return local }}
	rt := node.NewRuntime(factory, nil).WithProviderCommands(ucProvCommands{})
	err := rt.Apply(domain.NodeConfig{NodeID: "n2", Adapters: []domain.AdapterConfig{ucAdapterCfg("local", 1)}, Providers: []domain.ProviderConfig{
		{Name: "remote", Type: domain.ProviderOllama, BaseURL: "http://b"},
		{Name: "vllm", Type: domain.ProviderOpenAI, BaseURL: "http://a"},
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
		{`{"model":"llama3"}`, `{"served_by":"local"}`},
		{`{"adapter":"local","model":"llama3"}`, `{"served_by":"local"}`},
		{`{"provider":"remote","model":"llama3"}`, `{"served_by":"remote","command":"ollama.list"}`},
	} {
		got, err := h.RunCommand(ctx, "ollama.list", []byte(tc.args), nil)
		if err != nil || string(got) != tc.want {
			t.Fatalf("args %s: %s %v; want %s", tc.args, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		command, args string
		want          error
	}{
		{"ollama.list", `{"provider":"typo"}`, domain.ErrProviderNotFound},
		{"ollama.delete", `{"provider":"remote","model":"llama3"}`, domain.ErrCommandUnsupported}, // the remote serves list and pull only
		{"ollama.list", `{"provider":"vllm"}`, domain.ErrCommandUnsupported},
		{"ollama.list", `{"adapter":"typo"}`, domain.ErrAdapterNotFound},
		{"ollama.list", `{"adapter":"local","provider":"remote"}`, domain.ErrInvalidRequest},
		{"ollama.list", `{"provider":["remote"]}`, domain.ErrInvalidRequest},
	} {
		if got, err := h.RunCommand(ctx, tc.command, []byte(tc.args), nil); !errors.Is(err, tc.want) {
			t.Errorf("%s %s: %s %v; want %v", tc.command, tc.args, got, err, tc.want)
		}
	}
	local.cmu.Lock()
	defer local.cmu.Unlock()
	for _, c := range local.calls {
		if strings.Contains(c, "provider") || strings.Contains(c, "typo") {
			t.Errorf("the local adapter served %q", c)
		}
	}
}
