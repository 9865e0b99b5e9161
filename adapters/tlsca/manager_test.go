package tlsca_test

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/adapters/tlsca"
)

var testHosts = []string{"edge.example.test", "localhost", "127.0.0.1", "::1"}

func open(t *testing.T, dir string, now time.Time, hosts ...string) *tlsca.Manager {
	t.Helper()
	if hosts == nil {
		hosts = testHosts
	}
	m, err := tlsca.Open(tlsca.Options{Dir: dir, Hosts: hosts, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return m
}

func perm(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func TestOpenCreatesPrivateStateAndAVerifiableChain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	now := time.Now()
	m := open(t, dir, now)

	if got := perm(t, dir); got != 0o700 {
		t.Fatalf("state dir mode %o, want 700", got)
	}
	for _, f := range []string{tlsca.CAKeyFile, tlsca.ServerKeyFile} {
		if got := perm(t, filepath.Join(dir, f)); got != 0o600 {
			t.Fatalf("%s mode %o, want 600", f, got)
		}
	}
	ca := m.CA()
	if !ca.IsCA || ca.PublicKeyAlgorithm != x509.ECDSA {
		t.Fatalf("CA: IsCA=%v alg=%v, want an ECDSA CA", ca.IsCA, ca.PublicKeyAlgorithm)
	}
	sum := sha256.Sum256(ca.RawSubjectPublicKeyInfo)
	if want := "sha256:" + hex.EncodeToString(sum[:]); m.Pin() != want {
		t.Fatalf("Pin() = %s, want %s", m.Pin(), want)
	}
	pemCA, err := tlsca.LoadPool(filepath.Join(dir, tlsca.CACertFile))
	if err != nil {
		t.Fatalf("ca.pem: %v", err)
	}
	leaf := m.Certificate().Leaf
	for _, h := range testHosts {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pemCA, DNSName: h, CurrentTime: now}); err != nil {
			t.Fatalf("server certificate does not verify for %s against ca.pem: %v", h, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pemCA, DNSName: "other.example.test", CurrentTime: now}); err == nil {
		t.Fatal("server certificate verifies for a host it was not issued for")
	}
	if len(m.Certificate().Certificate) != 2 {
		t.Fatalf("chain has %d certificates, want leaf + CA", len(m.Certificate().Certificate))
	}
}

func TestOpenReusesCAAndCertificate(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	first := open(t, dir, now)
	second := open(t, dir, now.Add(24*time.Hour))
	if first.Pin() != second.Pin() {
		t.Fatalf("CA changed across starts: %s then %s", first.Pin(), second.Pin())
	}
	if a, b := first.Certificate().Leaf.SerialNumber, second.Certificate().Leaf.SerialNumber; a.Cmp(b) != 0 {
		t.Fatal("a server certificate far from expiry was re-issued on restart")
	}
}

func TestRenewalBeforeExpiryKeepsTheCA(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	var clock = now
	m, err := tlsca.Open(tlsca.Options{Dir: dir, Hosts: testHosts, Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	old := m.Certificate().Leaf
	if renewed, err := m.Renew(); err != nil || renewed {
		t.Fatalf("Renew on a fresh certificate = %v, %v; want no renewal", renewed, err)
	}
	// 61 days in, less than the 30 days of RenewBefore are left of 90.
	clock = now.Add(61 * 24 * time.Hour)
	if renewed, err := m.Renew(); err != nil || !renewed {
		t.Fatalf("Renew near expiry = %v, %v; want a renewal", renewed, err)
	}
	got, _ := m.GetCertificate(nil)
	if got.Leaf.SerialNumber.Cmp(old.SerialNumber) == 0 || !got.Leaf.NotAfter.After(old.NotAfter) {
		t.Fatalf("GetCertificate still returns the old certificate (not after %v)", got.Leaf.NotAfter)
	}
	if err := got.Leaf.CheckSignatureFrom(m.CA()); err != nil {
		t.Fatalf("renewed certificate not from the same CA: %v", err)
	}
	// The renewal is on disk: a restart picks it up instead of issuing again.
	again := open(t, dir, clock)
	if again.Certificate().Leaf.SerialNumber.Cmp(got.Leaf.SerialNumber) != 0 || again.Pin() != m.Pin() {
		t.Fatal("restart after renewal did not load the renewed certificate")
	}
	// An expired certificate found at start is replaced too.
	later := open(t, dir, clock.Add(200*24*time.Hour))
	if !later.Certificate().Leaf.NotAfter.After(clock.Add(200 * 24 * time.Hour)) {
		t.Fatal("expired certificate kept at start")
	}
}

func TestNewHostReissues(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	m := open(t, dir, now)
	m2 := open(t, dir, now, append([]string{"edge2.example.test", "203.0.113.7"}, testHosts...)...)
	leaf := m2.Certificate().Leaf
	if leaf.SerialNumber.Cmp(m.Certificate().Leaf.SerialNumber) == 0 {
		t.Fatal("certificate not re-issued for a new host")
	}
	for _, h := range []string{"edge2.example.test", "203.0.113.7"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Fatalf("new certificate lacks %s: %v", h, err)
		}
	}
}

func TestLoosePermissionsAreNarrowed(t *testing.T) {
	dir := t.TempDir()
	open(t, dir, time.Now())
	key := filepath.Join(dir, tlsca.CAKeyFile)
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	open(t, dir, time.Now())
	if perm(t, key) != 0o600 || perm(t, dir) != 0o700 {
		t.Fatalf("modes after reopen: key %o dir %o, want 600 and 700", perm(t, key), perm(t, dir))
	}
}

func TestConcurrentFirstStartsAgreeOnOneCA(t *testing.T) {
	dir := t.TempDir()
	pins := make([]string, 4)
	var wg sync.WaitGroup
	for i := range pins {
		wg.Go(func() {
			m, err := tlsca.Open(tlsca.Options{Dir: dir, Hosts: testHosts})
			if err != nil {
				t.Error(err)
				return
			}
			pins[i] = m.Pin()
		})
	}
	wg.Wait()
	for _, p := range pins[1:] {
		if p != pins[0] {
			t.Fatalf("concurrent first starts created different CAs: %v", pins)
		}
	}
}

func TestCorruptCAIsAnError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, tlsca.CAKeyFile), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := tlsca.Open(tlsca.Options{Dir: dir, Hosts: testHosts})
	if err == nil || !strings.Contains(err.Error(), tlsca.CAKeyFile) {
		t.Fatalf("Open with a corrupt CA = %v, want an error naming %s", err, tlsca.CAKeyFile)
	}
}

