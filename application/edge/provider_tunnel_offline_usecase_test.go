package edge_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

// A model only a configured node that is not connected declares is
// no_node_available naming that node (callers retry it), in
// ErrNoNodeHasModel's chain so the surface refreshes the catalog once; a
// key limited to other nodes learns nothing of that node and gets
// model_not_found, as for a model nobody declares.
func TestProviderTunnelModelOfANodeNotConnected(t *testing.T) {
	e := newPTEnv()
	e.h.Nodes = &ucDir{recs: []domain.NodeRecord{
		{ID: "a", Token: "ta", Providers: []domain.ProviderConfig{ptProvider("o1", domain.ProviderOpenAI, "gpt-4o")}},
		{ID: "b", Token: "tb", Providers: []domain.ProviderConfig{ptProvider("o2", domain.ProviderOllama, "qwen")}},
	}}
	ptAdmit(t, e.reg, "a", ptProvider("o1", domain.ProviderOpenAI, "gpt-4o"))
	ask := func(ctx context.Context, model, family string) error {
		tun, err := e.h.Handle(ctx, edge.SubmitProviderTunnel{Model: model, ProviderType: family, Method: http.MethodPost, Path: "/v1/chat/completions"})
		if err == nil {
			tun.Close()
		}
		return err
	}
	all := context.Background()
	err := ask(all, "qwen", domain.ProviderOpenAI)
	if domain.CodeOf(err) != domain.CodeNoNodeAvailable || !strings.Contains(domain.MessageOf(err), `node "b", which is not connected`) || !errors.Is(err, edge.ErrNoNodeHasModel) {
		t.Fatalf("qwen, declared by node b that is not connected: %v", err)
	}
	if err := ask(all, "qwen:latest", domain.ProviderOllama); domain.CodeOf(err) != domain.CodeNoNodeAvailable {
		t.Fatalf("qwen:latest on the Ollama API: %v", err)
	}
	if err := ask(all, "gpt-9", domain.ProviderOpenAI); domain.CodeOf(err) != domain.CodeModelNotFound {
		t.Fatalf("a model nobody declares: %v", err)
	}
	onlyA := domain.WithPrincipal(all, domain.Principal{Name: "k", Scopes: []string{domain.ScopeInference}, Nodes: []string{"a"}})
	if err := ask(onlyA, "qwen", domain.ProviderOpenAI); domain.CodeOf(err) != domain.CodeModelNotFound || strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("a key limited to node a: %v", err)
	}
	if err := ask(all, "gpt-4o", domain.ProviderOpenAI); err != nil {
		t.Fatalf("gpt-4o on the connected node: %v", err)
	}
}
