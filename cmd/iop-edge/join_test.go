package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/adapters/config"
	"iop/adapters/tlsca"
)

// --address is taken before or after the node id; a second id is refused.
func TestJoinFlagsAroundTheNodeID(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.yaml")
	doc := "transport: {listen: \"127.0.0.1:7700\", tls: {mode: \"off\"}}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--address", "edge.example.com:7700", "gpu-box"},
		{"gpu-box", "--address", "edge.example.com:7700"},
		{"gpu-box", "--address=edge.example.com:7700"},
	} {
		var out, errOut bytes.Buffer
		if err := join(cfg, &out, &errOut, args); err != nil {
			t.Fatalf("join %q: %v (%s)", args, err, errOut.String())
		}
		if !strings.Contains(out.String(), "iop-node --edge edge.example.com:7700 --insecure\n") {
			t.Errorf("join %q printed:\n%s", args, out.String())
		}
	}
	var out, errOut bytes.Buffer
	if err := join(cfg, &out, &errOut, []string{"gpu-box", "other"}); err == nil || !strings.Contains(err.Error(), "usage:") {
		t.Errorf("join with two ids: %v", err)
	}
}

// A mistake in the command line or the config file exits 2, as the edge's
// own flags and config do; join's other failures (an unknown node) exit 1.
func TestJoinUsageAndConfigErrorsExit2(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("transport: {listen: \"127.0.0.1:7700\", tls: {mode: \"off\"}}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("nodes:\n  - {id: gpu-box, tokn: aaaaaaaa}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg   string
		args  []string
		usage bool
	}{
		{good, []string{"gpu-box", "other"}, true},
		{good, []string{"--nope", "gpu-box"}, true},
		{bad, []string{"gpu-box"}, true},
		{good, []string{"absent"}, false},
	} {
		var out, errOut bytes.Buffer
		err := join(tc.cfg, &out, &errOut, tc.args)
		if err == nil || errors.As(err, new(usageError)) != tc.usage {
			t.Errorf("join %q with %s: %v; want an error, usage (exit 2): %v", tc.args, filepath.Base(tc.cfg), err, tc.usage)
		}
	}
}

// On a wildcard listen address the node dials the first name of the
// edge's certificate that names a host: a wildcard ("*.example.com") does
// not.
func TestJoinSkipsAWildcardHost(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.yaml")
	doc := "transport: {listen: \"0.0.0.0:7700\", tls: {mode: auto, hosts: [\"*.example.com\", edge.example.com]}}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := join(cfg, &out, &errOut, []string{"gpu-box"}); err != nil {
		t.Fatalf("join: %v (%s)", err, errOut.String())
	}
	if !strings.Contains(out.String(), "--edge edge.example.com:7700 ") || strings.Contains(out.String(), "*.") {
		t.Fatalf("join printed:\n%s", out.String())
	}
}

// The token line join prints is POSIX sh: dash, zsh and bash each run it
// as pasted, read the token from stdin (here not a terminal, so stty
// cannot turn echo off) and export it to iop-node.
func TestJoinTokenLineRunsInEveryShell(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	doc := "transport: {listen: \"127.0.0.1:7700\", tls: {mode: \"off\"}}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := join(cfg, &out, &errOut, []string{"gpu-box"}); err != nil {
		t.Fatalf("join: %v (%s)", err, errOut.String())
	}
	var line string
	for l := range strings.Lines(out.String()) {
		if strings.Contains(l, "IOP_NODE_TOKEN") && !strings.HasPrefix(l, "#") {
			line = strings.TrimSuffix(l, "\n")
		}
	}
	if line == "" {
		t.Fatalf("join printed no token line:\n%s", out.String())
	}
	const token = "tok-with $pecial `chars` and \\ back*slash"
	ran := 0
	for _, sh := range []string{"sh", "dash", "zsh", "bash"} {
		path, err := exec.LookPath(sh)
		if err != nil {
			continue
		}
		ran++
		// The child shell sees the token only if it was exported.
		cmd := exec.Command(path, "-c", line+"\nexec sh -c 'printf \"<%s>\" \"$IOP_NODE_TOKEN\"'")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		cmd.Stdin = strings.NewReader(token + "\n")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		got, err := cmd.Output()
		if err != nil || stderr.Len() > 0 {
			t.Errorf("%s: %v, stderr %q", sh, err, stderr.String())
			continue
		}
		if want := "iop token for node gpu-box: \n<" + token + ">"; string(got) != want {
			t.Errorf("%s printed %q, want %q", sh, got, want)
		}
	}
	// README's sample output shows the same line.
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "\n   "+tokenPrompt("gpu-box")+"\n") {
		t.Errorf("README.md does not show join's token line %q", tokenPrompt("gpu-box"))
	}
	if ran == 0 {
		t.Skip("no shell found")
	}
}

