package tlsca

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"time"
)

// ExpiryWarning is how long before a certificate the edge serves on the
// node link expires that the edge starts warning about it: at start and at
// each of its periodic checks.
const ExpiryWarning = 30 * 24 * time.Hour

// Expiry is a certificate the edge serves on the node link: what it is,
// the file it comes from, when it stops being valid and how to replace it.
type Expiry struct {
	Cert     string // "ca" or "server", as the metrics name it
	What     string // for people: "the edge CA", "the node-link server certificate"
	File     string
	NotAfter time.Time
	Rotate   string
	// Effect is what its end does, for the warning ("no node can
	// connect"); empty means the node link's.
	Effect string
}

func (e Expiry) effect() string {
	if e.Effect == "" {
		return "no node can connect"
	}
	return e.Effect
}

// ExpiredError is a certificate the edge would serve that has expired:
// nodes cannot verify the edge (Go's verification, the nodes', refuses an
// expired certificate anywhere in the chain, the pinned one included).
type ExpiredError struct{ Expiry }

func (e *ExpiredError) Error() string {
	effect := "no node can verify the edge"
	if e.Effect != "" {
		effect = e.Effect
	}
	return fmt.Sprintf("%s (%s) expired on %s: %s; %s", e.What, e.File,
		e.NotAfter.UTC().Format(time.RFC3339), effect, e.Rotate)
}

// check warns through log when e expires within ExpiryWarning of now and
// returns an ExpiredError once it has.
func (e Expiry) check(log *slog.Logger, now time.Time) error {
	left := e.NotAfter.Sub(now)
	if left <= 0 {
		return &ExpiredError{e}
	}
	if left < ExpiryWarning {
		log.Warn("tls: "+e.What+" expires soon; after that "+e.effect(), "file", e.File,
			"not_after", e.NotAfter.UTC().Format(time.RFC3339), "days_left", int(math.Ceil(left.Hours()/24)), "rotate", e.Rotate)
	}
	return nil
}

// Check warns through log about each of es that expires within
// ExpiryWarning of now and returns an ExpiredError for the first one that
// has expired.
func Check(log *slog.Logger, now time.Time, es []Expiry) error {
	var first error
	for _, e := range es {
		if err := e.check(log, now); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// rotateCA is the README's way to a new CA (docs/security.md, Rotation).
func rotateCA(dir string) string {
	return "to rotate it, stop the edge, delete " + dir + ", start it, and give every node the new pin " +
		"(iop-edge join NODE_ID; nodes using --ca-file need the new ca.pem)"
}

// Expiries returns the CA's expiry and, when it ends before the CA (the
// certificate is renewed ahead of its own end, so only while its renewal
// fails), the server certificate's.
func (m *Manager) Expiries() []Expiry {
	ca := m.ca.Load()
	out := []Expiry{{Cert: "ca", What: "the edge CA", File: filepath.Join(m.o.Dir, CAKeyFile), NotAfter: ca.NotAfter, Rotate: rotateCA(m.o.Dir)}}
	if c := m.cur.Load(); c != nil && c.Leaf.NotAfter.Before(ca.NotAfter) {
		out = append(out, Expiry{Cert: "server", What: "the node-link server certificate", File: filepath.Join(m.o.Dir, ServerKeyFile),
			NotAfter: c.Leaf.NotAfter, Rotate: "the edge renews it ahead of its end, and that is failing (see the errors logged): " +
				"check that " + m.o.Dir + " is writable, or restart the edge, which issues a new one"})
	}
	return out
}

// KeyPairExpiry is when the chain of an operator's certificate file
// (LoadKeyPair) stops being valid: at the earliest end of its
// certificates, for a node verifies the whole chain.
func KeyPairExpiry(c *tls.Certificate, certFile string) (Expiry, error) {
	e := Expiry{Cert: "server", What: "the node-link certificate", File: certFile,
		Rotate: "replace transport.tls.cert_file and key_file and restart the edge (they are read at start)"}
	for i, der := range c.Certificate {
		x, err := x509.ParseCertificate(der)
		if err != nil {
			return Expiry{}, fmt.Errorf("%s: certificate %d: %w", certFile, i+1, err)
		}
		if i == 0 || x.NotAfter.Before(e.NotAfter) {
			e.NotAfter = x.NotAfter
		}
	}
	return e, nil
}

// APIKeyPairExpiry is KeyPairExpiry for the certificate the edge serves its
// HTTP API with (http.tls): an expired one fails every caller that
// verifies it, but no node, so the edge is only warned about, not stopped.
func APIKeyPairExpiry(c *tls.Certificate, certFile string) (Expiry, error) {
	e, err := KeyPairExpiry(c, certFile)
	e.Cert, e.What = "http", "the HTTP API certificate"
	e.Effect = "callers that verify it (the iop CLI, SDKs, browsers) refuse the edge's API"
	e.Rotate = "replace http.tls.cert_file and key_file and restart the edge (they are read at start)"
	return e, err
}
