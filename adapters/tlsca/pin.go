// Package tlsca manages the edge's own certificate authority for the node
// link (transport.tls.mode: auto) and computes the public-key pins nodes use
// to trust it. Everything is stdlib crypto/x509 and crypto/ecdsa.
package tlsca

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"strings"
)

// PinPrefix starts every pin: the hash algorithm, so another can be added later.
const PinPrefix = "sha256:"

// Pin is "sha256:<64 hex>", the SHA-256 of cert's SubjectPublicKeyInfo. It
// stays the same when a certificate is re-issued for the same key, which is
// why a pin names a key rather than a certificate.
func Pin(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return PinPrefix + hex.EncodeToString(sum[:])
}

// ParsePin checks that s is a pin and returns it normalized (lower-case hex).
func ParsePin(s string) (string, error) {
	s = strings.TrimSpace(s)
	hexPart, ok := strings.CutPrefix(strings.ToLower(s), PinPrefix)
	if !ok {
		return "", fmt.Errorf("pin %q must start with %q", s, PinPrefix)
	}
	b, err := hex.DecodeString(hexPart)
	if err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("pin %q must be %q followed by 64 hex digits", s, PinPrefix)
	}
	return PinPrefix + hexPart, nil
}
