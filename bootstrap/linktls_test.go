package bootstrap_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/adapters/config"
	"iop/adapters/tlsca"
	"iop/adapters/transport"
	"iop/bootstrap"
)

func TestLinkTLSModes(t *testing.T) {
	dir := t.TempDir()
	parse := func(doc string) *config.EdgeConfig {
		t.Helper()
		c, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// off: no TLS settings and no pin.
	if lt, err := bootstrap.OpenLinkTLS(parse("transport: {tls: {mode: off}}\n"), quiet()); err != nil || lt.Config != nil || lt.Pin != "" {
		t.Fatalf("mode off = %+v, %v; want plaintext", lt, err)
	}

	// auto: the CA is created once; the pin is stable across opens.
	a1, err := bootstrap.OpenLinkTLS(parse(""), quiet())
	if err != nil || a1.Config == nil {
		t.Fatalf("auto: %+v, %v", a1, err)
	}
	a2, _ := bootstrap.OpenLinkTLS(parse(""), quiet())
	if a1.Pin != a2.Pin {
		t.Fatalf("auto pin changed: %s, %s", a1.Pin, a2.Pin)
	}
	if _, err := os.Stat(filepath.Join(dir, "edge-state", "tls", tlsca.CAKeyFile)); err != nil {
		t.Fatalf("auto mode CA not in the default state dir: %v", err)
	}

	// files with a self-signed leaf only: the pin is the leaf's.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "edge"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	kb, _ := x509.MarshalPKCS8PrivateKey(key)
	_ = os.WriteFile(filepath.Join(dir, "leaf.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	_ = os.WriteFile(filepath.Join(dir, "leaf.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600)
	leaf, _ := x509.ParseCertificate(der)
	f, err := bootstrap.OpenLinkTLS(parse("transport: {tls: {mode: files, cert_file: leaf.pem, key_file: leaf.key}}\n"), quiet())
	if err != nil || f.Config == nil || f.Pin != tlsca.Pin(leaf) {
		t.Fatalf("files mode = %+v, %v; want the leaf's pin %s", f, err, tlsca.Pin(leaf))
	}

	// files with a missing file fails with the file named.
	if _, err := bootstrap.OpenLinkTLS(parse("transport: {tls: {mode: files, cert_file: nope.pem, key_file: leaf.key}}\n"), quiet()); err == nil {
		t.Fatal("files mode with a missing cert_file opened")
	}
}

// Files mode refuses, at start, a certificate file whose chain no node
// given a pin of one of its certificates could verify, as it refuses an
// expired one: here a certificate made for clients, and a leaf sent with a
// CA that did not sign it. A node given the pin bootstrap prints refuses the
// edge on a real handshake, so such an edge would start and take no node.
func TestLinkTLSFilesRefusesAChainNoNodeVerifies(t *testing.T) {
	dir := t.TempDir()
	newKey := func() *ecdsa.PrivateKey { k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader); return k }
	caTmpl := func(cn string) *x509.Certificate {
		return &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour)}
	}
	leafTmpl := func(eku x509.ExtKeyUsage) *x509.Certificate {
		return &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "edge"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{eku},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	}
	write := func(name string, key *ecdsa.PrivateKey, ders ...[]byte) {
		t.Helper()
		var certs []byte
		for _, d := range ders {
			certs = append(certs, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d})...)
		}
		kb, _ := x509.MarshalPKCS8PrivateKey(key)
		if err := os.WriteFile(filepath.Join(dir, name+".pem"), certs, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	caKey, otherKey := newKey(), newKey()
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl("ca"), caTmpl("ca"), &caKey.PublicKey, caKey)
	otherDER, _ := x509.CreateCertificate(rand.Reader, caTmpl("other"), caTmpl("other"), &otherKey.PublicKey, otherKey)
	ca, _ := x509.ParseCertificate(caDER)

	clientKey := newKey()
	clientDER, _ := x509.CreateCertificate(rand.Reader, leafTmpl(x509.ExtKeyUsageClientAuth), ca, &clientKey.PublicKey, caKey)
	write("client", clientKey, clientDER, caDER)
	strayKey := newKey()
	strayDER, _ := x509.CreateCertificate(rand.Reader, leafTmpl(x509.ExtKeyUsageServerAuth), ca, &strayKey.PublicKey, caKey)
	write("stray", strayKey, strayDER, otherDER)
	goodKey := newKey()
	goodDER, _ := x509.CreateCertificate(rand.Reader, leafTmpl(x509.ExtKeyUsageServerAuth), ca, &goodKey.PublicKey, caKey)
	write("good", goodKey, goodDER, caDER)

	parse := func(name string) *config.EdgeConfig {
		t.Helper()
		c, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte("transport: {listen: \"127.0.0.1:7700\", tls: {mode: files, cert_file: "+name+".pem, key_file: "+name+".key}}\n"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// What a node given each file's pin meets on a real handshake.
	nodeHandshake := func(name string, pinned ...string) error {
		t.Helper()
		cert, pin, err := tlsca.LoadKeyPair(filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		if len(pinned) > 0 {
			pin = pinned[0]
		}
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS13})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				_ = c.(*tls.Conn).Handshake()
				c.Close()
			}
		}()
		cfg, err := transport.NewClientTLS(transport.ClientTLS{CAPin: pin}, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err == nil {
			c.Close()
		}
		return err
	}

	if err := nodeHandshake("good"); err != nil {
		t.Fatalf("a node refuses the good chain: %v", err)
	}
	if _, err := bootstrap.OpenLinkTLS(parse("good"), quiet()); err != nil {
		t.Fatalf("files mode with a good chain: %v", err)
	}
	for name, want := range map[string][]string{"client": {"no node can verify", "not made for TLS servers", "key usage"},
		"stray": {"verifies up to none of the others", "no node given a pin of a certificate in the file", "unknown authority"}} {
		if err := nodeHandshake(name); err == nil {
			t.Fatalf("%s: a node accepted the chain", name)
		}
		_, err := bootstrap.OpenLinkTLS(parse(name), quiet())
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, name+".pem")) {
			t.Fatalf("%s: OpenLinkTLS = %v, want a refusal naming the file", name, err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: OpenLinkTLS = %v, want it to say %q", name, err, w)
			}
		}
	}

	// A chain that verifies, but not up to its last certificate (an
	// unrelated CA appended, a leftover intermediate that signs nothing):
	// nodes pinned to the CA that signed it verify it, so it is served,
	// with a warning that the printed pin will not work and which will.
	interDER, _ := x509.CreateCertificate(rand.Reader, caTmpl("leftover"), ca, &newKey().PublicKey, caKey)
	write("appended", goodKey, goodDER, caDER, otherDER)
	write("leftover", goodKey, goodDER, caDER, interDER)
	for _, name := range []string{"appended", "leftover"} {
		var logs strings.Builder
		l, err := bootstrap.OpenLinkTLS(parse(name), slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatalf("%s: OpenLinkTLS = %v, want it served", name, err)
		}
		if w := logs.String(); !strings.Contains(w, "level=WARN") || !strings.Contains(w, "signs none of the chain") || !strings.Contains(w, "--ca-pin "+tlsca.Pin(ca)) {
			t.Errorf("%s: logged %q, want a warning naming the pin that works, %s", name, w, tlsca.Pin(ca))
		}
		if err := nodeHandshake(name, tlsca.Pin(ca)); err != nil {
			t.Errorf("%s: a node pinned to the CA refuses the edge: %v", name, err)
		}
		if err := nodeHandshake(name, l.Pin); err == nil {
			t.Errorf("%s: a node given the last certificate's pin accepted the edge, which the warning says it does not", name)
		}
	}
}
