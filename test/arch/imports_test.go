// Package arch checks the hexagon's import rules (ARCHITECTURE.md): domain
// uses only the standard library without net/http; ports and application
// use neither adapters nor bun, protobuf, fx or net/http. `make lint` runs it.
package arch

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// dep is one package in a layer's transitive dependencies.
type dep struct {
	path     string
	standard bool
}

// forbidden is every technology the inner layers must not reach.
var forbidden = []string{
	"iop/adapters/", "iop/bootstrap", "iop/cmd/", "iop/proto/",
	"github.com/uptrace/bun", "google.golang.org/protobuf", "go.uber.org/fx", "go.uber.org/dig",
	"net/http",
}

// violations lists the deps of a layer that break its rule.
func violations(layer string, deps []dep) []string {
	var out []string
	for _, d := range deps {
		bad := false
		for _, f := range forbidden {
			if d.path == strings.TrimSuffix(f, "/") || strings.HasPrefix(d.path, f) || strings.HasPrefix(d.path, f+"/") {
				bad = true
			}
		}
		if layer == "domain" && !d.standard && !strings.HasPrefix(d.path, "iop/domain") {
			bad = true
		}
		if bad {
			out = append(out, d.path)
		}
	}
	return out
}

func listDeps(t *testing.T, pattern string) []dep {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", pattern)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pattern, err, stderr.String())
	}
	var deps []dep
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		path, std, _ := strings.Cut(sc.Text(), " ")
		deps = append(deps, dep{path: path, standard: std == "true"})
	}
	return deps
}

func TestLayersImportOnlyWhatTheyMay(t *testing.T) {
	for layer, pattern := range map[string]string{
		"domain":      "./domain/...",
		"ports":       "./ports/...",
		"application": "./application/...",
	} {
		if bad := violations(layer, listDeps(t, pattern)); len(bad) > 0 {
			t.Errorf("%s reaches packages it must not import: %s", layer, strings.Join(bad, ", "))
		}
	}
}

// The checker itself catches each kind of violation.
func TestViolationsAreCaught(t *testing.T) {
	for _, tc := range []struct {
		layer string
		d     dep
	}{
		{"domain", dep{"net/http", true}},
		{"domain", dep{"github.com/google/uuid", false}},
		{"ports", dep{"iop/adapters/transport", false}},
		{"application", dep{"github.com/uptrace/bun/dialect", false}},
		{"application", dep{"google.golang.org/protobuf/proto", false}},
		{"application", dep{"go.uber.org/fx", false}},
		{"application", dep{"net/http", true}},
		{"application", dep{"iop/proto/iop", false}},
	} {
		if got := violations(tc.layer, []dep{tc.d}); len(got) != 1 {
			t.Errorf("%s importing %s was not caught", tc.layer, tc.d.path)
		}
	}
	ok := []dep{{"iop/domain", false}, {"context", true}, {"net/textproto", true}, {"net/http/httptest", true}}
	if got := violations("application", ok[:3]); len(got) != 0 {
		t.Errorf("allowed imports refused: %v", got)
	}
	if got := violations("domain", ok[3:]); len(got) != 1 {
		t.Errorf("net/http/httptest in domain not caught")
	}
}
