package tlsca_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/adapters/tlsca"
)

// makeCA creates the state in dir with a CA that ends at end (and a server
// certificate, which cannot outlast it).
func makeCA(t *testing.T, dir string, end time.Time) {
	t.Helper()
	created := end.Add(-48 * time.Hour)
	if _, err := tlsca.Open(tlsca.Options{Dir: dir, Hosts: testHosts, CAValidity: 48 * time.Hour, Now: func() time.Time { return created },
		Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
}

// A CA with less than 30 days left is warned about at start, naming its
// file, its end and how to rotate it; the server certificate, which ends
// with it, is not re-issued at every check for that.
func TestOpenWarnsOfACANearItsEnd(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	end := now.Add(10*24*time.Hour + time.Hour)
	makeCA(t, dir, end)
	var log bytes.Buffer
	m, err := tlsca.Open(tlsca.Options{Dir: dir, Hosts: testHosts, Now: func() time.Time { return now },
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatalf("Open of a CA with 10 days left: %v", err)
	}
	out := log.String()
	for _, want := range []string{"level=WARN", "the edge CA expires soon", filepath.Join(dir, tlsca.CAKeyFile),
		"not_after=" + end.UTC().Format(time.RFC3339), "days_left=11", "delete " + dir, "new pin"} {
		if !strings.Contains(out, want) {
			t.Errorf("the start's log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "server certificate expires") {
		t.Errorf("the server certificate, which ends with the CA, was warned about too:\n%s", out)
	}
	if renewed, err := m.Renew(); err != nil || renewed {
		t.Fatalf("Renew of a certificate that already ends with the CA = %v, %v; want none (a new one cannot last longer)", renewed, err)
	}
}

// Far from its end the CA is not warned about.
func TestOpenDoesNotWarnOfAFreshCA(t *testing.T) {
	var log bytes.Buffer
	if _, err := tlsca.Open(tlsca.Options{Dir: t.TempDir(), Hosts: testHosts, Logger: slog.New(slog.NewTextHandler(&log, nil))}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log.String(), "WARN") {
		t.Fatalf("a fresh CA was warned about:\n%s", log.String())
	}
}

// An expired CA is refused at start, with its file, its end and how to
// rotate it: no node could verify the edge. Nothing is issued from it.
func TestOpenRefusesAnExpiredCA(t *testing.T) {
	dir := t.TempDir()
	end := time.Now().Add(-time.Hour)
	makeCA(t, dir, end)
	server, _ := os.ReadFile(filepath.Join(dir, tlsca.ServerKeyFile))
	_, err := tlsca.Open(tlsca.Options{Dir: dir, Hosts: testHosts})
	var exp *tlsca.ExpiredError
	if !errors.As(err, &exp) {
		t.Fatalf("Open of an expired CA = %v, want an ExpiredError", err)
	}
	for _, want := range []string{"the edge CA", filepath.Join(dir, tlsca.CAKeyFile), end.UTC().Format(time.RFC3339), "expired", "delete " + dir, "iop-edge join"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	if now, _ := os.ReadFile(filepath.Join(dir, tlsca.ServerKeyFile)); !bytes.Equal(now, server) {
		t.Fatal("a server certificate was issued from the expired CA")
	}
}

// Operator files: the chain's earliest end counts.
func TestKeyPairExpiryIsTheChainsEarliestEnd(t *testing.T) {
	dir := t.TempDir()
	end := time.Now().Add(5 * 24 * time.Hour)
	makeCA(t, dir, end) // server.pem: key, leaf, CA — both end at end
	f := filepath.Join(dir, tlsca.ServerKeyFile)
	c, _, err := tlsca.LoadKeyPair(f, f)
	if err != nil {
		t.Fatal(err)
	}
	e, err := tlsca.KeyPairExpiry(c, f)
	if err != nil || !e.NotAfter.Equal(end.Truncate(time.Second)) || e.File != f {
		t.Fatalf("KeyPairExpiry = %+v, %v; want the end %v of %s", e, err, end, f)
	}
	var log bytes.Buffer
	if err := tlsca.Check(slog.New(slog.NewTextHandler(&log, nil)), time.Now(), []tlsca.Expiry{e}); err != nil || !strings.Contains(log.String(), "cert_file and key_file") {
		t.Fatalf("Check = %v, log:\n%s", err, log.String())
	}
	if err := tlsca.Check(slog.New(slog.NewTextHandler(&log, nil)), end.Add(time.Second), []tlsca.Expiry{e}); err == nil {
		t.Fatal("Check after the chain's end passed")
	}
}
