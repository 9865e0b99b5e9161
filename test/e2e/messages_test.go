package e2e

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeConfig writes an edge config to a temp file and returns its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestStartupMessagesAreClear is issue 13's "CLI and messages" for the
// binaries: a busy port is one line, a tab-indented or mistyped config names
// the line and key in the file's terms, an empty config warns, a node that
// never connected does not claim a lost link, the token error names
// $IOP_NODE_TOKEN.
func TestStartupMessagesAreClear(t *testing.T) {
	t.Parallel()
	t.Run("busy port", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		p := startEdgeProc(t, writeConfig(t, edgeConfig(freeAddr(t), ln.Addr().String(), " []\n")))
		if code := p.waitExit(t, 20*time.Second); code != 1 {
			t.Fatalf("exit %d", code)
		}
		// fx's own account of the failure stays at debug level.
		out := p.out.String()
		if !strings.Contains(out, "iop-edge: cannot start: "+ln.Addr().String()+" is already in use") || strings.Contains(out, "level=ERROR") {
			t.Fatalf("output:\n%s", out)
		}
	})
	// --pprof's port too: busy is a failure to start (1), off loopback a
	// usage error (2).
	t.Run("busy pprof port", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cfg := writeConfig(t, edgeConfig(freeAddr(t), freeAddr(t), " []\n"))
		p := start(t, "iop-edge", nil, "--config", cfg, "--pprof", ln.Addr().String())
		if code := p.waitExit(t, 20*time.Second); code != 1 {
			t.Fatalf("exit %d:\n%s", code, p.out.String())
		}
		if out := p.out.String(); !strings.Contains(out, "iop-edge: cannot start: --pprof: listen tcp "+ln.Addr().String()) {
			t.Fatalf("output:\n%s", out)
		}
		p = start(t, "iop-edge", nil, "--config", cfg, "--pprof", "0.0.0.0:0")
		if code := p.waitExit(t, 20*time.Second); code != 2 {
			t.Fatalf("off-loopback --pprof: exit %d:\n%s", code, p.out.String())
		}
	})
	t.Run("tab-indented config", func(t *testing.T) {
		p := startEdgeProc(t, writeConfig(t, "transport:\n\tlisten: 127.0.0.1:0\n"))
		if code := p.waitExit(t, 20*time.Second); code != 2 {
			t.Fatalf("exit %d", code)
		}
		if out := p.out.String(); !strings.Contains(out, "line 2:") || !strings.Contains(out, "not tabs") {
			t.Fatalf("output:\n%s", out)
		}
	})
	t.Run("config errors in the file's terms", func(t *testing.T) {
		p := startEdgeProc(t, writeConfig(t, "transport:\n  listn: x\n  max_frame_size: [1]\n"))
		if code := p.waitExit(t, 20*time.Second); code != 2 {
			t.Fatalf("exit %d", code)
		}
		out := p.out.String()
		if !strings.Contains(out, `line 2: unknown key "transport.listn"`) || !strings.Contains(out, "line 3: transport.max_frame_size: expected a whole number, got a list") || strings.Contains(out, "config.") {
			t.Fatalf("output:\n%s", out)
		}
	})
	// An adapter entry a reload would refuse stops the start too (it once
	// started the edge, and its node was refused at every registration).
	t.Run("adapter without a type", func(t *testing.T) {
		path := writeConfig(t, edgeConfig(freeAddr(t), freeAddr(t), `
  - id: gpu-box
    token: e2e-token-0001
    adapters:
      - {name: llm, base_url: "http://127.0.0.1:11434"}
`))
		p := startEdgeProc(t, path)
		if code := p.waitExit(t, 20*time.Second); code != 2 {
			t.Fatalf("exit %d", code)
		}
		if out := p.out.String(); out != "iop-edge: "+path+`: line 13: nodes[0] (id "gpu-box"): adapter "llm" has no type`+"\n" {
			t.Fatalf("output:\n%s", out)
		}
	})
	// A value the file sets that is refused names the file and its line,
	// as a YAML error does, for node.yaml (whose values are checked after
	// the flags are applied) as for edge.yaml; a value from a flag names none.
	// A stats interval of a nanosecond was taken: the node spent a core
	// sending the edge tens of thousands of stats frames a second.
	t.Run("stats interval below the floor", func(t *testing.T) {
		for _, c := range []struct {
			env  []string
			args []string
			want string
		}{
			{nil, []string{"--stats-interval", "1ns"}, "iop-node: --stats-interval 1ns is below 100ms\n"},
			{[]string{"IOP_NODE_STATS_INTERVAL=1ms"}, nil, "iop-node: IOP_NODE_STATS_INTERVAL 1ms is below 100ms\n"},
		} {
			db := "file:" + filepath.Join(t.TempDir(), "node.db") + "?mode=rwc"
			args := append([]string{"--edge", freeAddr(t), "--insecure", "--token", "a-node-token", "--db", db}, c.args...)
			nd := start(t, "iop-node", c.env, args...)
			if code := nd.waitExit(t, 20*time.Second); code != 2 || nd.out.String() != c.want {
				t.Fatalf("%v %v: exit %d:\n%s\nwant\n%s", c.env, c.args, code, nd.out.String(), c.want)
			}
		}
	})
	t.Run("value errors name the line", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "node.yaml")
		if err := os.WriteFile(path, []byte("token: a-node-token\ninsecure: true\nreconnect:\n  min: -1s\nlog: {level: loud}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		nd := start(t, "iop-node", nil, "--config", path, "--edge", "::1:7700")
		code := nd.waitExit(t, 20*time.Second)
		want := `iop-node: edge "::1:7700" is not host:port: too many colons in address (an IPv6 address goes in brackets, and in YAML in quotes: "[::1]:7700")
iop-node: ` + path + `: line 5: log.level "loud" is not one of debug, info, warn, error
iop-node: ` + path + `: line 4: reconnect.min must be positive, got -1s
`
		if out := nd.out.String(); code != 2 || out != want {
			t.Fatalf("exit %d:\n%s\nwant\n%s", code, out, want)
		}
	})
	// An IPv6 address without quotes is a YAML syntax error ("[" starts a
	// list) that yaml reports without a line on line 1: the edge names the
	// line and key and shows the quoted form.
	t.Run("unquoted IPv6 address", func(t *testing.T) {
		path := writeConfig(t, "transport:\n  listen: [::1]:0\nhttp:\n  listen: [::1]:0\n")
		p := startEdgeProc(t, path)
		code := p.waitExit(t, 20*time.Second)
		want := "iop-edge: " + path + `: line 2: transport.listen: [::1]:0 must be quoted: write "[::1]:0" (unquoted, YAML reads "[" as the start of a list)
iop-edge: ` + path + `: line 4: http.listen: [::1]:0 must be quoted: write "[::1]:0" (unquoted, YAML reads "[" as the start of a list)
`
		if out := p.out.String(); code != 2 || out != want {
			t.Fatalf("exit %d:\n%s\nwant\n%s", code, out, want)
		}
		path = filepath.Join(t.TempDir(), "node.yaml")
		if err := os.WriteFile(path, []byte("edge: [::1]:7700\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		nd := start(t, "iop-node", nil, "--config", path)
		code = nd.waitExit(t, 20*time.Second)
		want = "iop-node: " + path + `: line 1: edge: [::1]:7700 must be quoted: write "[::1]:7700" (unquoted, YAML reads "[" as the start of a list)
`
		if out := nd.out.String(); code != 2 || out != want {
			t.Fatalf("exit %d:\n%s\nwant\n%s", code, out, want)
		}
	})
	t.Run("empty config warns", func(t *testing.T) {
		e := &edge{transport: freeAddr(t)}
		httpAddr := freeAddr(t)
		e.url = "http://" + httpAddr
		e.proc = startEdgeProc(t, writeConfig(t, edgeConfig(e.transport, httpAddr, " []\n")))
		waitHealthy(t, e.url, e.proc)
		if out := e.out.String(); !strings.Contains(out, "no nodes configured") {
			t.Fatalf("output:\n%s", out)
		}
	})
	t.Run("node never connected", func(t *testing.T) {
		nd := start(t, "iop-node", nil, "--edge", freeAddr(t), "--insecure", "--token", "x", "--db", "file:"+filepath.Join(t.TempDir(), "n.db"))
		deadline := time.Now().Add(15 * time.Second)
		for !strings.Contains(nd.out.String(), "cannot connect to the edge") && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if out := nd.out.String(); !strings.Contains(out, "cannot connect to the edge") || strings.Contains(out, "link to edge lost") {
			t.Fatalf("output:\n%s", out)
		}
	})
	t.Run("no token", func(t *testing.T) {
		nd := start(t, "iop-node", []string{"IOP_NODE_TOKEN="}, "--edge", freeAddr(t), "--insecure")
		if code := nd.waitExit(t, 20*time.Second); code != 2 {
			t.Fatalf("exit %d", code)
		}
		if out := nd.out.String(); !strings.Contains(out, "$IOP_NODE_TOKEN") {
			t.Fatalf("output:\n%s", out)
		}
	})
	// No way to trust the edge alone exits 1 with the hint; with other
	// mistakes it is one of several problems, each on its own prefixed
	// line, and the exit is a config error's (2).
	t.Run("no trust option", func(t *testing.T) {
		nd := start(t, "iop-node", nil, "--edge", freeAddr(t), "--token", "a-node-token")
		if code := nd.waitExit(t, 20*time.Second); code != 1 || !strings.Contains(nd.out.String(), "iop-node: no way to trust the edge") {
			t.Fatalf("exit %d:\n%s", code, nd.out.String())
		}
		nd = start(t, "iop-node", nil, "--edge", freeAddr(t), "--token", "a-node-token", "--log-level", "verbose")
		code := nd.waitExit(t, 20*time.Second)
		out := nd.out.String()
		if code != 2 || !strings.Contains(out, "iop-node: log.level \"verbose\"") || !strings.Contains(out, "iop-node: no way to trust the edge") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
	})
}

// TestCLIUsageAndMessages: the iop CLI's usage conventions and the edge's
// request-body errors, with the real binaries.
func TestCLIUsageAndMessages(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")

	if out, errOut, code := cli(t, e, ""); code != 2 || out != "" || !strings.Contains(errOut, "Available Commands:") {
		t.Fatalf("iop alone: rc %d\nstdout %q\nstderr %q", code, out, errOut)
	}
	if out, _, code := cli(t, e, "", "--version"); code != 0 || !strings.HasPrefix(out, "iop ") {
		t.Fatalf("iop --version: rc %d %q", code, out)
	}
	if _, errOut, code := cli(t, e, "", "run", "--adapter", "exec", "--bogus"); code != 2 || !strings.Contains(errOut, "Run 'iop run --help' for usage.") {
		t.Fatalf("usage error: rc %d %q", code, errOut)
	}
	_, errOut, code := cli(t, e, "", "run", "--node", "n1", "--adapter", "exec")
	if code != 2 || !strings.Contains(errOut, "--target is required") || strings.Count(errOut, "target_not_found") > 0 {
		t.Fatalf("no --target: rc %d %q", code, errOut)
	}
	for body, want := range map[string]string{
		`[1]`:                         "request body: expected a JSON object, got an array",
		`{"adapter":"exec","node":5}`: "request body: node: expected a string, got a number",
	} {
		resp, err := http.Post(e.url+"/v1/runs", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), want) || strings.Contains(string(b), "Go value") {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
	}
}

// iop pointed at the edge's node link (transport.listen, which nodes dial)
// instead of its HTTP API says which address it wants: the link closes a
// connection that does not start TLS with the edge's framing, and iop said
// only "cannot reach the edge at …: EOF".
func TestCLIAtTheNodeLinkNamesTheHTTPAddress(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(1))
	link := &edge{url: "http://" + e.transport}
	for _, args := range [][]string{{"nodes"}, {"run", "--adapter", "exec", "--target", "upper", "x"}} {
		_, errOut, code := cli(t, link, "", args...)
		want := "iop: cannot reach the edge at " + link.url + " (set --edge or IOP_EDGE): EOF (what answered closed the connection without an HTTP answer: is the address the edge's http.listen, not its transport.listen, which nodes dial?)\n"
		if code != 1 || errOut != want {
			t.Fatalf("%v: exit %d, stderr %q; want 1, %q", args, code, errOut, want)
		}
	}
}