func TestParsePin(t *testing.T) {
	good := "sha256:" + strings.Repeat("aB", 32)
	if p, err := tlsca.ParsePin(good); err != nil || p != strings.ToLower(good) {
		t.Fatalf("ParsePin(%q) = %q, %v", good, p, err)
	}
	for _, bad := range []string{"", "sha256:", "md5:" + strings.Repeat("ab", 16), "sha256:" + strings.Repeat("ab", 31), "sha256:" + strings.Repeat("zz", 32), strings.Repeat("ab", 32)} {
		if _, err := tlsca.ParsePin(bad); err == nil {
			t.Fatalf("ParsePin(%q) accepted", bad)
		}
	}
}

func TestLoadKeyPairPinsTheTopOfTheChain(t *testing.T) {
	dir := t.TempDir()
	m := open(t, dir, time.Now())
	// server.pem holds the key and the chain; the top of the chain is the CA.
	f := filepath.Join(dir, tlsca.ServerKeyFile)
	c, pin, err := tlsca.LoadKeyPair(f, f)
	if err != nil {
		t.Fatal(err)
	}
	if pin != m.Pin() || len(c.Certificate) != 2 {
		t.Fatalf("pin %s (chain of %d), want the CA's %s", pin, len(c.Certificate), m.Pin())
	}
}

