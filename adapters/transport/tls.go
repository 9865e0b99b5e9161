package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"iop/adapters/tlsca"
	"iop/domain"
)

// TLS on the node link is a hook around net.Conn: the edge wraps each
// accepted connection and the node each dialed one before the register
// exchange, under the same handshake deadline. Frames, streams and the
// multiplexer above never know whether the bytes are encrypted.

// NewServerTLS returns the edge's TLS settings: TLS 1.3, the certificate
// from getCert (which may change between handshakes, for renewals) and,
// when clientCAs is set, a mandatory client certificate from those CAs.
func NewServerTLS(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAs *x509.CertPool) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: getCert}
	if clientCAs != nil {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = clientCAs
	}
	return c
}

// ClientTLS is how a node trusts its edge: exactly one of CAPin and CAFile,
// plus an optional client certificate.
type ClientTLS struct {
	CAPin    string // "sha256:<hex>" of a public key in the edge's chain
	CAFile   string // PEM bundle the edge's chain must lead to
	CertFile string
	KeyFile  string
}

// NewClientTLS returns the node's TLS settings for dialing addr.
//
// With a pin, the chain the edge presents must contain a certificate whose
// public key has that pin, and the leaf must verify up to it (standard
// crypto/x509 verification, the pinned certificate as the only root). The
// host name is checked too unless the pin is the leaf's own: a pinned CA may
// have issued certificates for other hosts, a pinned leaf has not.
func NewClientTLS(o ClientTLS, addr string) (*tls.Config, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("edge address %q: %w", addr, err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: host}
	switch {
	case o.CAPin != "" && o.CAFile != "":
		return nil, errors.New("set only one of ca_pin and ca_file")
	case o.CAPin != "":
		pin, err := tlsca.ParsePin(o.CAPin)
		if err != nil {
			return nil, err
		}
		// Go's own chain verification is replaced by verifyPinned, which
		// still verifies with crypto/x509, only against the pinned root.
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if err := verifyPinned(pin, host, cs.PeerCertificates); err != nil {
				return &TrustError{Err: err}
			}
			return nil
		}
	case o.CAFile != "":
		pool, err := tlsca.LoadPool(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		// Verified by verifyCAFile, which does what crypto/tls would
		// (crypto/x509, the bundle as roots, the host name) but names the
		// file when the edge's chain is from another CA: crypto/tls says
		// no more than "certificate signed by unknown authority".
		file := o.CAFile
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if err := verifyCAFile(pool, file, host, cs.PeerCertificates); err != nil {
				return &TrustError{Err: err}
			}
			return nil
		}
	default:
		return nil, errors.New("no ca_pin or ca_file to trust the edge with")
	}
	if o.CertFile != "" || o.KeyFile != "" {
		// Read now, so a wrong file stops the node at start, and again at
		// every handshake: client certificates are often short-lived and
		// renewed in place, and one read only at start would, once
		// expired, fail every reconnect until the node was restarted.
		if _, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile); err != nil {
			return nil, fmt.Errorf("client certificate %s and key %s: %w", o.CertFile, o.KeyFile, err)
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return loadClientCert(o.CertFile, o.KeyFile, time.Now())
		}
	}
	return c, nil
}

// loadClientCert reads the node's client certificate for one handshake. One
// that has expired by the node's clock is not sent: the edge would refuse
// it with no more than "expired certificate", and this error names the
// file and the date.
func loadClientCert(certFile, keyFile string, now time.Time) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("client certificate %s and key %s: %w", certFile, keyFile, err)
	}
	leaf := cert.Leaf
	if leaf == nil { // GODEBUG x509keypairleaf=0
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("client certificate %s: %w", certFile, err)
		}
	}
	if end := leaf.NotAfter; !now.Before(end) {
		return nil, fmt.Errorf("client certificate %s expired on %s: renew it (the node reads --cert and --key again at every connection attempt)",
			certFile, end.UTC().Format(time.RFC3339))
	}
	return &cert, nil
}

// PinMismatchError: the edge presented no certificate with the pinned key.
type PinMismatchError struct {
	Want string // the pin the node was given
	Seen string // the pin of the top certificate the edge presented
}

func (e *PinMismatchError) Error() string {
	return fmt.Sprintf("the edge's certificate does not match --ca-pin: expected %s, the edge presented %s "+
		"(a different edge, a re-created edge CA, or a man in the middle; check the pin with iop-edge --config edge.yaml --print-ca-pin)", e.Want, e.Seen)
}

