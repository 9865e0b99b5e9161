package node

import (
	"testing"

	"iop/domain"
)

// Runs of adapters that start a child process count as child processes in
// the node's stats; provider-backed runs do not.
func TestSpawnsProcessesByAdapterType(t *testing.T) {
	for typ, want := range map[string]bool{
		domain.AdapterExec: true, domain.AdapterClaudeCode: true, domain.AdapterCodex: true, domain.AdapterGemini: true,
		domain.AdapterOllama: false, domain.AdapterOpenAI: false,
	} {
		if got := spawnsProcesses(typ); got != want {
			t.Errorf("spawnsProcesses(%q) = %v, want %v", typ, got, want)
		}
	}
}
