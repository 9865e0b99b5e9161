package tlsca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Files in the state directory. Each key file holds its key and the
// certificate(s) that go with it, so a reader never sees a key from one
// generation next to a certificate from another.
const (
	CAKeyFile     = "ca-key.pem" // CA private key + CA certificate, 0600
	CACertFile    = "ca.pem"     // CA certificate only, for nodes' --ca-file
	ServerKeyFile = "server.pem" // server private key + chain (leaf, CA), 0600
)

// Defaults for Options' zero fields.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 90 * 24 * time.Hour
	DefaultRenewBefore  = 30 * 24 * time.Hour
)

// Backdate is how long before it is made a certificate (the CA, a server
// certificate) starts to be valid: a node whose clock is behind the edge's
// by less (a machine without a battery-backed clock before it syncs, a
// clock kept in local time east of UTC) still accepts it. Go's
// verification, the nodes', refuses a certificate whose start is after
// the verifier's time.
const Backdate = 24 * time.Hour

// Options configures a Manager.
type Options struct {
	// Dir holds the CA and the server certificate; created 0700 if missing.
	Dir string
	// Hosts are the DNS names and IP addresses the server certificate must
	// cover. A certificate missing one is re-issued at once.
	Hosts []string
	// CAValidity, CertValidity and RenewBefore default to 10 years, 90 days
	// and 30 days: the server certificate is replaced when it has less than
	// RenewBefore left.
	CAValidity, CertValidity, RenewBefore time.Duration
	Now                                   func() time.Time
	Logger                                *slog.Logger
}

// Manager owns the edge's CA and its current server certificate. It is safe
// for concurrent use; GetCertificate always returns the newest certificate.
type Manager struct {
	o Options
	// ca is replaced (same key, see resignCA) only under mu; it is read
	// without it (CA, Pin, Expiries).
	ca    atomic.Pointer[x509.Certificate]
	caKey *ecdsa.PrivateKey
	mu    sync.Mutex // serializes renewals
	cur   atomic.Pointer[tls.Certificate]
}

// Open loads the CA and server certificate from o.Dir, creating the CA on
// first use and (re-)issuing the server certificate when it is missing, due
// for renewal, does not cover o.Hosts or was not issued by the CA.
func Open(o Options) (*Manager, error) {
	if o.Dir == "" {
		return nil, errors.New("tls state directory is not set")
	}
	if o.CAValidity <= 0 {
		o.CAValidity = DefaultCAValidity
	}
	if o.CertValidity <= 0 {
		o.CertValidity = DefaultCertValidity
	}
	if o.RenewBefore <= 0 || o.RenewBefore >= o.CertValidity {
		o.RenewBefore = min(DefaultRenewBefore, o.CertValidity/3)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := ensureDir(o.Dir); err != nil {
		return nil, err
	}
	m := &Manager{o: o}
	if err := m.loadOrCreateCA(); err != nil {
		return nil, err
	}
	if !o.Now().Before(m.ca.Load().NotAfter) {
		// Refused rather than served: every node would refuse the edge's
		// certificate, and only the operator can give the nodes a new
		// CA's pin.
		return nil, &ExpiredError{m.Expiries()[0]}
	}
	if err := m.loadServer(); err != nil {
		return nil, err
	}
	if _, err := m.Renew(); err != nil {
		return nil, err
	}
	_ = Check(o.Logger, o.Now(), m.Expiries()) // warns; the CA is valid and the certificate just renewed
	return m, nil
}

// CA returns the CA certificate.
func (m *Manager) CA() *x509.Certificate { return m.ca.Load() }

// Pin returns the pin of the CA's public key, what nodes pass as --ca-pin.
func (m *Manager) Pin() string { return Pin(m.ca.Load()) }

// Certificate returns the current server certificate (leaf first, then the CA).
func (m *Manager) Certificate() *tls.Certificate { return m.cur.Load() }

// GetCertificate is a tls.Config.GetCertificate that follows renewals.
func (m *Manager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return m.cur.Load(), nil
}

// Renew issues a new server certificate if the current one is missing, due,
// for other hosts or from another CA, and reports whether it did.
//
// It also re-signs a CA that is not valid yet (resignCA), which start does
// too: one made while the clock was ahead, on an edge that has run since
// the clock was set right. The served chain then carries the re-signed CA.
func (m *Manager) Renew() (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	resigned := false
	if now := m.o.Now(); now.Before(m.ca.Load().NotBefore) {
		if err := m.resignCA(filepath.Join(m.o.Dir, CAKeyFile), now); err != nil {
			return false, err
		}
		if err := writeFileAtomic(filepath.Join(m.o.Dir, CACertFile), pemCert(m.ca.Load().Raw), 0o644, true); err != nil {
			return false, err
		}
		resigned = true
	}
	if c := m.cur.Load(); c != nil && !resigned && !m.due(c.Leaf) {
		return false, nil
	}
	cert, err := m.issue()
	if err != nil {
		return false, err
	}
	m.cur.Store(cert)
	m.o.Logger.Info("tls: issued the node-link server certificate", "dir", m.o.Dir,
		"not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339), "dns", cert.Leaf.DNSNames, "ip", cert.Leaf.IPAddresses)
	return true, nil
}

// Run calls Renew every interval until ctx ends; a failed renewal is logged
// and retried on the next tick, while the old certificate stays in use.
// Each tick also warns when the CA, or a certificate whose renewal keeps
// failing, expires within ExpiryWarning, and logs an error once it has.
func (m *Manager) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.check()
		}
	}
}

