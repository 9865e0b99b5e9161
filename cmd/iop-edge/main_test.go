package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestMain runs main instead of the tests when asked to: the tests below
// start this binary as iop-edge, as a user would.
func TestMain(m *testing.M) {
	if os.Getenv("IOP_EDGE_TEST_RUN_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// runEdge runs iop-edge with args and env (the test's environment minus
// the variables in unset) and returns its stdout, stderr and error.
func runEdge(t *testing.T, unset []string, args ...string) (string, string, error) {
	t.Helper()
	// Bounded: a config these tests expect refused that loads after all
	// would start a real edge, which serves until stopped.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, u := range unset {
			drop = drop || name == u
		}
		if !drop {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "IOP_EDGE_TEST_RUN_MAIN=1")
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// The file README "Adding a node on another machine" describes: secrets in
// key_env/token_env variables that the service's environment has and the
// operator's shell does not.
const secretEnvConfig = `state_dir: state
transport: {listen: "0.0.0.0:7700", tls: {mode: auto, hosts: [edge.example.com]}}
http:
  listen: "0.0.0.0:8080"
  api_keys:
    - {name: ci, key_env: IOP_JOIN_TEST_CI_KEY, scopes: [runs]}
nodes:
  - {id: a, token_env: IOP_JOIN_TEST_TOKEN_A}
  - {id: b, token_env: IOP_JOIN_TEST_TOKEN_B}
`

var secretEnvVars = []string{"IOP_JOIN_TEST_CI_KEY", "IOP_JOIN_TEST_TOKEN_A", "IOP_JOIN_TEST_TOKEN_B"}

// --print-ca-pin and join need no secret, so they work from a shell that
// has none of the config's key_env/token_env variables; serving does not.
func TestPinAndJoinNeedNoSecretVariables(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(cfg, []byte(secretEnvConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runEdge(t, secretEnvVars, "--config", cfg, "--print-ca-pin")
	pin := strings.TrimSpace(out)
	if err != nil || !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(pin) {
		t.Fatalf("--print-ca-pin: %v, stdout %q, stderr %q", err, out, errOut)
	}
	out, errOut, err = runEdge(t, secretEnvVars, "--config", cfg, "join", "a")
	if err != nil || !strings.Contains(out, "iop-node --edge edge.example.com:7700 --ca-pin "+pin+"\n") ||
		!strings.Contains(out, "the value of IOP_JOIN_TEST_TOKEN_A in the edge's environment") {
		t.Fatalf("join a: %v, stdout %q, stderr %q", err, out, errOut)
	}
	// Serving still needs them, and says which.
	_, errOut, err = runEdge(t, secretEnvVars, "--config", cfg)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(errOut, "IOP_JOIN_TEST_CI_KEY is unset or empty") {
		t.Fatalf("serve without the variables: %v, stderr %q; want exit 2 naming IOP_JOIN_TEST_CI_KEY", err, errOut)
	}
}
