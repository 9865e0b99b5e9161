package node_test

import (
	"testing"

	"iop/adapters/runtime/claudecode"
	"iop/adapters/runtime/codex"
	"iop/adapters/runtime/gemini"
	"iop/adapters/runtime/ollama"
	"iop/adapters/runtime/openai"
	"iop/domain"
	"iop/ports"
)

// A run the real adapters would refuse for its own content (no model, an
// option of the wrong type, a blank prompt) is refused when the node admits
// it: its one event is the invalid_request error, no start was sent and the
// run is recorded as never started, so the edge answers the caller 400 instead of a started
// run that fails.
func TestAdaptersRefuseBadRunsBeforeStart(t *testing.T) {
	ucNoLeaks(t)
	build := func(a ports.RuntimeAdapter, err error) ports.RuntimeAdapter {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	// Nothing listens on port 1: a run that got as far as the upstream
	// would fail there, after its start.
	const nowhere = "http://127.0.0.1:1"
	adapters := map[string]ports.RuntimeAdapter{
		"ollama": build(ollama.New(domain.AdapterConfig{Name: "ollama", Type: domain.AdapterOllama, BaseURL: nowhere}, nil)),
		"openai": build(openai.New(domain.AdapterConfig{Name: "openai", Type: domain.AdapterOpenAI, BaseURL: nowhere}, nil)),
		"claude": build(claudecode.New(domain.AdapterConfig{Name: "claude", Command: "/nonexistent/claude"}, nil)),
		"codex":  build(codex.New(domain.AdapterConfig{Name: "codex", Command: "/nonexistent/codex"}, nil)),
		"gemini": build(gemini.New(domain.AdapterConfig{Name: "gemini", Command: "/nonexistent/gemini"}, nil)),
	}
	for _, a := range adapters {
		if c, ok := a.(interface{ Close() error }); ok {
			t.Cleanup(func() { _ = c.Close() })
		}
	}
	n := newUCNode(t, adapters)
	cases := []domain.RunRequest{
		{RunID: "ollama-no-model", Adapter: "ollama", Input: []byte("hi")},
		{RunID: "ollama-tools", Adapter: "ollama", Target: "m", Input: []byte("hi"), Options: []byte(`{"tools":"get_weather"}`)},
		{RunID: "ollama-empty", Adapter: "ollama", Target: "m", Input: []byte(" ")},
		{RunID: "openai-no-model", Adapter: "openai", Input: []byte("hi")},
		{RunID: "openai-messages", Adapter: "openai", Target: "m", Input: []byte(`{"messages":[]}`)},
		{RunID: "claude-blank", Adapter: "claude", Input: []byte(" \n")},
		{RunID: "codex-blank", Adapter: "codex"},
		{RunID: "gemini-blank", Adapter: "gemini", Input: []byte("\t")},
	}
	for _, req := range cases {
		evs := n.run(t, req)
		if len(evs) != 1 || evs[0].Type != domain.EventError || evs[0].Error == nil || evs[0].Error.Code != domain.CodeInvalidRequest {
			t.Errorf("%s: events %s (%+v), want an invalid_request refusal alone", req.RunID, ucTypes(evs), evs)
		}
		if r := n.stored(t, req.RunID); !r.StartedAt.IsZero() || r.ErrorCode != domain.CodeInvalidRequest {
			t.Errorf("%s: recorded as %+v, want never started, invalid_request", req.RunID, r)
		}
	}
}