// A node whose clock is hours behind the edge's (a machine without a
// battery-backed clock before it syncs, or one keeping its clock in local
// time east of UTC) accepts the CA and the certificate the edge has just
// made: started an hour before they were made, they were "not yet valid"
// to such a node until its clock caught up.
func TestFreshCertificatesAllowANodeClockHoursBehind(t *testing.T) {
	now := time.Now()
	m := open(t, t.TempDir(), now)
	roots := x509.NewCertPool()
	roots.AddCert(m.CA())
	for _, behind := range []time.Duration{2 * time.Hour, 9 * time.Hour, 14 * time.Hour} {
		at := now.Add(-behind)
		if _, err := m.Certificate().Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "localhost", CurrentTime: at}); err != nil {
			t.Errorf("a node %v behind: %v", behind, err)
		}
	}
}

// A CA made while the machine's clock was days ahead starts days from now:
// no node would accept it until then. Opened with the clock set right, it is
// re-signed for the same key (the pin nodes hold stays), and the chain the
// edge serves and ca.pem verify now.
func TestCAMadeWithTheClockAheadIsResigned(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ahead := open(t, dir, now.Add(3*24*time.Hour))
	if !now.Before(ahead.CA().NotBefore) {
		t.Fatalf("setup: the CA made 3 days ahead starts %v, before now", ahead.CA().NotBefore)
	}
	m := open(t, dir, now)
	if m.Pin() != ahead.Pin() {
		t.Fatalf("pin changed from %s to %s", ahead.Pin(), m.Pin())
	}
	pool, err := tlsca.LoadPool(filepath.Join(dir, tlsca.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	chain := m.Certificate().Certificate
	served, err := x509.ParseCertificate(chain[len(chain)-1])
	if err != nil {
		t.Fatal(err)
	}
	for name, roots := range map[string]*x509.CertPool{"ca.pem": pool, "the served CA": func() *x509.CertPool { p := x509.NewCertPool(); p.AddCert(served); return p }()} {
		if _, err := m.Certificate().Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "localhost", CurrentTime: now}); err != nil {
			t.Errorf("the server certificate does not verify now up to %s: %v", name, err)
		}
	}
	// And it stays so: the next start keeps the re-signed CA.
	if again := open(t, dir, now); !again.CA().Equal(m.CA()) {
		t.Fatal("the re-signed CA was not kept")
	}
}

// The same CA, made while the clock was ahead, on an edge that keeps
// running after NTP sets its clock right: the next renewal check re-signs
// it, serves it, rewrites ca.pem, and says so, without a restart.
func TestRunningEdgeResignsACANotValidYet(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	var mu sync.Mutex
	clock := now.Add(3 * 24 * time.Hour)
	var logs strings.Builder
	m, err := tlsca.Open(tlsca.Options{Dir: dir, Hosts: testHosts,
		Now:    func() time.Time { mu.Lock(); defer mu.Unlock(); return clock },
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	pin := m.Pin()
	if !now.Before(m.CA().NotBefore) {
		t.Fatalf("setup: the CA made 3 days ahead starts %v, before now", m.CA().NotBefore)
	}
	mu.Lock()
	clock = now // NTP
	mu.Unlock()
	if _, err := m.Renew(); err != nil {
		t.Fatal(err)
	}
	if m.Pin() != pin {
		t.Fatalf("pin changed from %s to %s", pin, m.Pin())
	}
	pool, err := tlsca.LoadPool(filepath.Join(dir, tlsca.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	chain := m.Certificate().Certificate
	served, err := x509.ParseCertificate(chain[len(chain)-1])
	if err != nil {
		t.Fatal(err)
	}
	for name, roots := range map[string]*x509.CertPool{"ca.pem": pool, "the served CA": func() *x509.CertPool { p := x509.NewCertPool(); p.AddCert(served); return p }()} {
		if _, err := m.Certificate().Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "localhost", CurrentTime: now}); err != nil {
			t.Errorf("the server certificate does not verify now up to %s: %v", name, err)
		}
	}
	if !strings.Contains(logs.String(), "re-signed it for the same key") || !strings.Contains(logs.String(), "need the new ca.pem") {
		t.Errorf("the re-signing was not logged: %s", logs.String())
	}
}
