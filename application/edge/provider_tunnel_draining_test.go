package edge_test

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

// A provider tunnel skips a draining node as a run does: it goes to another
// node serving the model, and when only draining nodes serve it (or the
// caller pins one) it gets the error a run gets then, no_node_available or
// shutting_down (503), saying the node is shutting down. It used to go to
// the draining node, which closes its link once its runs end, cutting the
// tunnel short.
func TestProviderTunnelSkipsDrainingNodes(t *testing.T) {
	type node struct {
		id        string
		providers []domain.ProviderConfig
		draining  bool
	}
	both := []node{
		{"a", []domain.ProviderConfig{ptProvider("o1", domain.ProviderOllama, "llama3.2", "qwen")}, true},
		{"b", []domain.ProviderConfig{ptProvider("o2", domain.ProviderOllama, "llama3.2")}, false},
	}
	cases := []struct {
		name     string
		nodes    []node
		in       edge.SubmitProviderTunnel
		wantNode string
		wantCode string
	}{
		{"another node serves the model", both, edge.SubmitProviderTunnel{Model: "llama3.2", ProviderType: "openai"}, "b", ""},
		{"only a draining node serves the model", both, edge.SubmitProviderTunnel{Model: "qwen", ProviderType: "ollama"}, "", domain.CodeNoNodeAvailable},
		{"pinned to a draining node", both, edge.SubmitProviderTunnel{Node: "a", Model: "llama3.2", ProviderType: "openai"}, "", domain.CodeShuttingDown},
		{"pinned, no model", both, edge.SubmitProviderTunnel{Node: "a", ProviderType: "ollama", Method: "GET", Path: "/api/tags"}, "", domain.CodeShuttingDown},
		{"a model nobody serves is still not found", both, edge.SubmitProviderTunnel{Model: "gpt-9", ProviderType: "openai"}, "", domain.CodeModelNotFound},
		{"or-only-node: the one node not draining takes a new model", both, edge.SubmitProviderTunnel{Model: "new-model", ProviderType: "ollama", OrOnlyNode: true, Path: "/api/pull"}, "b", ""},
		{"every node of the family drains", []node{
			{"a", []domain.ProviderConfig{ptProvider("o1", domain.ProviderOllama, "llama3.2")}, true},
			{"b", []domain.ProviderConfig{ptProvider("vllm", domain.ProviderOpenAI, "qwen")}, false},
		}, edge.SubmitProviderTunnel{ProviderType: "ollama", Method: "GET", Path: "/api/version"}, "", domain.CodeNoNodeAvailable},
		{"a draining node with no list yet may serve it", []node{
			{"a", []domain.ProviderConfig{ptProvider("o1", domain.ProviderOllama)}, true},
			{"b", []domain.ProviderConfig{ptProvider("o2", domain.ProviderOllama, "llama3.2")}, false},
		}, edge.SubmitProviderTunnel{Model: "qwen", ProviderType: "ollama"}, "", domain.CodeNoNodeAvailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newPTEnv()
			for _, n := range tc.nodes {
				l := ptAdmit(t, e.reg, n.id, n.providers...)
				if n.draining && !e.reg.MarkDraining(n.id, l) {
					t.Fatalf("MarkDraining(%s) = false", n.id)
				}
			}
			in := tc.in
			if in.Path == "" {
				in.Method, in.Path = http.MethodPost, "/v1/chat/completions"
			}
			tun, err := e.h.Handle(context.Background(), in)
			if tc.wantCode != "" {
				if domain.CodeOf(err) != tc.wantCode {
					t.Fatalf("err = %v, want %s", err, tc.wantCode)
				}
				if tc.wantCode != domain.CodeModelNotFound && !strings.Contains(domain.MessageOf(err), "shutting down") {
					t.Fatalf("message %q does not say the node is shutting down", domain.MessageOf(err))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tun.Close()
			if tun.Node != tc.wantNode {
				t.Fatalf("routed to %s, want %s", tun.Node, tc.wantNode)
			}
		})
	}

	// A merged list (GET /api/ps) asks only the nodes not draining.
	e := newPTEnv()
	for _, n := range both {
		l := ptAdmit(t, e.reg, n.id, n.providers...)
		if n.draining {
			e.reg.MarkDraining(n.id, l)
		}
	}
	got := e.h.Targets(domain.Anonymous(), domain.ProviderOllama)
	if want := []edge.ProviderTarget{{Node: "b", Provider: "o2"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Targets = %+v, want %+v", got, want)
	}
}
