package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// spkiPin is the pin of a certificate's public key, computed here
// independently of the code under test.
func spkiPin(c *x509.Certificate) string {
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// runUpper runs the upper target through e and returns its output text.
func runUpper(t *testing.T, e *edge, input string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	evs := collectRun(t, startRun(t, ctx, e, map[string]any{"adapter": "exec", "target": "upper", "input": input}))
	checkWellFormed(t, evs)
	if last := evs[len(evs)-1]; last.Type != "complete" {
		t.Fatalf("run ended %s: %+v", last.Type, evs)
	}
	var out strings.Builder
	for _, ev := range evs {
		if ev.Type == "delta" {
			out.WriteString(ev.Text)
		}
	}
	return out.String()
}

func TestTLSDefaultEdgeSpeaksTLSAndPinnedNodeRuns(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))

	// The transport port answers a TLS handshake, and the top of the chain
	// it presents is the key --print-ca-pin named.
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", e.transport, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("TLS handshake with the default edge: %v", err)
	}
	chain := conn.ConnectionState().PeerCertificates
	conn.Close()
	if got := spkiPin(chain[len(chain)-1]); got != e.pin {
		t.Fatalf("edge presents a chain topped by %s, --print-ca-pin said %s", got, e.pin)
	}
	if again := printCAPin(t, e.config); again != e.pin {
		t.Fatalf("pin changed between calls: %s then %s", e.pin, again)
	}

	n := startNode(t, e, testToken)
	waitNode(t, e, "n1")
	if got := runUpper(t, e, "over tls\n"); got != "OVER TLS\n" {
		t.Fatalf("run output %q", got)
	}
	// The token is in no log line of either process.
	for _, p := range []*proc{e.proc, n.proc} {
		if strings.Contains(p.out.String(), testToken) {
			t.Fatalf("%s output contains the token:\n%s", p.name, p.out.String())
		}
	}
}

func TestTLSWrongPinExitsNamingThePins(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	wrong := "sha256:" + strings.Repeat("ab", 32)
	start := time.Now()
	n := startNodeOpts(t, e, testToken, nodeOptions{trust: []string{"--ca-pin", wrong}})
	code := n.waitExit(t, 10*time.Second)
	if code == 0 {
		t.Fatalf("node with a wrong pin exited 0:\n%s", n.out.String())
	}
	out := n.out.String()
	if !strings.Contains(out, wrong) || !strings.Contains(out, e.pin) {
		t.Fatalf("output should name the expected pin %s and the edge's %s:\n%s", wrong, e.pin, out)
	}
	if strings.Count(out, "link to edge lost; reconnecting") > 0 {
		t.Fatalf("node retried after a pin mismatch:\n%s", out)
	}
	t.Logf("node exited %d after %v", code, time.Since(start).Round(time.Millisecond))
	var nl nodeList
	if err := getJSON(e.url+"/v1/nodes", &nl); err != nil || len(nl.connected()) != 0 {
		t.Fatalf("nodes after a pin mismatch: %+v (%v)", nl, err)
	}
}

func TestTLSNodeWithoutTrustOptionExits1WithHint(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	n := startNodeOpts(t, e, testToken, nodeOptions{trust: []string{}})
	if code := n.waitExit(t, 10*time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", code, n.out.String())
	}
	for _, hint := range []string{"--ca-pin", "--ca-file", "--insecure"} {
		if !strings.Contains(n.out.String(), hint) {
			t.Fatalf("hint does not name %s:\n%s", hint, n.out.String())
		}
	}
	if strings.Contains(e.out.String(), "handshake") {
		t.Fatalf("the node dialed before failing:\n%s", e.out.String())
	}
}

func TestTLSPlaintextClientIsRefused(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	w := watchBus(t, e)
	n := startNodeOpts(t, e, testToken, nodeOptions{trust: []string{"--insecure"}})
	ev := w.waitFor(t, 10*time.Second, "node.rejected with a tls reason", func(m map[string]any) bool {
		r, _ := m["reason"].(string)
		return m["type"] == "node.rejected" && strings.HasPrefix(r, "tls")
	})
	t.Logf("rejected: %v", ev["reason"])
	var nl nodeList
	if err := getJSON(e.url+"/v1/nodes", &nl); err != nil || len(nl.connected()) != 0 {
		t.Fatalf("a plaintext node registered: %+v (%v)", nl, err)
	}
	if strings.Contains(n.out.String(), "registered with edge") {
		t.Fatal("plaintext node got a register response")
	}
}

