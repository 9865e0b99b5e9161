package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"iop/test/agentcli"
	"iop/test/standin"
)

// runCLI runs a real agent CLI with exactly env (nothing of the test's own
// environment) in a temporary directory and returns its stdout.
func runCLI(t *testing.T, env agentcli.Env, path string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env.List()
	cmd.Dir = t.TempDir()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", path, err, out.String(), errb.String())
	}
	return out.String()
}

// sameRequests checks that every model request the CLI sent to the edge
// reached the provider unchanged (body and query), in order.
func sameRequests(t *testing.T, front, provider *tap, path string) {
	t.Helper()
	front.mu.Lock()
	provider.mu.Lock()
	defer front.mu.Unlock()
	defer provider.mu.Unlock()
	var sent, got []tapped
	for _, s := range front.seen {
		if s.path == path {
			sent = append(sent, s)
		}
	}
	for _, s := range provider.seen {
		if s.path == path {
			got = append(got, s)
		}
	}
	if len(sent) == 0 || len(sent) != len(got) {
		t.Fatalf("%d requests on %s from the CLI, %d at the provider", len(sent), path, len(got))
	}
	for i := range sent {
		if !bytes.Equal(sent[i].body, got[i].body) || sent[i].query != got[i].query {
			t.Fatalf("request %d on %s changed on the way:\nsent %q ?%s\ngot  %q ?%s", i, path, sent[i].body, sent[i].query, got[i].body, got[i].query)
		}
		if got[i].header.Get("Authorization") != "" || strings.Contains(got[i].header.Get("X-Api-Key"), agentKey) {
			t.Fatalf("the CLI's credentials for the edge reached the provider: %v", got[i].header)
		}
	}
}

const cliAnswer = "Answer from the provider behind the edge ✓"

// The real Claude Code and Codex CLIs, pointed at an edge that requires an
// API key (Claude Code sends it as x-api-key, Codex as Bearer), reach a
// stand-in Messages / Responses provider on a node. Every base URL they
// know is the edge (through a tap) or a closed loopback port, and proxies
// point at a closed port too: nothing leaves loopback.
func TestRealAgentCLIsThroughTheEdge(t *testing.T) {
	t.Run("claude", func(t *testing.T) {
		t.Parallel()
		bin := agentcli.Find(t, "claude")
		// No declared models: the anthropic provider takes whatever model
		// Claude Code asks for.
		a := startAgentEdgeKeyed(t, "", ", models: [gpt-standin]", true)
		a.antS.Reply(standin.Reply{Text: cliAnswer, Usage: standin.Usage{Input: 40, Output: 9}})
		front := newTap(t, a.e.url)
		env := agentcli.Claude(t, front.URL)
		env["ANTHROPIC_API_KEY"] = agentKey // the edge's key, sent as x-api-key
		out := runCLI(t, env, bin, "-p", "hello through the edge")
		if !strings.Contains(out, cliAnswer) {
			t.Fatalf("claude -p printed %q", out)
		}
		sameRequests(t, front, a.ant, "/v1/messages")
		if s := a.ant.last(t, "/v1/messages"); s.header.Get("X-Api-Key") != nodeAnthropicKey || !bytes.Contains(s.body, []byte("hello through the edge")) {
			t.Fatalf("provider request: %v %q", s.header, s.body)
		}
	})
	t.Run("codex", func(t *testing.T) {
		t.Parallel()
		bin := agentcli.Find(t, "codex")
		a := startAgentEdgeKeyed(t, ", models: [claude-standin]", ", models: [gpt-standin]", true)
		a.oaiS.Reply(standin.Reply{Text: cliAnswer, Usage: standin.Usage{Input: 40, Output: 9}})
		front := newTap(t, a.e.url)
		env := agentcli.Codex(t, front.URL, "gpt-standin")
		env["STANDIN_API_KEY"] = agentKey // the edge's key, sent as Bearer
		out := runCLI(t, env, bin, "exec", "--skip-git-repo-check", "hello through the edge")
		if !strings.Contains(out, cliAnswer) {
			t.Fatalf("codex exec printed %q", out)
		}
		sameRequests(t, front, a.oai, "/v1/responses")
	})
}

