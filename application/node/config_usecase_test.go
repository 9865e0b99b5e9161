package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"iop/application/node"
	"iop/domain"
	"iop/ports"
)

// A config whose api_key_env names a variable the node's environment lacks
// used to be applied silently: every request then went without a key and
// the upstream answered 401, with nothing on the node to say why. Applying
// it logs one warning per adapter or provider concerned, naming it and the
// variable (when it has the shape of one), never a value.
func TestApplyConfigWarnsOfAnUnsetAPIKeyEnv(t *testing.T) {
	const key = "sk-proj-the-key-itself-0123456789"
	t.Setenv("IOP_TEST_SET_KEY", "sk-set-value")
	t.Setenv("IOP_TEST_UNSET_KEY", "")
	var buf bytes.Buffer
	rt := node.NewRuntime(&ucFactory{build: func(cfg domain.AdapterConfig) ports.RuntimeAdapter {
		return newUCAdapter(cfg.Name, domain.Capabilities{MaxConcurrency: 1}, nil)
	}}, nil)
	apply := node.NewApplyConfigHandler(rt, slog.New(slog.NewJSONHandler(&buf, nil)))
	cfg := domain.NodeConfig{NodeID: "n1", Version: 1,
		Adapters: []domain.AdapterConfig{
			{Name: "vllm", Type: domain.AdapterOpenAI, BaseURL: "http://127.0.0.1:8000", APIKeyEnv: "IOP_TEST_UNSET_KEY"},
			{Name: "keyed", Type: domain.AdapterOpenAI, BaseURL: "http://127.0.0.1:8000", APIKeyEnv: "IOP_TEST_SET_KEY"},
			{Name: "open", Type: domain.AdapterOpenAI, BaseURL: "http://127.0.0.1:8000"},
		},
		Providers: []domain.ProviderConfig{
			{Name: "claude", Type: domain.ProviderAnthropic, BaseURL: "https://api.anthropic.com", APIKeyEnv: key},
			{Name: "ok", Type: domain.ProviderOpenAI, BaseURL: "http://127.0.0.1:8000", APIKeyEnv: "IOP_TEST_SET_KEY"},
		},
	}
	if err := apply.ApplyConfig(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), key) || strings.Contains(buf.String(), "sk-set-value") {
		t.Fatalf("the log shows a key:\n%s", buf.String())
	}
	var warned []string
	for line := range strings.Lines(buf.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if rec["level"] != "WARN" {
			continue
		}
		if !strings.Contains(rec["msg"].(string), "api_key_env names a variable that is unset or empty") {
			t.Errorf("unexpected warning %v", rec)
		}
		for _, kind := range []string{"adapter", "provider"} {
			if name, ok := rec[kind].(string); ok {
				warned = append(warned, kind+" "+name+" "+rec["api_key_env"].(string))
			}
		}
	}
	want := []string{
		"adapter vllm IOP_TEST_UNSET_KEY",
		"provider claude (not shown: not an upper-case variable name, and may be the key itself)",
	}
	if strings.Join(warned, "\n") != strings.Join(want, "\n") {
		t.Fatalf("warnings for %q, want %q; log:\n%s", warned, want, buf.String())
	}
}
