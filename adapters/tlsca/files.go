package tlsca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
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
// (LoadKeyPair) the way a node given a pin of one of its certificates does:
// that certificate as the only root, the ones between as intermediates, for
// a TLS server. Each is checked at a time inside the validity of every
// certificate up to it, so only what no clock fixes is reported (a
// certificate not meant for servers, a chain out of order or not signed
// through); when the chain ends is KeyPairExpiry's. The host name is not
// checked: nodes dial names the edge cannot know.
//
// It refuses the file only when its first certificate verifies up to none
// of the file's (the leaf alone: itself): then no pin of any of them works,
// and only a node given --ca-file with a CA the file lacks could verify it.
// When it verifies, but not up to the last certificate (a leftover
// intermediate, an unrelated CA appended), the file is served and the
// returned warning says that the last certificate's pin, the one
// --print-ca-pin and join print, will not work, and which pin would.
func CheckServerChain(c *tls.Certificate, certFile string) (warning string, err error) {
	certs := make([]*x509.Certificate, len(c.Certificate))
	for i, der := range c.Certificate {
		x, err := x509.ParseCertificate(der)
		if err != nil {
			return "", fmt.Errorf("%s: certificate %d: %w", certFile, i+1, err)
		}
		certs[i] = x
	}
	verify := func(top int) error {
		roots, inter := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(certs[top])
		for i := 1; i < top; i++ {
			inter.AddCert(certs[i])
		}
		return VerifyWhileAllValid(certs[:top+1], x509.VerifyOptions{Roots: roots, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	}
	last := len(certs) - 1
	lastErr := verify(last)
	if lastErr == nil {
		return "", nil
	}
	var ie x509.CertificateInvalidError
	if errors.As(lastErr, &ie) && ie.Reason == x509.IncompatibleUsage {
		// Whatever the root: the leaf is not for servers.
		return "", fmt.Errorf("%s: no node can verify this chain: its first certificate is not made for TLS servers: %w", certFile, lastErr)
	}
	for top := last - 1; top >= 1; top-- {
		if verify(top) == nil {
			return fmt.Sprintf("%s: its last certificate (%s, certificate %d) signs none of the chain (%v), so a node given its pin, the one iop-edge --print-ca-pin and join print, "+
				"refuses the edge; a node given --ca-pin %s (certificate %d, %s), or --ca-file with the CA the chain goes up to, verifies it: "+
				"remove the certificates after certificate %d from the file", certFile, name(certs[last]), last+1, lastErr, Pin(certs[top]), top+1, name(certs[top]), top+1), nil
		}
	}
	if last == 0 {
		return "", fmt.Errorf("%s: no node given its pin can verify this certificate: %w", certFile, lastErr)
	}
	return "", fmt.Errorf("%s: its first certificate verifies up to none of the others, so no node given a pin of a certificate in the file can verify the edge "+
		"(put the chain in order: the server certificate first, then each issuer up to the CA nodes trust): %w", certFile, lastErr)
}

// name is a certificate's subject for a message.
func name(c *x509.Certificate) string {
	if s := c.Subject.String(); s != "" {
		return "subject " + s
	}
	return "no subject"
}

// VerifyWhileAllValid verifies certs[0] with opts (its CurrentTime
// replaced) at a time inside the validity of every one of certs: the middle
// of the window they are all valid in. So only what no clock fixes fails
// (a signature, a key usage, a host name, the chain's order); it fails too
// when the certificates are never valid at the same time.
func VerifyWhileAllValid(certs []*x509.Certificate, opts x509.VerifyOptions) error {
	if len(certs) == 0 {
		return errors.New("no certificate")
	}
	from, to := certs[0].NotBefore, certs[0].NotAfter
	for _, c := range certs[1:] {
		if c.NotBefore.After(from) {
			from = c.NotBefore
		}
		if c.NotAfter.Before(to) {
			to = c.NotAfter
		}
	}
	if !from.Before(to) {
		return errors.New("the certificates are never valid at the same time")
	}
	opts.CurrentTime = from.Add(to.Sub(from) / 2)
	_, err := certs[0].Verify(opts)
	return err
}
