package agentcli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/test/agentcli"
	"iop/test/standin"
	"iop/test/standin/anthropic"
	"iop/test/standin/gemini"
	"iop/test/standin/responses"
)

// run runs a real CLI with exactly env (nothing of the test's own
// environment) in a temporary directory and returns its JSON lines. A CLI
// that printed its end line (a line of type end) and then lingers is
// stopped after lingerGrace, as the node's agent adapters stop it
// (ExitGrace): Codex is known to stay alive after turn.completed now and
// then, for a minute or more on a loaded machine.
func run(t *testing.T, env agentcli.Env, end, path string, args ...string) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env.List()
	cmd.Dir = t.TempDir()
	out := &endWatch{end: []byte(`"type":"` + end + `"`), ended: make(chan struct{})}
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-out.ended:
		select {
		case err = <-exited:
		case <-time.After(lingerGrace):
			_ = cmd.Process.Kill()
			<-exited
			t.Logf("%s lingered %v after its %s line: stopped, as the node's adapter does", path, lingerGrace, end)
		}
	}
	if err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", path, err, out.String(), errb.String())
	}
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			lines = append(lines, m)
		}
	}
	return lines
}

// lingerGrace is how long a CLI may stay after its end line.
const lingerGrace = 10 * time.Second

// endWatch keeps a CLI's stdout and closes ended once a complete line
// holds end.
type endWatch struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	end   []byte
	ended chan struct{}
	seen  bool
}

func (w *endWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	from := w.buf.Len()
	w.buf.Write(p)
	if !w.seen {
		// Lines completed by p: the start of its first one may be earlier.
		start := bytes.LastIndexByte(w.buf.Bytes()[:from], '\n') + 1
		done := w.buf.Bytes()[start:]
		if i := bytes.LastIndexByte(done, '\n'); i >= 0 && bytes.Contains(done[:i], w.end) {
			w.seen = true
			close(w.ended)
		}
	}
	return len(p), nil
}

func (w *endWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
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
		lines := run(t, agentcli.Claude(t, s.URL), "result", bin, "-p", "--output-format", "stream-json", "--verbose", "hello")
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
		lines := run(t, agentcli.Codex(t, s.URL, "gpt-standin"), "turn.completed", bin, "exec", "--json", "--skip-git-repo-check", "hello")
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
		lines := run(t, agentcli.Gemini(t, s.URL), "result", bin, "-p", "hello", "--output-format", "stream-json")
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