// check is one of Run's ticks.
func (m *Manager) check() {
	if _, err := m.Renew(); err != nil {
		m.o.Logger.Error("tls: server certificate renewal failed; the current one stays in use", "err", err)
	}
	if err := Check(m.o.Logger, m.o.Now(), m.Expiries()); err != nil {
		m.o.Logger.Error("tls: " + err.Error())
	}
}

func (m *Manager) due(leaf *x509.Certificate) bool {
	ca := m.ca.Load()
	if leaf == nil || leaf.CheckSignatureFrom(ca) != nil {
		return true
	}
	now := m.o.Now()
	// One that already lasts as long as the CA is kept: a new one could
	// not last longer (issue ends none after the CA), and near the CA's
	// end every check would issue another.
	if now.Before(leaf.NotBefore) || leaf.NotAfter.Sub(now) < m.o.RenewBefore && leaf.NotAfter.Before(ca.NotAfter) {
		return true
	}
	for _, h := range m.o.Hosts {
		if leaf.VerifyHostname(h) != nil {
			return true
		}
	}
	return false
}

func (m *Manager) loadOrCreateCA() error {
	path := filepath.Join(m.o.Dir, CAKeyFile)
	data, err := readPrivate(path)
	if errors.Is(err, fs.ErrNotExist) {
		data, err = m.createCA(path)
	}
	if err != nil {
		return err
	}
	key, certs, err := parseKeyAndCerts(path, data)
	if err != nil {
		return err
	}
	if !certs[0].IsCA {
		return fmt.Errorf("%s: the certificate is not a CA", path)
	}
	if !key.PublicKey.Equal(certs[0].PublicKey) {
		return fmt.Errorf("%s: the key does not match the certificate", path)
	}
	m.ca.Store(certs[0])
	m.caKey = key
	if now := m.o.Now(); now.Before(certs[0].NotBefore) {
		if err := m.resignCA(path, now); err != nil {
			return err
		}
	}
	// ca.pem is derived; rewriting it keeps it in step with ca-key.pem.
	return writeFileAtomic(filepath.Join(m.o.Dir, CACertFile), pemCert(m.ca.Load().Raw), 0o644, true)
}

// ResignedWarning is what the edge logs when it re-signs its CA
// (resignCA): the pin stays, ca.pem changes.
const ResignedWarning = "tls: the edge CA was not valid yet (made while this machine's clock was ahead); re-signed it for the same key, so the pin is unchanged " +
	"(nodes using --ca-file need the new ca.pem)"

// resignCA replaces a CA certificate that is not valid yet (made while this
// machine's clock was ahead by more than Backdate) by one for the same key,
// valid from now-Backdate to the same end: no node would accept the old one
// until its start, and a CA for the same key keeps the pin.
func (m *Manager) resignCA(path string, now time.Time) error {
	serial, err := randomSerial()
	if err != nil {
		return err
	}
	old := m.ca.Load()
	tmpl := *old
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-Backdate)
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, &tmpl, &m.caKey.PublicKey, m.caKey)
	if err != nil {
		return fmt.Errorf("re-sign the CA certificate: %w", err)
	}
	data, err := pemKeyAndCerts(m.caKey, der)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(path, data, 0o600, true); err != nil {
		return err
	}
	m.ca.Store(mustParse(der))
	m.o.Logger.Warn(ResignedWarning, "dir", m.o.Dir, "ca_file", filepath.Join(m.o.Dir, CACertFile), "was_valid_from", old.NotBefore.UTC().Format(time.RFC3339))
	return nil
}

