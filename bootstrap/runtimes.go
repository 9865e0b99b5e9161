package bootstrap

import (
	"iop/adapters/runtime/claudecode"
	"iop/adapters/runtime/codex"
	"iop/adapters/runtime/factory"
	"iop/adapters/runtime/gemini"
	"iop/adapters/runtime/ollama"
	"iop/adapters/runtime/openai"
	"iop/domain"
	"iop/ports"
)

// RuntimeBuilders returns the builders of the runtime adapter types beyond
// exec (which the factory has built in): ollama and openai keep chat
// sessions in chats, claude-code, codex and gemini keep their agent session ids in
// agents. Either store may be nil, in which case those adapters keep no
// sessions and say so in their capabilities.
func RuntimeBuilders(chats ports.ChatSessionStore, agents ports.AgentSessionStore) map[string]factory.Builder {
	return map[string]factory.Builder{
		domain.AdapterOllama: func(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error) {
			return ollama.New(cfg, chats)
		},
		domain.AdapterOpenAI: func(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error) {
			return openai.New(cfg, chats)
		},
		domain.AdapterClaudeCode: func(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error) {
			return claudecode.New(cfg, agents)
		},
		domain.AdapterCodex: func(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error) {
			return codex.New(cfg, agents)
		},
		domain.AdapterGemini: func(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error) {
			return gemini.New(cfg, agents)
		},
	}
}

// providerCommands lets an Ollama declared only as a tunnel provider answer
// the ollama.* node commands, through a command-only ollama adapter that
// sends the provider's key (api_key_env) as the provider's tunnels do.
type providerCommands struct{}

func (providerCommands) CommandsFor(p domain.ProviderConfig) (ports.CommandRunner, []string, bool) {
	if p.Type != domain.ProviderOllama {
		return nil, nil, false
	}
	a, err := ollama.New(domain.AdapterConfig{Name: p.Name, Type: domain.AdapterOllama, BaseURL: p.BaseURL, MaxConcurrency: 1}, nil, ollama.WithAPIKeyEnv(p.APIKeyEnv))
	if err != nil {
		return nil, nil, false
	}
	return a, ollama.Commands, true
}
