// Package standin helps the runtime adapters' tests stand in for upstream
// servers and CLIs: it writes recorded streams in awkward pieces and writes
// fake CLI scripts.
package standin

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Split writes body to w in pieces of 1 to 7 bytes, flushing after each, so
// that a reader sees lines cut in the middle, UTF-8 sequences cut between
// their bytes and JSON values cut anywhere. It stops early when the client
// has gone.
func Split(w http.ResponseWriter, body string) {
	f, _ := w.(http.Flusher)
	for i, n := 0, 1; i < len(body); n = n%7 + 1 {
		end := min(i+n, len(body))
		if _, err := w.Write([]byte(body[i:end])); err != nil {
			return
		}
		if f != nil {
			f.Flush()
		}
		i = end
		time.Sleep(50 * time.Microsecond)
	}
}

// Lines joins lines with "\n", ending with one.
func Lines(lines ...string) string {
	return strings.Join(lines, "\n") + "\n"
}

// RefusedURL returns an http URL on loopback where nothing listens.
func RefusedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// Markers in the argv file: after each argument, and after each run.
const (
	argMark = "::arg::"
	runMark = "::run::"
)

// CLI is a fake command-line agent: a /bin/sh script that records its argv
// (one argument per line) to ArgvFile and its stdin to StdinFile, then runs
// the given body. It is written once, before any test runs it.
type CLI struct {
	Path      string
	ArgvFile  string
	StdinFile string
}

// WriteCLI writes a fake CLI into a new temporary directory. body is shell
// code run after the recording (use Printf to print recorded output).
func WriteCLI(t *testing.T, body string) CLI {
	t.Helper()
	dir := t.TempDir()
	c := CLI{Path: filepath.Join(dir, "agent"), ArgvFile: filepath.Join(dir, "argv"), StdinFile: filepath.Join(dir, "stdin")}
	script := fmt.Sprintf("#!/bin/sh\nfor a in \"$@\"; do printf '%%s\\n%[4]s\\n' \"$a\" >> %[1]s; done\nprintf '%[5]s\\n' >> %[1]s\ncat > %[2]s\n%[3]s\n",
		Quote(c.ArgvFile), Quote(c.StdinFile), body, argMark, runMark)
	if err := os.WriteFile(c.Path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return c
}

// Runs returns the recorded argv of every run so far, in order.
func (c CLI) Runs(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(c.ArgvFile)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var runs [][]string
	for _, run := range strings.SplitAfter(string(b), runMark+"\n") {
		if run == "" {
			continue
		}
		args := strings.Split(strings.TrimSuffix(run, runMark+"\n"), "\n"+argMark+"\n")
		runs = append(runs, args[:len(args)-1])
	}
	return runs
}

// Stdin returns what the last run read on stdin.
func (c CLI) Stdin(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(c.StdinFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Printf returns shell code that prints out in pieces of 1 to 7 bytes with
// short pauses, so the reader sees lines, runes and JSON values cut.
func Printf(out string) string {
	var b strings.Builder
	for i, n := 0, 1; i < len(out); n = n%7 + 1 {
		end := min(i+n, len(out))
		fmt.Fprintf(&b, "printf '%%s' %s\n", Quote(out[i:end]))
		i = end
	}
	return b.String()
}

// Quote quotes s for /bin/sh.
func Quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// EnvCLI writes a CLI script that records its environment and then prints
// out; the returned func reads what the last run recorded.
func EnvCLI(t *testing.T, out string) (CLI, func() string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "env")
	cli := WriteCLI(t, "env > "+Quote(file)+"\n"+Printf(out))
	return cli, func() string {
		t.Helper()
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
}

// CheckEnv fails t when env (as `env` prints it) holds one of leaks or
// lacks one of wants (whole NAME=value lines, or a NAME= prefix).
func CheckEnv(t *testing.T, env string, leaks, wants []string) {
	t.Helper()
	for _, leak := range leaks {
		if strings.Contains(env, leak) {
			t.Fatalf("the child's environment holds %q:\n%s", leak, env)
		}
	}
	lines := "\n" + env
	for _, want := range wants {
		if !strings.Contains(lines, "\n"+want) {
			t.Fatalf("the child's environment lacks %q:\n%s", want, env)
		}
	}
}
