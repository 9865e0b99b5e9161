package proc_test

import (
	"slices"
	"testing"

	"iop/adapters/runtime/internal/proc"
)

func TestCleanEnvKeepsOnlyBaseInheritedAndDeclared(t *testing.T) {
	parent := []string{
		"PATH=/usr/bin", "HOME=/home/n", "USER=n", "LANG=C.UTF-8", "LC_ALL=C", "LC_TIME=en_GB",
		"TZ=UTC", "TMPDIR=/tmp/x",
		"IOP_NODE_TOKEN=secret-token", "OPENAI_API_KEY=sk-provider", "ANTHROPIC_API_KEY=sk-ant",
		"SHELL=/bin/bash", "NOEQUALS", "=junk",
	}
	got := proc.CleanEnv(parent, map[string]string{"BASE_URL": "http://127.0.0.1:1", "LANG": "de_DE"}, []string{"ANTHROPIC_API_KEY", "MISSING"})
	want := []string{
		"ANTHROPIC_API_KEY=sk-ant", "BASE_URL=http://127.0.0.1:1", "HOME=/home/n", "LANG=de_DE",
		"LC_ALL=C", "LC_TIME=en_GB", "PATH=/usr/bin", "TMPDIR=/tmp/x", "TZ=UTC", "USER=n",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("CleanEnv =\n%q\nwant\n%q", got, want)
	}
	if got := proc.CleanEnv(parent, nil, nil); slices.ContainsFunc(got, func(kv string) bool {
		return kv == "IOP_NODE_TOKEN=secret-token" || kv == "OPENAI_API_KEY=sk-provider"
	}) {
		t.Fatalf("secrets leaked without inherit_env: %q", got)
	}
}

func TestValidEnvName(t *testing.T) {
	for name, ok := range map[string]bool{"A": true, "A_B1": true, "": false, "A=B": false, "A\x00": false} {
		if proc.ValidEnvName(name) != ok {
			t.Fatalf("ValidEnvName(%q) != %v", name, ok)
		}
	}
}
