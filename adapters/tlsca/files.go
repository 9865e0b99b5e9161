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
