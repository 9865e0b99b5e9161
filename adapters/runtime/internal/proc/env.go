package proc

import (
	"maps"
	"os"
	"slices"
	"strings"
)

// baseEnv names the variables every child gets from the node's environment:
// what a program needs to find binaries, a home, a locale, a timezone and a
// temp directory, and nothing that could be a secret. LC_* is matched by
// prefix.
var baseEnv = []string{"PATH", "HOME", "USER", "LANG", "TZ", "TMPDIR"}

// Environ builds a child's clean environment from the node's own (os.Environ):
// the base variables (PATH, HOME, USER, LANG, LC_*, TZ, TMPDIR), then each
// variable named in inherit that the node has, then declared (which wins).
// Nothing else of the node's environment reaches the child — not
// IOP_NODE_TOKEN, not a provider's api_key_env — unless inherit names it.
// (spawn.Start then adds spawn.TagEnv.)
// Every runtime adapter that starts a process builds its env with this.
func Environ(declared map[string]string, inherit []string) []string {
	return CleanEnv(os.Environ(), declared, inherit)
}

// CleanEnv is Environ over a given parent environment ("K=V" entries). The
// result is sorted by name, one entry per name.
func CleanEnv(parent []string, declared map[string]string, inherit []string) []string {
	out := make(map[string]string, len(baseEnv)+len(inherit)+len(declared))
	for _, kv := range parent {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if slices.Contains(baseEnv, k) || strings.HasPrefix(k, "LC_") || slices.Contains(inherit, k) {
			out[k] = v
		}
	}
	maps.Copy(out, declared)
	env := make([]string, 0, len(out))
	for _, k := range slices.Sorted(maps.Keys(out)) {
		env = append(env, k+"="+out[k])
	}
	return env
}

// ValidEnvName reports whether name can be an environment variable name:
// non-empty, without '=' or NUL. Config validation uses it for env keys and
// inherit_env entries.
func ValidEnvName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "=\x00")
}