func TestTLSPlaintextModeOnlyOnLoopback(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.yaml")
	_, port, _ := net.SplitHostPort(freeAddr(t))
	if err := os.WriteFile(cfg, []byte(edgeConfigTLS("0.0.0.0:"+port, freeAddr(t), "{mode: off}", defaultNodes(1))), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startEdgeProc(t, cfg)
	if code := p.waitExit(t, 10*time.Second); code == 0 {
		t.Fatal("edge started plaintext on all interfaces")
	}
	if !strings.Contains(p.out.String(), "loopback") {
		t.Fatalf("refusal does not say why:\n%s", p.out.String())
	}

	// On loopback, mode off works with --insecure nodes.
	e := startEdgeOpts(t, defaultNodes(1), edgeOptions{tls: "{mode: off}"})
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	if got := runUpper(t, e, "plain\n"); got != "PLAIN\n" {
		t.Fatalf("output %q", got)
	}
}

// recorder is a TCP proxy that keeps every byte it relays.
type recorder struct {
	ln  net.Listener
	mu  sync.Mutex
	buf bytes.Buffer
	wg  sync.WaitGroup
}

func startRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln}
	var conns sync.Map
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			conns.Store(c, u)
			r.wg.Add(2)
			go func() { defer r.wg.Done(); r.pipe(u, c); u.Close() }()
			go func() { defer r.wg.Done(); r.pipe(c, u); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(k, v any) bool { k.(net.Conn).Close(); v.(net.Conn).Close(); return true })
		r.wg.Wait()
	})
	return r
}

func (r *recorder) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			r.mu.Lock()
			r.buf.Write(buf[:n])
			r.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.buf.Bytes())
}

func TestTLSProxyBetweenNodeAndEdgeSeesNoSecrets(t *testing.T) {
	t.Parallel()
	e := startEdge(t, defaultNodes(4))
	rec := startRecorder(t, e.transport)
	startNodeOpts(t, e, testToken, nodeOptions{edge: rec.ln.Addr().String()})
	waitNode(t, e, "n1")
	input := "confidential prompt 7f3a9c\n"
	if got := runUpper(t, e, input); got != strings.ToUpper(input) {
		t.Fatalf("run through the proxy returned %q", got)
	}
	seen := rec.bytes()
	if len(seen) < 1000 {
		t.Fatalf("proxy relayed only %d bytes; the link did not go through it", len(seen))
	}
	for _, secret := range []string{testToken, input, strings.ToUpper(input), "confidential", "CONFIDENTIAL"} {
		if bytes.Contains(seen, []byte(secret)) {
			t.Fatalf("proxy saw %q in clear", secret)
		}
	}
}

// nodeCA is a CA for node client certificates, made by the test.
type nodeCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newNodeCA(t *testing.T) *nodeCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test nodes CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	file := filepath.Join(t.TempDir(), "nodes-ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &nodeCA{cert: c, key: key, file: file}
}

// issue returns --cert/--key flags for a client certificate with this CN.
func (ca *nodeCA) issue(t *testing.T, cn string) []string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalPKCS8PrivateKey(key)
	dir := t.TempDir()
	cf, kf := filepath.Join(dir, cn+".pem"), filepath.Join(dir, cn+".key")
	if err := os.WriteFile(cf, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kf, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--cert", cf, "--key", kf}
}