// join warns when the address it prints is one the node-link certificate
// does not name: the node it prints the command for would stop at once on
// the host name. An address the certificate names gets no warning.
func TestJoinWarnsOfAnAddressTheCertificateLacks(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.yaml")
	doc := "transport: {listen: \"127.0.0.1:7700\"}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	for addr, warn := range map[string]bool{"edge.example.com:7700": true, "203.0.113.7:7700": true, "127.0.0.1:7700": false, "localhost:7700": false} {
		var out, errOut bytes.Buffer
		if err := join(cfg, &out, &errOut, []string{"--address", addr, "gpu-box"}); err != nil {
			t.Fatalf("join --address %s: %v", addr, err)
		}
		got := errOut.String()
		if warn != strings.Contains(got, "does not name") {
			t.Errorf("join --address %s: stderr %q, want a warning: %v", addr, got, warn)
		}
		if warn && !strings.Contains(got, "transport.tls.hosts") {
			t.Errorf("join --address %s: warning %q does not say to add it to transport.tls.hosts", addr, got)
		}
		if !strings.Contains(out.String(), "iop-node --edge "+addr+" --ca-pin sha256:") {
			t.Errorf("join --address %s printed:\n%s", addr, out.String())
		}
	}
}

// join on an edge whose node link listens on loopback (the default) warns
// that a node on another machine cannot connect: the command it prints
// would dial the node's own machine and retry for ever.
func TestJoinWarnsOfALoopbackListen(t *testing.T) {
	dir := t.TempDir()
	for listen, warn := range map[string]bool{"127.0.0.1:7700": true, "localhost:7700": true, "0.0.0.0:7700": false, "192.0.2.10:7700": false} {
		cfg := filepath.Join(dir, "edge.yaml")
		doc := "transport: {listen: \"" + listen + "\", tls: {mode: \"off\"}}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"
		if !warn {
			doc = "transport: {listen: \"" + listen + "\"}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"
		}
		if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if err := join(cfg, &out, &errOut, []string{"--address", "edge.example.com:7700", "gpu-box"}); err != nil {
			t.Fatalf("listen %s: join: %v (%s)", listen, err, errOut.String())
		}
		got := strings.Contains(errOut.String(), "is a loopback address")
		if got != warn {
			t.Errorf("listen %s: stderr %q, want the loopback warning: %v", listen, errOut.String(), warn)
		}
		if warn && !strings.Contains(errOut.String(), "0.0.0.0:7700") {
			t.Errorf("listen %s: the warning %q does not say what to set", listen, errOut.String())
		}
		// These loopback configs have mode off, which the edge allows only
		// on loopback: the warning must also say to turn TLS on, or the
		// edge refuses the address it suggests.
		if warn && !strings.Contains(errOut.String(), "set transport.tls.mode: auto") {
			t.Errorf("listen %s (mode off): the warning %q does not say to set transport.tls.mode: auto", listen, errOut.String())
		}
		if !warn {
			continue
		}
		// With the address the warning suggests (and mode off) the edge
		// refuses to start; with mode auto too, it accepts it.
		for mode, ok := range map[string]bool{"off": false, "auto": true} {
			_, err := config.LoadEdgeShape(writeConfig(t, dir, "transport: {listen: \"0.0.0.0:7700\", tls: {mode: \""+mode+"\"}}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"))
			if (err == nil) != ok {
				t.Errorf("listen 0.0.0.0:7700, mode %s: config %v, want accepted: %v", mode, err, ok)
			}
		}
	}
}