// createCA writes a new CA to path unless another process got there first,
// in which case that one is returned: every process ends up with the same CA.
func (m *Manager) createCA(path string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := m.o.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "iop edge CA " + hex.EncodeToString(serial.Bytes()[:4]), Organization: []string{"iop"}},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              now.Add(m.o.CAValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	data, err := pemKeyAndCerts(key, der)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(path, data, 0o600, false); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return readPrivate(path)
		}
		return nil, err
	}
	m.o.Logger.Info("tls: created the edge CA", "dir", m.o.Dir, "pin", Pin(mustParse(der)))
	return data, nil
}

// loadServer reads the server certificate if there is one. A file that
// cannot be parsed is logged and replaced: it holds nothing a new one lacks.
func (m *Manager) loadServer() error {
	path := filepath.Join(m.o.Dir, ServerKeyFile)
	data, err := readPrivate(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	key, certs, err := parseKeyAndCerts(path, data)
	if err != nil || !key.PublicKey.Equal(certs[0].PublicKey) {
		m.o.Logger.Warn("tls: server certificate file unusable; issuing a new one", "path", path, "err", err)
		return nil
	}
	// Served with the CA as it is now (re-signed, perhaps), not as the
	// file has it; a leaf the CA did not sign is re-issued (due).
	m.cur.Store(tlsCert(key, []*x509.Certificate{certs[0], m.ca.Load()}))
	return nil
}

func (m *Manager) issue() (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate server key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := m.o.Now()
	ca := m.ca.Load()
	notAfter := now.Add(m.o.CertValidity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "iop edge", Organization: []string{"iop"}},
		NotBefore:    now.Add(-Backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range m.o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if !slices.Contains(tmpl.DNSNames, h) {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, m.caKey)
	if err != nil {
		return nil, fmt.Errorf("create server certificate: %w", err)
	}
	data, err := pemKeyAndCerts(key, der, ca.Raw)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(m.o.Dir, ServerKeyFile), data, 0o600, true); err != nil {
		return nil, err
	}
	return tlsCert(key, []*x509.Certificate{mustParse(der), ca}), nil
}

func tlsCert(key *ecdsa.PrivateKey, certs []*x509.Certificate) *tls.Certificate {
	c := &tls.Certificate{PrivateKey: key, Leaf: certs[0]}
	for _, x := range certs {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c
}

func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

func mustParse(der []byte) *x509.Certificate {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		panic("tlsca: parsing a certificate just created: " + err.Error())
	}
	return c
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func pemKeyAndCerts(key *ecdsa.PrivateKey, ders ...[]byte) ([]byte, error) {
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb})
	for _, d := range ders {
		out = append(out, pemCert(d)...)
	}
	return out, nil
}

func parseKeyAndCerts(path string, data []byte) (*ecdsa.PrivateKey, []*x509.Certificate, error) {
	var key *ecdsa.PrivateKey
	var certs []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		switch b.Type {
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: private key: %w", path, err)
			}
			ek, ok := k.(*ecdsa.PrivateKey)
			if !ok {
				return nil, nil, fmt.Errorf("%s: private key is %T, want ECDSA", path, k)
			}
			key = ek
		case "CERTIFICATE":
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: certificate: %w", path, err)
			}
			certs = append(certs, c)
		}
	}
	if key == nil || len(certs) == 0 {
		return nil, nil, fmt.Errorf("%s: want a PRIVATE KEY and a CERTIFICATE block", path)
	}
	return key, certs, nil
}

// ensureDir creates dir 0700, or narrows an existing one to 0700: it holds
// private keys.
func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("tls state directory: %w", err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("tls state directory: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("tls state directory %s is not a directory", dir)
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("tls state directory: %w", err)
		}
	}
	return nil
}

// readPrivate reads a key file, first narrowing it to 0600 if others could read it.
func readPrivate(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, fmt.Errorf("narrow %s to 0600: %w", path, err)
		}
	}
	return os.ReadFile(path)
}

// writeFileAtomic writes data to a temporary file with perm and moves it to
// path. With replace false an existing path is kept and fs.ErrExist returned.
func writeFileAtomic(path string, data []byte, perm os.FileMode, replace bool) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if replace {
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		return nil
	}
	// link fails if path exists: two processes creating at once keep one result.
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fs.ErrExist
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