func verifyPinned(pin, host string, certs []*x509.Certificate) error {
	if len(certs) == 0 {
		return errors.New("the edge presented no certificate")
	}
	at := -1
	for i, c := range certs {
		if tlsca.Pin(c) == pin {
			at = i
			break
		}
	}
	if at < 0 {
		return &PinMismatchError{Want: pin, Seen: tlsca.Pin(certs[len(certs)-1])}
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(certs[at])
	for _, c := range certs[1:max(at, 1)] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if at > 0 {
		opts.DNSName = host
	}
	if _, err := certs[0].Verify(opts); err != nil {
		err = fmt.Errorf("the edge's certificate does not verify up to the pinned key %s: %w", pin, err)
		if onlyTime(err, certs[:at+1], opts) { // what is past the pinned one is not verified
			return &ValidityError{Err: err}
		}
		return err
	}
	return nil
}

// verifyCAFile verifies the edge's chain against the CA bundle of file, for
// host, as crypto/tls does with RootCAs; a chain that fails only on the time
// is a ValidityError.
func verifyCAFile(pool *x509.CertPool, file, host string, certs []*x509.Certificate) error {
	if len(certs) == 0 {
		return errors.New("the edge presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	_, err := certs[0].Verify(opts)
	var ua x509.UnknownAuthorityError
	switch {
	case err == nil:
		return nil
	case onlyTime(err, certs, opts):
		return &ValidityError{Err: fmt.Errorf("the edge's certificate does not verify against --ca-file %s: %w", file, err)}
	case errors.As(err, &ua):
		return fmt.Errorf("the edge's certificate is not signed by a CA in --ca-file %s (%w): a different edge, a re-created edge CA, or a man in the middle; "+
			"with transport.tls.mode auto the edge's CA is state_dir/tls/ca.pem, or use --ca-pin (iop-edge --config edge.yaml --print-ca-pin)", file, err)
	}
	return fmt.Errorf("the edge's certificate does not verify against --ca-file %s: %w", file, err)
}

// ValidityError is an edge chain that verifies but for the time: a
// certificate of it is not valid yet, or no longer, at the node's time. The
// signatures, the pin or CA and the host name all hold, so it is a clock
// (the node's or the edge's) or an expiry at fault, not a man in the middle.
type ValidityError struct{ Err error }

func (e *ValidityError) Error() string { return e.Err.Error() }
func (e *ValidityError) Unwrap() error { return e.Err }

// onlyTime reports whether err, from verifying certs[0] (the chain the edge
// presented, up to the root it is verified to) with opts, is a certificate
// outside its validity period, and the chain verifies with opts at a time
// inside the validity of every one of certs.
func onlyTime(err error, certs []*x509.Certificate, opts x509.VerifyOptions) bool {
	var ie x509.CertificateInvalidError
	return errors.As(err, &ie) && ie.Reason == x509.Expired && tlsca.VerifyWhileAllValid(certs, opts) == nil
}

// TrustError is a TLS failure that retrying cannot fix: the edge's
// certificate did not match the node's pin or CA. The node stops instead of
// retrying into a possible man in the middle. A chain that fails only on
// the time (a ValidityError) is the exception: see Fatal.
type TrustError struct{ Err error }

func (e *TrustError) Error() string {
	return "cannot trust the edge: " + e.Err.Error() + hostHint(e.Err) + timeHint(e.Err)
}
func (e *TrustError) Unwrap() error { return e.Err }

// Fatal is true (see Client.Run) unless the edge's chain failed only
// because a certificate is not valid at the node's time (a ValidityError):
// a clock that is off (a machine without a battery-backed clock, before it
// syncs, is hours or years behind) or a certificate the edge has let
// expire. Retrying fixes both once the clock is set or the certificate
// replaced, and sends nothing meanwhile: the token goes only over a
// verified connection.
func (e *TrustError) Fatal() bool { return !errors.As(e.Err, new(*ValidityError)) }

func timeHint(err error) string {
	if !errors.As(err, new(*ValidityError)) {
		return ""
	}
	var ie x509.CertificateInvalidError
	if errors.As(err, &ie) {
		// Go says "current time T is before NotBefore" for a certificate
		// not valid yet, "... is after NotAfter" for an expired one.
		if _, from, ok := strings.Cut(ie.Detail, " is before "); ok {
			return " (a certificate of the edge's is not valid until " + from + ": the edge's clock was ahead when it made it, or this node's clock is behind; " +
				"check both with date -u; with transport.tls.mode auto the edge replaces it within 12 h of its clock being set right, or at once when restarted " +
				"(if that re-signs its CA, a node using --ca-file needs the new ca.pem); retrying)"
		}
	}
	return " (check that this node's clock and the edge's are right, e.g. with date -u on both; if they are, the edge's certificate has expired and must be replaced there; retrying)"
}

func hostHint(err error) string {
	var he x509.HostnameError
	if errors.As(err, &he) {
		return fmt.Sprintf(" (if the node reaches the edge as %s: with transport.tls.mode auto, add it to transport.tls.hosts in edge.yaml and restart the edge; "+
			"with mode files, the certificate in cert_file must name it)", he.Host)
	}
	return ""
}

// secureClient runs the node's TLS handshake on nc under the deadline
// already set on it. With no TLS config nc is returned as is (--insecure).
func secureClient(nc net.Conn, cfg *tls.Config) (net.Conn, error) {
	if cfg == nil {
		return nc, nil
	}
	tc := tls.Client(nc, cfg)
	if err := tc.Handshake(); err != nil {
		_ = nc.Close()
		var te *TrustError
		if errors.As(err, &te) {
			return nil, te
		}
		// A node's configs (NewClientTLS) verify the edge themselves and
		// fail with a TrustError above; crypto/tls's own verification is
		// reached only by a config built elsewhere, and is a trust failure
		// all the same.
		var cv *tls.CertificateVerificationError
		if errors.As(err, &cv) {
			return nil, &TrustError{Err: err}
		}
		return nil, plaintextHint(cfg, fmt.Errorf("tls handshake: %w", err))
	}
	return tc, nil
}

// clientCertHint explains the edge refusing the node's client certificate.
// In TLS 1.3 the edge checks it after the node's side of the handshake is
// done, so the refusal reaches the node as an alert on its first read, and
// crypto/tls's "remote error: tls: unknown certificate authority" reads as
// though the node did not trust the edge.
func clientCertHint(err error) error {
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "remote error" || oe.Err == nil {
		return err
	}
	switch oe.Err.Error() {
	case "tls: certificate required":
		return fmt.Errorf("%w (the edge requires a client certificate, as its transport.tls.client_ca_file is set: start this node with --cert and --key issued from that CA)", err)
	case "tls: unknown certificate authority", "tls: bad certificate", "tls: certificate expired", "tls: unsupported certificate", "tls: certificate unknown":
		return fmt.Errorf("%w (the edge refused this node's client certificate, --cert: it must be issued by a CA in the edge's transport.tls.client_ca_file, "+
			"for TLS clients, and valid by the edge's clock)", err)
	}
	return err
}

// plaintextHint explains the one symptom a plaintext node sees at a TLS
// edge: the connection closed without a register response.
func plaintextHint(cfg *tls.Config, err error) error {
	var rec tls.RecordHeaderError
	switch {
	case errors.Is(err, ErrMalformedFrame), errors.As(err, &rec):
		// What answered does not speak the link (the edge's HTTP port,
		// another service) or speaks it without TLS: said once, plainly,
		// instead of protocol noise at every retry.
		return fmt.Errorf("%w (what answered is not the edge's node link as this node dials it: is the address the edge's transport.listen, not its http.listen, and does its transport.tls.mode match --insecure or --ca-pin/--ca-file?)", err)
	case cfg != nil || !errors.Is(err, io.EOF):
		return err
	}
	return fmt.Errorf("%w (the edge answered nothing: if its transport.tls.mode is not off, start this node with --ca-pin or --ca-file instead of --insecure)", err)
}

// A TLS record starts with its type (0x16 for a handshake, a ClientHello)
// and the major version 3. On a plaintext link the first read as a frame
// length (a one-byte varint, 22) and the second as its first byte.
const (
	tlsHandshakeRecord = 0x16
	tlsMajorVersion    = 0x03
)

// errTLSClient is a TLS ClientHello read as a frame: a node that dials with
// --ca-pin or --ca-file an edge whose link is plaintext.
var errTLSClient = errors.New("the peer started a TLS handshake")

// tlsOnPlaintextReason is the edge's report of such a node.
const tlsOnPlaintextReason = "a TLS client on a plaintext node link (transport.tls.mode is off): start the node with --insecure, " +
	"or set transport.tls.mode auto and give the node --ca-pin"

// secure runs secureServer; on failure it closes nc and reports why. A
// failed handshake that was not a slow or vanished peer (plaintext, garbage,
// a refused client certificate) is charged to key's budget of failed
// registrations like a wrong token: a TLS-garbage flood is the same attack.
// What a web page can make a browser do is not charged (browserTLSFailure):
// plain HTTP or STUN, or an https:// request whose browser refused the
// edge's certificate.
// One closed to make room for another connection (t evicted) is neither
// charged nor reported again.
func (s *Server) secure(nc net.Conn, remote, key string, t *ticket) (net.Conn, domain.PeerIdentity, bool) {
	sc, peer, err := s.secureServer(nc)
	if err != nil {
		_ = nc.Close()
		if s.adm.evicted(t) {
			return nil, peer, false
		}
		if !slowOrGone(err) && !browserTLSFailure(err) {
			s.adm.failed(key)
		}
		s.tlsFailed(remote, err)
		return nil, peer, false
	}
	return sc, peer, true
}

// secureServer runs the edge's TLS handshake on an accepted connection
// under the handshake deadline already set on it, and returns what it
// verified about the peer. With no TLS config nc is returned as is.
func (s *Server) secureServer(nc net.Conn) (net.Conn, domain.PeerIdentity, error) {
	if s.cfg.TLS == nil {
		return nc, domain.PeerIdentity{}, nil
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		// Conn sets this on a *net.TCPConn only; it will get a *tls.Conn.
		_ = tc.SetKeepAlive(true)
		_ = tc.SetKeepAlivePeriod(s.cfg.HeartbeatInterval)
	}
	tc := tls.Server(nc, s.cfg.TLS)
	if err := tc.Handshake(); err != nil {
		return nil, domain.PeerIdentity{}, err
	}
	peer := domain.PeerIdentity{Encrypted: true}
	if st := tc.ConnectionState(); len(st.VerifiedChains) > 0 {
		leaf := st.VerifiedChains[0][0]
		if leaf.Subject.CommonName != "" {
			peer.CertNames = append(peer.CertNames, leaf.Subject.CommonName)
		}
		peer.CertNames = append(peer.CertNames, leaf.DNSNames...)
	}
	return tc, peer, nil
}

// tlsFailed reports a failed TLS handshake as a handshake failure whose
// reason starts with "tls", at most tlsReportBurst at once and then one per
// tlsReportEvery, so a flood of plaintext or port-scanning clients cannot
// flood the event bus and the log; the next report counts what was skipped.
func (s *Server) tlsFailed(remote string, err error) {
	s.handshakeFailed(remote, "tls: "+tlsReason(err))
}

// handshakeFailed reports a failed handshake from remote for reason, as
// many as tlsReports allows: the others are counted, and the next report
// says how many were not.
func (s *Server) handshakeFailed(remote, reason string) {
	n, ok := s.tlsReports.allow(time.Now())
	if !ok {
		s.h.HandshakeFailedUnreported()
		return
	}
	if n > 0 {
		reason += fmt.Sprintf(" (%d more TLS handshake failures not reported)", n)
	}
	s.h.HandshakeFailed(remote, reason)
}

// slowOrGone reports a handshake that timed out or whose peer hung up.
func slowOrGone(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func tlsReason(err error) string {
	var rh tls.RecordHeaderError
	var ne net.Error
	switch {
	case errors.As(err, &rh) && browserStart(rh.RecordHeader[:]) != "":
		return browserStart(rh.RecordHeader[:]) + ", not a node; not charged to the address"
	case errors.As(err, &rh):
		return "not a TLS client (plaintext? a node needs --ca-pin or --ca-file for this edge)"
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, os.ErrDeadlineExceeded):
		return "handshake timed out"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "peer closed the connection during the handshake"
	}
	return strings.TrimPrefix(err.Error(), "tls: ")
}

const (
	tlsReportBurst = 10
	tlsReportEvery = time.Second
)

// reportLimiter is a token bucket of tlsReportBurst refilled one per
// tlsReportEvery; its zero value is ready (full).
type reportLimiter struct {
	mu         sync.Mutex
	used       float64 // tokens spent, decays with time
	last       time.Time
	suppressed int
}

// allow reports whether to report now and, if so, how many were skipped before.
func (l *reportLimiter) allow(now time.Time) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() {
		l.used = max(0, l.used-float64(now.Sub(l.last))/float64(tlsReportEvery))
	}
	l.last = now
	if l.used+1 > tlsReportBurst {
		l.suppressed++
		return 0, false
	}
	l.used++
	n := l.suppressed
	l.suppressed = 0
	return n, true
}