// Each refusal gets its own edge: an edge may fold repeated handshake
// failures from one address into one report.
func TestTLSMutualClientCertificates(t *testing.T) {
	t.Parallel()
	ca, otherCA := newNodeCA(t), newNodeCA(t)
	mtlsEdge := func(t *testing.T) (*edge, *busWatcher) {
		e := startEdgeOpts(t, defaultNodes(4), edgeOptions{tls: fmt.Sprintf("{client_ca_file: %q, bind_node_identity: true}", ca.file)})
		return e, watchBus(t, e)
	}
	rejected := func(t *testing.T, w *busWatcher, what string, match func(reason string) bool) {
		t.Helper()
		w.waitFor(t, 10*time.Second, what, func(m map[string]any) bool {
			r, _ := m["reason"].(string)
			return m["type"] == "node.rejected" && match(r)
		})
	}
	notRegistered := func(t *testing.T, e *edge) {
		t.Helper()
		var nl nodeList
		if err := getJSON(e.url+"/v1/nodes", &nl); err != nil || len(nl.connected()) != 0 {
			t.Fatalf("nodes: %+v (%v), want none", nl, err)
		}
	}
	t.Run("no certificate", func(t *testing.T) {
		t.Parallel()
		e, w := mtlsEdge(t)
		startNode(t, e, testToken)
		rejected(t, w, "node.rejected tls", func(r string) bool { return strings.HasPrefix(r, "tls") })
		notRegistered(t, e)
	})
	t.Run("certificate from another CA", func(t *testing.T) {
		t.Parallel()
		e, w := mtlsEdge(t)
		startNodeOpts(t, e, testToken, nodeOptions{args: otherCA.issue(t, "n1")})
		rejected(t, w, "node.rejected tls (unknown CA)", func(r string) bool {
			return strings.HasPrefix(r, "tls") && strings.Contains(r, "certificate")
		})
		notRegistered(t, e)
	})
	t.Run("certificate for another node, then the right one", func(t *testing.T) {
		t.Parallel()
		e, w := mtlsEdge(t)
		wrongID := startNodeOpts(t, e, testToken, nodeOptions{args: ca.issue(t, "n2")})
		rejected(t, w, "node.rejected identity_mismatch", func(r string) bool { return strings.HasPrefix(r, "identity_mismatch") })
		if code := wrongID.waitExit(t, 10*time.Second); code == 0 {
			t.Fatal("node with another node's certificate exited 0")
		}
		notRegistered(t, e)
		startNodeOpts(t, e, testToken, nodeOptions{args: ca.issue(t, "n1")})
		waitNode(t, e, "n1")
		if got := runUpper(t, e, "mtls\n"); got != "MTLS\n" {
			t.Fatalf("output %q", got)
		}
	})
}

func TestTokenSHA256AndJoin(t *testing.T) {
	t.Parallel()
	const token = "hashed-node-token-5150"
	hash := exec.Command(filepath.Join(binDir, "iop-edge"), "hash-token")
	hash.Stdin = strings.NewReader(token + "\n")
	out, err := hash.Output()
	if err != nil {
		t.Fatalf("hash-token: %v", err)
	}
	digest := strings.TrimSpace(string(out))
	if sum := sha256.Sum256([]byte(token)); digest != hex.EncodeToString(sum[:]) {
		t.Fatalf("hash-token printed %q", digest)
	}
	e := startEdge(t, fmt.Sprintf(`
  - id: hashed
    token_sha256: %s
    adapters:
      - name: exec
        type: exec
        targets:
          upper: {command: ["tr", "a-z", "A-Z"]}
`, digest))
	if strings.Contains(e.out.String(), token) {
		t.Fatal("edge log has the token")
	}

	// join prints the command line; run exactly that with the token in the environment.
	join, err := exec.Command(filepath.Join(binDir, "iop-edge"), "--config", e.config, "join", "hashed").Output()
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if strings.Contains(string(join), token) {
		t.Fatalf("join output has the token:\n%s", join)
	}
	var line string
	for l := range strings.Lines(string(join)) {
		if strings.HasPrefix(l, "iop-node ") {
			line = strings.TrimSpace(l)
		}
	}
	args := strings.Fields(line)
	if len(args) == 0 || !strings.Contains(line, "--edge "+e.transport) || !strings.Contains(line, "--ca-pin "+e.pin) {
		t.Fatalf("join printed no usable iop-node line (want --edge %s --ca-pin %s):\n%s", e.transport, e.pin, join)
	}
	db := filepath.Join(t.TempDir(), "node.db")
	n := start(t, "iop-node", []string{"IOP_NODE_TOKEN=" + token}, append(args[1:], "--db", "file:"+db+"?cache=shared&mode=rwc")...)
	waitNode(t, e, "hashed")
	if got := runUpper(t, e, "hashed\n"); got != "HASHED\n" {
		t.Fatalf("output %q", got)
	}
	if strings.Contains(n.out.String(), token) || strings.Contains(e.out.String(), token) {
		t.Fatal("a log has the token")
	}
}