// The real Claude Code with a key the edge refuses reports it after one
// request: the edge's 401 says "x-should-retry: false", as Anthropic's API
// does, without which Claude Code retried it (ten times, backing off, for
// minutes) before saying anything.
func TestRealClaudeCodeGivesUpOnARefusedKey(t *testing.T) {
	t.Parallel()
	bin := agentcli.Find(t, "claude")
	a := startAgentEdgeKeyed(t, "", ", models: [gpt-standin]", true)
	front := newTap(t, a.e.url)
	env := agentcli.Claude(t, front.URL)
	env["ANTHROPIC_API_KEY"] = "not-the-edge-key"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-p", "hello through the edge")
	cmd.Env = env.List()
	cmd.Dir = t.TempDir()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if ctx.Err() != nil || !errors.As(err, &exit) || exit.ExitCode() <= 0 {
		t.Fatalf("claude -p with a refused key: %v (context %v)\nstdout:\n%s\nstderr:\n%s", err, ctx.Err(), out.String(), errb.String())
	}
	front.mu.Lock()
	defer front.mu.Unlock()
	if n := len(front.seen); n != 1 || front.seen[0].path != "/v1/messages" {
		t.Fatalf("claude sent %d requests for one refused key (want 1 on /v1/messages)", n)
	}
	a.ant.mu.Lock()
	defer a.ant.mu.Unlock()
	for _, s := range a.ant.seen {
		if s.path == "/v1/messages" {
			t.Fatal("a request with a refused key reached the provider")
		}
	}
	if s := out.String() + errb.String(); !strings.Contains(s, "401") && !strings.Contains(strings.ToLower(s), "api key") {
		t.Fatalf("claude did not report the refused key: %q", s)
	}
}

// The real Codex with a key the edge refuses prints the edge's message and
// the answer's request id ("request id: req_…", from x-request-id, as
// OpenAI's API sends it), which the edge's access log names, so the
// refusal a user reports can be found in the log.
func TestRealCodexShowsTheEdgesRequestID(t *testing.T) {
	t.Parallel()
	bin := agentcli.Find(t, "codex")
	a := startAgentEdgeKeyed(t, ", models: [claude-standin]", ", models: [gpt-standin]", true)
	env := agentcli.Codex(t, a.e.url, "gpt-standin")
	env["STANDIN_API_KEY"] = "not-the-edge-key"
	out := codexExecFails(t, bin, env, "with a refused key")
	m := regexp.MustCompile(`401 Unauthorized: invalid API key, url: \S+, request id: (req_[0-9A-Za-z]{24})`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("codex did not report the refusal with the edge's request id:\n%s", out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(a.e.out.String(), "request_id="+m[1]) {
		if time.Now().After(deadline) {
			t.Fatalf("the edge's access log does not name request id %s", m[1])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The real Codex given the edge's address without /v1 as its provider's
// base_url (it then asks POST /responses) is told where the route is and
// that its base URL takes /v1, instead of a bare "no route".
func TestRealCodexToldItsBaseURLLacksV1(t *testing.T) {
	t.Parallel()
	bin := agentcli.Find(t, "codex")
	a := startAgentEdgeKeyed(t, ", models: [claude-standin]", ", models: [gpt-standin]", true)
	env := agentcli.Codex(t, a.e.url, "gpt-standin")
	env["STANDIN_API_KEY"] = agentKey
	config := filepath.Join(env["CODEX_HOME"], "config.toml")
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte(a.e.url+"/v1\""), []byte(a.e.url+"\""), 1)
	if !bytes.Contains(b, []byte("base_url = \""+a.e.url+"\"")) {
		t.Fatalf("config.toml: %s", b)
	}
	if err := os.WriteFile(config, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out := codexExecFails(t, bin, env, "at a base URL without /v1"); !strings.Contains(out, "404 Not Found: no route for POST /responses: this edge serves /v1/responses; OpenAI SDKs and Codex take its URL with /v1") {
		t.Fatalf("codex was not told where the route is:\n%s", out)
	}
}

// codexExecFails runs the real Codex on one prompt with env, which must
// make it exit non-zero on its own within a minute, and returns its output.
func codexExecFails(t *testing.T, bin string, env agentcli.Env, what string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "exec", "--skip-git-repo-check", "hello through the edge")
	cmd.Env = env.List()
	cmd.Dir = t.TempDir()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if ctx.Err() != nil || !errors.As(err, &exit) || exit.ExitCode() <= 0 {
		t.Fatalf("codex exec %s: %v (context %v)\n%s", what, err, ctx.Err(), out.String())
	}
	return out.String()
}
