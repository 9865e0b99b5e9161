package bootstrap_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"iop/adapters/config"
	"iop/adapters/tlsca"
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
