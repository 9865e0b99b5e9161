// Package netmsg describes a failed connection to an upstream server in
// words a caller may see: what went wrong, never where. Errors of package
// net carry the node's upstream host and port ("dial tcp 10.0.0.5:11434:
// connect: connection refused"); relayed to callers of the edge they would
// map the node's private network.
package netmsg

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"syscall"
)

// Describe returns a short, address-free description of err.
func Describe(err error) string {
	var dns *net.DNSError
	var ne net.Error
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	switch {
	case err == nil:
		return "no error"
	case errors.As(err, &dns):
		return "provider host name could not be resolved"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "provider unreachable: connection refused"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "provider unreachable: no route to host"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset by the provider"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by the provider"
	case errors.As(err, &certErr), errors.As(err, &unknownAuth), errors.As(err, &hostErr):
		return "provider TLS certificate not trusted"
	case errors.As(err, &ne) && ne.Timeout():
		return "provider did not answer in time"
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return "provider unreachable"
	}
	if errors.As(err, &op) {
		return "connection to the provider failed"
	}
	return "request to the provider failed"
}
