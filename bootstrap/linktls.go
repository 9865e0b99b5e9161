package bootstrap

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.uber.org/fx"

	"iop/adapters/config"
	"iop/adapters/tlsca"
	"iop/adapters/transport"
)

// renewCheckEvery is how often a running edge checks its auto-mode server
// certificate (and, in either mode, how soon what it serves expires); with
// 90-day certificates renewed 30 days early, twice a day is plenty.
const renewCheckEvery = 12 * time.Hour

// LinkTLS is the edge's node-link security, resolved from transport.tls.
type LinkTLS struct {
	// Config is nil in mode off (plaintext).
	Config *tls.Config
	// Pin is what nodes pass as --ca-pin; empty in mode off.
	Pin string
	ca  *tlsca.Manager // auto mode only
	// files is when the files-mode chain expires (read at start).
	files *tlsca.Expiry
}

// CertExpiry is when the certificates served on the node link expire, by
// the metrics' cert label: "ca" and "server" in auto mode (the current
// certificate: renewals move it), "server" (the chain's earliest end) in
// files mode; none when the link is plaintext.
func (l *LinkTLS) CertExpiry() map[string]time.Time {
	switch {
	case l.ca != nil:
		return map[string]time.Time{"ca": l.ca.CA().NotAfter, "server": l.ca.Certificate().Leaf.NotAfter}
	case l.files != nil:
		return map[string]time.Time{"server": l.files.NotAfter}
	}
	return nil
}

// Leaf is the certificate the node link serves now (nil in mode off).
func (l *LinkTLS) Leaf() *x509.Certificate {
	if l.Config == nil {
		return nil
	}
	c, err := l.Config.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || c == nil || len(c.Certificate) == 0 {
		return nil
	}
	if c.Leaf != nil {
		return c.Leaf
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return nil
	}
	return leaf
}

// OpenLinkTLS loads (in auto mode, first creates) the edge's certificate
// and returns the link's TLS settings. iop-edge --print-ca-pin uses it too,
// so the pin can be printed before the edge first starts.
func OpenLinkTLS(c *config.EdgeConfig, log *slog.Logger) (*LinkTLS, error) {
	t := c.Transport.TLS
	var l LinkTLS
	var getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	switch t.Mode {
	case config.TLSOff:
		return &l, nil
	case config.TLSFiles:
		cert, pin, err := tlsca.LoadKeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("transport.tls: %w", err)
		}
		exp, err := tlsca.KeyPairExpiry(cert, t.CertFile)
		if err != nil {
			return nil, fmt.Errorf("transport.tls: %w", err)
		}
		// A chain no node could verify (a certificate not for servers,
		// one out of order) is refused, as an expired one is below; one
		// whose top certificate signs none of it is served, with a
		// warning that the pin printed for it will not work.
		warning, err := tlsca.CheckServerChain(cert, t.CertFile)
		if err != nil {
			return nil, fmt.Errorf("transport.tls: %w", err)
		}
		if warning != "" {
			log.Warn("transport.tls: " + warning)
		}
		// An expired chain is refused, as auto mode refuses an expired
		// CA: no node could verify the edge. One near its end is warned
		// about.
		if err := tlsca.Check(log, time.Now(), []tlsca.Expiry{exp}); err != nil {
			return nil, fmt.Errorf("transport.tls: %w", err)
		}
		l.files = &exp
		l.Pin = pin
		getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil }
	default:
		m, err := tlsca.Open(tlsca.Options{Dir: c.TLSDir(), Hosts: c.CertHosts(), Logger: log})
		if err != nil {
			return nil, fmt.Errorf("transport.tls (auto): %w", err)
		}
		l.ca, l.Pin, getCert = m, m.Pin(), m.GetCertificate
	}
	var clientCAs *x509.CertPool
	if t.ClientCAFile != "" {
		pool, err := tlsca.LoadPool(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("transport.tls.client_ca_file: %w", err)
		}
		clientCAs = pool
	}
	l.Config = transport.NewServerTLS(getCert, clientCAs)
	return &l, nil
}

// newLinkTLS provides LinkTLS to the edge and, in auto mode, keeps the
// server certificate renewed while the edge runs; in either mode it warns
// while what the link serves nears its end.
func newLinkTLS(lc fx.Lifecycle, s EdgeSettings, log *slog.Logger, _ stateDirReady) (*LinkTLS, error) {
	l, err := OpenLinkTLS(s.Config, log)
	if err != nil {
		return nil, err
	}
	if l.Config == nil {
		log.Warn("node link is plaintext (transport.tls.mode: off); tokens and run data cross in clear", "listen", s.Config.Transport.Listen)
		return l, nil
	}
	log.Info("node link uses TLS", "mode", s.Config.Transport.TLS.Mode, "ca_pin", l.Pin, "client_certificates", s.Config.Transport.TLS.ClientCAFile != "")
	if l.ca != nil {
		runWhileUp(lc, func(ctx context.Context) { l.ca.Run(ctx, renewCheckEvery) })
	} else {
		runWhileUp(lc, func(ctx context.Context) { watchExpiry(ctx, renewCheckEvery, log, *l.files) })
	}
	return l, nil
}

// runWhileUp runs job in a goroutine from the app's start until its stop,
// which cancels job's context and waits for it to return.
func runWhileUp(lc fx.Lifecycle, job func(context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error { wg.Go(func() { job(ctx) }); return nil },
		OnStop:  func(context.Context) error { cancel(); wg.Wait(); return nil },
	})
}

// watchExpiry warns every interval, until ctx ends, while e nears its end,
// and logs an error once it has passed it (as Manager.Run does in auto mode).
func watchExpiry(ctx context.Context, interval time.Duration, log *slog.Logger, e tlsca.Expiry) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := tlsca.Check(log, time.Now(), []tlsca.Expiry{e}); err != nil {
				log.Error("tls: " + err.Error())
			}
		}
	}
}

// NodeLinkTLS turns the node's ca_pin/ca_file/insecure/cert/key into the
// link's TLS settings; nil means plaintext (insecure).
func NodeLinkTLS(c *config.NodeConfig) (*tls.Config, error) {
	if c.TLS.Insecure {
		return nil, nil
	}
	return transport.NewClientTLS(transport.ClientTLS{
		CAPin: c.TLS.CAPin, CAFile: c.TLS.CAFile, CertFile: c.TLS.Cert, KeyFile: c.TLS.Key,
	}, c.Edge)
}