// join and --print-ca-pin open the edge CA as the edge does, so they too
// re-sign one made while the clock was ahead. That changes ca.pem, which
// --ca-file nodes need: the operator is told, on stderr.
func TestJoinAndPrintCAPinTellOfAResignedCA(t *testing.T) {
	for _, cmd := range []string{"join", "--print-ca-pin"} {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "edge.yaml")
		doc := "state_dir: " + filepath.Join(dir, "state") + "\ntransport: {listen: \"0.0.0.0:7700\"}\nnodes:\n  - {id: gpu-box, token: aaaaaaaa}\n"
		if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		ahead, err := tlsca.Open(tlsca.Options{Dir: filepath.Join(dir, "state", "tls"), Hosts: []string{"localhost"},
			Now: func() time.Time { return time.Now().Add(3 * 24 * time.Hour) }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if cmd == "join" {
			err = join(cfg, &out, &errOut, []string{"--address", "edge.example.com:7700", "gpu-box"})
		} else {
			var c *config.EdgeConfig
			if c, err = config.LoadEdgeShape(cfg); err == nil {
				err = printCAPin(c, &out, &errOut)
			}
		}
		if err != nil {
			t.Fatalf("%s: %v (%s)", cmd, err, errOut.String())
		}
		if !strings.Contains(out.String(), ahead.Pin()) {
			t.Errorf("%s printed %q, want the unchanged pin %s", cmd, out.String(), ahead.Pin())
		}
		if e := errOut.String(); !strings.Contains(e, "re-signed it for the same key") || !strings.Contains(e, "need the new ca.pem") {
			t.Errorf("%s: stderr %q, want the re-signing and ca.pem warning", cmd, e)
		}
	}
}

func writeConfig(t *testing.T, dir, doc string) string {
	t.Helper()
	p := filepath.Join(dir, "suggested.yaml")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// join's output is made to be copied to the node's machine: a token
// pasted into token_env (where its variable's name goes) is not printed,
// while a variable name is.
func TestJoinDoesNotPrintATokenWrittenAsTokenEnv(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.yaml")
	const tok = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	doc := "transport: {listen: \"127.0.0.1:7700\", tls: {mode: \"off\"}}\nnodes:\n  - {id: a, token_env: " + tok + "}\n  - {id: b, token_env: IOP_B_TOKEN}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := join(cfg, &out, &errOut, []string{"a"}); err != nil {
		t.Fatalf("join a: %v (%s)", err, errOut.String())
	}
	if all := out.String() + errOut.String(); strings.Contains(all, tok) || !strings.Contains(all, "the variable its token_env names") {
		t.Errorf("join a printed:\n%s", all)
	}
	out.Reset()
	errOut.Reset()
	if err := join(cfg, &out, &errOut, []string{"b"}); err != nil {
		t.Fatalf("join b: %v (%s)", err, errOut.String())
	}
	if !strings.Contains(out.String(), "Paste the value of IOP_B_TOKEN in the edge's environment") {
		t.Errorf("join b printed:\n%s", out.String())
	}
}

// Nothing on stdin is named as such: "shorter than 8 characters" sent a
// user whose pipe was empty (an unset variable, a missing file) looking
// for a short token.
func TestHashTokenNamesAnEmptyStdin(t *testing.T) {
	var out bytes.Buffer
	for _, in := range []string{"", "\n"} {
		err := hashToken(strings.NewReader(in), &out, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "no token on stdin") {
			t.Errorf("stdin %q: %v, want it to say there was no token", in, err)
		}
	}
	if err := hashToken(strings.NewReader("short\n"), &out, io.Discard, nil); err == nil || !strings.Contains(err.Error(), "shorter than") {
		t.Errorf("a short token: %v", err)
	}
	if out.Len() != 0 {
		t.Errorf("printed %q for refused tokens", out.String())
	}
}
