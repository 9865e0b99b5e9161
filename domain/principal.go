package domain

import (
	"context"
	"slices"
)

// Caller scopes an HTTP API key may hold. Admin implies every other scope.
const (
	// ScopeRead reads runs, nodes, usage and the event feed.
	ScopeRead = "read"
	// ScopeRuns submits and cancels runs and ends sessions.
	ScopeRuns = "runs"
	// ScopeInference uses the OpenAI- and Ollama-compatible surfaces.
	ScopeInference = "inference"
	// ScopeAdmin reloads the config, runs node commands, and everything else.
	ScopeAdmin = "admin"
)

// KnownScopes lists the scopes, in documentation order.
var KnownScopes = []string{ScopeRead, ScopeRuns, ScopeInference, ScopeAdmin}

// AnonymousName is the principal name of a caller on an edge with no API keys.
const AnonymousName = "anonymous"

// Principal is the caller of an edge API request: the name of the key it
// presented, what that key may do, and which nodes it may see. It never holds
// the key itself.
type Principal struct {
	Name string
	// Scopes the caller holds; ScopeAdmin implies all.
	Scopes []string
	// Nodes limits the caller to these node ids; empty means every node.
	Nodes []string
}

// Anonymous is the principal of every request on an edge with no API keys:
// it may do everything on every node.
func Anonymous() Principal {
	return Principal{Name: AnonymousName, Scopes: []string{ScopeAdmin}}
}

// Allows reports whether p holds scope (admin holds every scope).
func (p Principal) Allows(scope string) bool {
	return slices.Contains(p.Scopes, scope) || slices.Contains(p.Scopes, ScopeAdmin)
}

// SeesNode reports whether p may see and use node id. A node outside the
// caller's limit is treated everywhere as if it did not exist.
func (p Principal) SeesNode(id string) bool {
	return len(p.Nodes) == 0 || slices.Contains(p.Nodes, id)
}

// Limited reports whether p is restricted to a subset of nodes.
func (p Principal) Limited() bool { return len(p.Nodes) > 0 }

// Require returns ErrForbidden (naming the caller and scope) unless p holds scope.
func (p Principal) Require(scope string) error {
	if p.Allows(scope) {
		return nil
	}
	return Errorf(CodeForbidden, "key %q lacks the %q scope", p.Name, scope)
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal ctx carries, or Anonymous when it
// carries none (an edge without keys, or an internal call).
func PrincipalFrom(ctx context.Context) Principal {
	if p, ok := ctx.Value(principalKey{}).(Principal); ok {
		return p
	}
	return Anonymous()
}
