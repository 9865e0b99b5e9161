package tlsca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"
)

// LoadKeyPair loads an operator's certificate chain and key (PEM) and
// returns it with the pin nodes should use: that of the last certificate in
// the chain file, the CA-most one (the leaf itself when the file holds only
// the leaf).
func LoadKeyPair(certFile, keyFile string) (*tls.Certificate, string, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, "", fmt.Errorf("load %s and %s: %w", certFile, keyFile, err)
	}
	top, err := x509.ParseCertificate(c.Certificate[len(c.Certificate)-1])
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", certFile, err)
	}
	return &c, Pin(top), nil
}

// LoadPool reads a PEM bundle of CA certificates.
func LoadPool(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New(file + ": no PEM certificate found")
	}
	return pool, nil
}

// CheckServerChain verifies the chain of an operator's certificate file
// (LoadKeyPair) the way a node given its pin does: its last certificate as
// the only root, for a TLS server. It is checked at a time inside every
// certificate's validity, so only what no clock fixes is reported (a
// certificate not meant for servers, a chain out of order or not signed
// through); when the chain ends is KeyPairExpiry's. The host name is not
// checked: nodes dial names the edge cannot know.
func CheckServerChain(c *tls.Certificate, certFile string) error {
	certs := make([]*x509.Certificate, len(c.Certificate))
	for i, der := range c.Certificate {
		x, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("%s: certificate %d: %w", certFile, i+1, err)
		}
		certs[i] = x
	}
	from, to := certs[0].NotBefore, certs[0].NotAfter
	for _, x := range certs[1:] {
		from, to = later(from, x.NotBefore), earlier(to, x.NotAfter)
	}
	if !from.Before(to) {
		return fmt.Errorf("%s: its certificates are never valid at the same time, so no node can verify it", certFile)
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(certs[len(certs)-1])
	if len(certs) > 2 {
		for _, x := range certs[1 : len(certs)-1] {
			inter.AddCert(x)
		}
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		CurrentTime: from.Add(to.Sub(from) / 2)}
	if _, err := certs[0].Verify(opts); err != nil {
		return fmt.Errorf("%s: no node can verify this chain up to its last certificate (the one its pin names): %w", certFile, err)
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
