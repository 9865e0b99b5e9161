package bootstrap_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/adapters/config"
	"iop/adapters/tlsca"
	"iop/bootstrap"
	"iop/internal/lockedbuf"
)

// autoEdge is an edge config in auto mode whose state is in dir, with a CA
// made to end at end (as if created long ago).
func autoEdge(t *testing.T, dir string, end time.Time, tAddr, hAddr string) *config.EdgeConfig {
	t.Helper()
	created := end.Add(-48 * time.Hour)
	if _, err := tlsca.Open(tlsca.Options{Dir: filepath.Join(dir, "tls"), Hosts: []string{"127.0.0.1"}, CAValidity: 48 * time.Hour,
		Now: func() time.Time { return created }, Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte("state_dir: "+dir+"\ntransport: {listen: \""+tAddr+"\"}\nhttp: {listen: \""+hAddr+"\"}\n"+
		"nodes: [{id: n1, token: graph-test-token, adapters: [{name: exec, type: exec}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// An edge whose auto-mode CA ends within 30 days starts, warns naming the
// CA's file, its end and how to rotate it, and exports the end as
// iop_link_cert_expiry_timestamp_seconds.
func TestEdgeWarnsOfItsCANearItsEnd(t *testing.T) {
	dir, hAddr := t.TempDir(), freeAddr(t)
	end := time.Now().Add(7 * 24 * time.Hour).Truncate(time.Second)
	cfg := autoEdge(t, dir, end, freeAddr(t), hAddr)
	var log lockedbuf.Buffer
	edge := fxtest.New(t, bootstrap.Edge(bootstrap.EdgeSettings{Config: cfg, Logger: slog.New(slog.NewTextHandler(&log, nil))}), fx.NopLogger)
	edge.RequireStart()
	defer edge.RequireStop()
	out := log.String()
	for _, want := range []string{"level=WARN", "the edge CA expires soon", filepath.Join(dir, "tls", tlsca.CAKeyFile),
		end.UTC().Format(time.RFC3339), "days_left=7", "delete " + filepath.Join(dir, "tls")} {
		if !strings.Contains(out, want) {
			t.Errorf("the edge's start log lacks %q:\n%s", want, out)
		}
	}
	resp, err := http.Get("http://" + hAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, v, _ := strings.Cut(grepLines(string(b), `iop_link_cert_expiry_timestamp_seconds{cert="ca"} `), "} ")
	if f, err := strconv.ParseFloat(v, 64); err != nil || int64(f) != end.Unix() {
		t.Fatalf("iop_link_cert_expiry_timestamp_seconds{cert=\"ca\"} = %q, want %d:\n%s", v, end.Unix(), grepLines(string(b), "iop_link_cert"))
	}
	if !strings.Contains(string(b), `iop_link_cert_expiry_timestamp_seconds{cert="server"}`) {
		t.Fatalf("/metrics lacks the server certificate's end:\n%s", grepLines(string(b), "iop_link_cert"))
	}
}

// An edge whose auto-mode CA has expired does not start: no node could
// verify it (a node refuses such a certificate until it is replaced). The
// error names the file, the date and how to rotate the CA.
func TestEdgeRefusesAnExpiredCA(t *testing.T) {
	dir := t.TempDir()
	end := time.Now().Add(-time.Hour).Truncate(time.Second)
	cfg := autoEdge(t, dir, end, freeAddr(t), freeAddr(t))
	app := fx.New(bootstrap.Edge(bootstrap.EdgeSettings{Config: cfg, Logger: quiet()}), fx.NopLogger)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := app.Start(ctx)
	if err == nil {
		_ = app.Stop(ctx)
		t.Fatal("the edge started with an expired CA")
	}
	for _, want := range []string{"transport.tls", filepath.Join(dir, "tls", tlsca.CAKeyFile), "expired on " + end.UTC().Format(time.RFC3339),
		"no node can verify the edge", "delete " + filepath.Join(dir, "tls"), "iop-edge join"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the start error lacks %q: %v", want, err)
		}
	}
	// --print-ca-pin (OpenLinkTLS) says the same.
	if _, err := bootstrap.OpenLinkTLS(cfg, quiet()); err == nil || !strings.Contains(err.Error(), "expired on") {
		t.Fatalf("OpenLinkTLS with an expired CA: %v", err)
	}
}

// Files mode: a chain that ends within 30 days is warned about, one that
// has ended refused.
func TestLinkTLSFilesExpiry(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, end time.Time) {
		t.Helper()
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "edge"}, DNSNames: []string{"localhost"},
			NotBefore: end.Add(-90 * 24 * time.Hour), NotAfter: end}
		der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		kb, _ := x509.MarshalPKCS8PrivateKey(key)
		_ = os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
		_ = os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600)
	}
	parse := func(name string) *config.EdgeConfig {
		t.Helper()
		c, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte("transport: {tls: {mode: files, cert_file: "+name+".pem, key_file: "+name+".key}}\n"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	soon := time.Now().Add(3 * 24 * time.Hour).Truncate(time.Second)
	write("soon", soon)
	var log lockedbuf.Buffer
	lt, err := bootstrap.OpenLinkTLS(parse("soon"), slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatalf("files mode with a chain that ends in 3 days: %v", err)
	}
	for _, want := range []string{"level=WARN", "the node-link certificate expires soon", filepath.Join(dir, "soon.pem"), soon.UTC().Format(time.RFC3339), "cert_file and key_file"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, log.String())
		}
	}
	if got := lt.CertExpiry()["server"]; !got.Equal(soon) {
		t.Fatalf("CertExpiry()[server] = %v, want %v", got, soon)
	}
	write("gone", time.Now().Add(-time.Minute))
	if _, err := bootstrap.OpenLinkTLS(parse("gone"), quiet()); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "gone.pem")) || !strings.Contains(err.Error(), "expired on") {
		t.Fatalf("files mode with an expired chain: %v", err)
	}
}

