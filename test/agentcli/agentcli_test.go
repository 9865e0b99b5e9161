package agentcli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"iop/test/agentcli"
	"iop/test/standin"
	"iop/test/standin/anthropic"
	"iop/test/standin/gemini"
	"iop/test/standin/responses"
)

// run runs a real CLI with exactly env (nothing of the test's own
// environment) in a temporary directory and returns its JSON lines.
func run(t *testing.T, env agentcli.Env, path string, args ...string) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env.List()
	cmd.Dir = t.TempDir()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", path, err, out.String(), errb.String())
	}
	var lines []map[string]any
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			lines = append(lines, m)
		}
	}
	return lines
}

func last(lines []map[string]any, typ string) map[string]any {
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i]["type"] == typ {
			return lines[i]
		}
	}
	return nil
}

const answer = "Stand-in answer, ünïcode ✓."

// The pinned CLIs accept the stand-ins' wire formats and, with the
// settings of this package, talk to nothing but them.
func TestRealCLIsTalkToTheirStandIns(t *testing.T) {
	t.Run("claude", func(t *testing.T) {
		t.Parallel()
		bin := agentcli.Find(t, "claude")
		s := anthropic.Start(t)
		s.Reply(standin.Reply{Text: answer, Usage: standin.Usage{Input: 40, Output: 9}})
		lines := run(t, agentcli.Claude(t, s.URL), bin, "-p", "--output-format", "stream-json", "--verbose", "hello")
		r := last(lines, "result")
		if r == nil || r["result"] != answer || r["is_error"] != false {
			t.Fatalf("result = %v", r)
		}
		if len(s.Messages()) == 0 || !strings.Contains(string(s.Messages()[0].Body), "hello") {
			t.Errorf("the stand-in did not see the prompt: %d requests", len(s.Messages()))
		}
	})
	t.Run("codex", func(t *testing.T) {
		t.Parallel()
		bin := agentcli.Find(t, "codex")
		s := responses.Start(t)
		s.Reply(standin.Reply{Text: answer, Usage: standin.Usage{Input: 40, Output: 9}})
		lines := run(t, agentcli.Codex(t, s.URL, "gpt-standin"), bin, "exec", "--json", "--skip-git-repo-check", "hello")
		var text string
		for _, l := range lines {
			if item, _ := l["item"].(map[string]any); l["type"] == "item.completed" && item["type"] == "agent_message" {
				text = item["text"].(string)
			}
		}
		if text != answer || last(lines, "turn.completed") == nil {
			t.Fatalf("lines = %v", lines)
		}
		if n := len(s.Responses()); n != 1 {
			t.Errorf("%d requests to /v1/responses", n)
		}
	})
	t.Run("gemini", func(t *testing.T) {
		t.Parallel()
		bin := agentcli.Find(t, "gemini")
		s := gemini.Start(t)
		s.Reply(standin.Reply{Text: answer, Usage: standin.Usage{Input: 40, Output: 9}})
		lines := run(t, agentcli.Gemini(t, s.URL), bin, "-p", "hello", "--output-format", "stream-json")
		var text strings.Builder
		for _, l := range lines {
			if l["type"] == "message" && l["role"] == "assistant" {
				text.WriteString(l["content"].(string))
			}
		}
		r := last(lines, "result")
		if text.String() != answer || r == nil || r["status"] != "success" {
			t.Fatalf("text %q, lines %v", text.String(), lines)
		}
	})
}