// The HTTP API's own certificate (http.tls): one that ends within 30 days
// is warned about at start, one that has ended is an error in the log but
// the edge still starts (callers that do not verify it, and every node,
// still get through).
func TestHTTPTLSExpiryWarned(t *testing.T) {
	for _, tc := range []struct {
		name  string
		end   time.Time
		wants []string
	}{
		{"soon", time.Now().Add(5 * 24 * time.Hour).Truncate(time.Second), []string{"level=WARN", "the HTTP API certificate expires soon", "days_left=5", "http.tls.cert_file"}},
		{"gone", time.Now().Add(-time.Hour).Truncate(time.Second), []string{"level=ERROR", "the HTTP API certificate", "expired on", "refuse the edge's API", "http.tls.cert_file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "edge"}, DNSNames: []string{"localhost"},
				NotBefore: tc.end.Add(-90 * 24 * time.Hour), NotAfter: tc.end}
			der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
			kb, _ := x509.MarshalPKCS8PrivateKey(key)
			_ = os.WriteFile(filepath.Join(dir, "api.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
			_ = os.WriteFile(filepath.Join(dir, "api.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600)
			cfg, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte("state_dir: "+dir+"\ntransport: {listen: \""+freeAddr(t)+"\"}\n"+
				"http: {listen: \""+freeAddr(t)+"\", tls: {cert_file: api.pem, key_file: api.key}}\n"+
				"nodes: [{id: n1, token: graph-test-token, adapters: [{name: exec, type: exec}]}]\n"))
			if err != nil {
				t.Fatal(err)
			}
			var log lockedbuf.Buffer
			edge := fxtest.New(t, bootstrap.Edge(bootstrap.EdgeSettings{Config: cfg, Logger: slog.New(slog.NewTextHandler(&log, nil))}), fx.NopLogger)
			edge.RequireStart()
			defer edge.RequireStop()
			out := grepLines(log.String(), "HTTP API certificate")
			for _, want := range append(tc.wants, filepath.Join(dir, "api.pem"), tc.end.UTC().Format(time.RFC3339)) {
				if !strings.Contains(out, want) {
					t.Errorf("the edge's start log lacks %q:\n%s", want, log.String())
				}
			}
		})
	}
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
