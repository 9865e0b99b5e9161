package edgestore

import (
	"context"
	"crypto/tls"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/uptrace/bun/driver/pgdriver"
)

// pgConnector is the store's way to PostgreSQL: pgdriver's connector, with
// what pgdriver lacks.
//
//   - sslmode prefer (libpq's default, also when the DSN names none) and
//     allow keep libpq's meaning, per connection: prefer asks the server for
//     TLS and goes on in plaintext when it has none; allow connects in
//     plaintext and tries TLS when the server refuses that. pgdriver
//     required TLS for both ("SSL is not enabled on the server").
//   - An idle connection the server has ended (a restart,
//     idle_session_timeout, a pooler) is dropped before it is used again
//     (see peerClosed), instead of failing the next statement.
//   - A connection that fails while it is being set up is closed.
type pgConnector struct {
	// attempts are tried in order: a later one only when the server
	// refused the one before (sslmode=allow).
	attempts []*pgdriver.Connector
}

// checkIdle, when set, tells whether a pooled connection is still usable
// before database/sql hands it out again. A variable so a test can take it
// away (as where it cannot be done, !unix) to exercise the retry alone.
var checkIdle = func(nc net.Conn) bool { return !peerClosed(nc) }

// newPGConnector builds the connector for dsn. pgdriver panics on a DSN
// it cannot use (a bad percent escape, an unknown sslmode, an unreadable
// sslrootcert, an empty user name) and the panic value can quote the DSN,
// password included; this returns an error instead that holds neither.
// The config refuses most such DSNs first (config.checkPostgresDSN).
func newPGConnector(dsn string, opts ...pgdriver.Option) (*pgConnector, error) {
	u, perr := url.Parse(dsn)
	if perr != nil {
		// url.Error quotes the whole URL.
		return nil, errors.New("open edge store: the PostgreSQL DSN is not a valid URL: percent-encode special characters in the password")
	}
	base, err := parsePGDSN(dsn, u, opts...)
	if err != nil {
		return nil, err
	}
	conf := base.Config()
	conf.ResetSessionFunc = func(_ context.Context, cn *pgdriver.Conn) error {
		if checkIdle != nil && !checkIdle(cn.Conn()) {
			return driver.ErrBadConn // database/sql closes it and takes another
		}
		return nil
	}
	dial := conf.Dialer
	conf.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err == nil {
			noteDialed(ctx, nc)
		}
		return nc, err
	}
	mode := ""
	if v := u.Query()["sslmode"]; len(v) > 0 {
		mode = v[len(v)-1] // pgdriver takes the last
	}
	c := &pgConnector{attempts: []*pgdriver.Connector{base}}
	switch mode {
	case "", "prefer":
		if tlsConf := conf.TLSConfig; tlsConf != nil {
			conf.TLSConfig = nil // negotiated by the dialer instead
			withTLS := conf.Dialer
			timeout := conf.ReadTimeout
			conf.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
				nc, err := withTLS(ctx, network, addr)
				if err != nil || network == "unix" { // libpq uses no TLS over a Unix socket either
					return nc, err
				}
				return preferTLS(ctx, nc, tlsConf, timeout, func() (net.Conn, error) { return dial(ctx, network, addr) })
			}
		}
	case "allow":
		if tlsConf := conf.TLSConfig; tlsConf != nil {
			secure := *conf
			conf.TLSConfig = nil
			c.attempts = append(c.attempts, pgdriver.NewConnector(pgdriver.WithConfig(&secure)))
		}
	}
	return c, nil
}

// parsePGDSN is pgdriver's connector for dsn (then opts), its panic turned
// into an error that quotes neither the DSN nor its password.
func parsePGDSN(dsn string, u *url.URL, opts ...pgdriver.Option) (conn *pgdriver.Connector, err error) {
	defer func() {
		if r := recover(); r != nil {
			msg := fmt.Sprint(r)
			secrets := []string{dsn}
			if pw, ok := u.User.Password(); ok && pw != "" {
				_, raw, _ := strings.Cut(u.User.String(), ":")
				secrets = append(secrets, pw, raw)
			}
			for _, s := range secrets {
				if s != "" {
					msg = strings.ReplaceAll(msg, s, "***")
				}
			}
			conn, err = nil, fmt.Errorf("open edge store: the PostgreSQL DSN is refused: %s", msg)
		}
	}()
	// The defaults first: the DSN's own timeouts (connect_timeout, …),
	// which the config checks, override them.
	return pgdriver.NewConnector(append([]pgdriver.Option{pgdriver.WithTimeout(5 * time.Second), pgdriver.WithDSN(dsn)}, opts...)...), nil
}

// withStatementTimeout makes the server give up a connection's statements
// after d (its statement_timeout, set when it connects) unless the DSN
// sets one. pgdriver cannot cancel a statement: when the store stops
// waiting for one it closes the socket, and the server goes on with it.
// A read waiting on a lock another session holds (a LOCK TABLE, an ALTER)
// then left a backend waiting behind each request given up, until the
// server's max_connections were taken and it refused every client.
func withStatementTimeout(d time.Duration) pgdriver.Option {
	return func(conf *pgdriver.Config) {
		if _, ok := conf.ConnParams["statement_timeout"]; ok {
			return
		}
		params := make(map[string]any, len(conf.ConnParams)+1)
		for k, v := range conf.ConnParams {
			params[k] = v
		}
		params["statement_timeout"] = d.Milliseconds()
		conf.ConnParams = params
	}
}

// Connect opens a connection: with sslmode=allow, over TLS when the server
// refused the plaintext one.
func (c *pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	cn, err := connect(ctx, c.attempts[0])
	if err == nil || len(c.attempts) == 1 || !refusedConnection(err) || ctx.Err() != nil {
		return cn, err
	}
	cn, err2 := connect(ctx, c.attempts[1])
	if err2 != nil {
		return nil, fmt.Errorf("%w; over TLS: %w", err, err2)
	}
	return cn, nil
}

// Driver is pgdriver's.
func (c *pgConnector) Driver() driver.Driver { return c.attempts[0].Driver() }

// refusedConnection reports whether the server refused a connection's
// authorization (SQLSTATE class 28: no pg_hba.conf entry for a plaintext
// connection, or a wrong password), which libpq's sslmode=allow answers by
// trying TLS.
func refusedConnection(err error) bool {
	var pg pgdriver.Error
	return errors.As(err, &pg) && strings.HasPrefix(pg.Field('C'), "28")
}

type dialedKey struct{}

// noteDialed tells connect which socket a connection attempt opened.
func noteDialed(ctx context.Context, nc net.Conn) {
	if p, ok := ctx.Value(dialedKey{}).(*net.Conn); ok {
		*p = nc
	}
}

// connect is pc.Connect closing the socket of a connection that failed
// while it was set up (pgdriver leaves it open: a refused login, a failed
// TLS handshake).
func connect(ctx context.Context, pc *pgdriver.Connector) (driver.Conn, error) {
	var dialed net.Conn
	cn, err := pc.Connect(context.WithValue(ctx, dialedKey{}, &dialed))
	if err != nil && dialed != nil {
		_ = dialed.Close()
	}
	return cn, err
}

// sslRequest asks a PostgreSQL server for TLS (its protocol's SSLRequest:
// length 8, code 80877103).
var sslRequest = []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}

// preferTLS is libpq's sslmode=prefer on a new connection nc: it asks the
// server for TLS and returns nc over TLS when the server agrees, nc as it
// is when the server has no TLS ('N'), and a new plaintext connection
// (redial) when the TLS handshake fails. Like libpq's, this TLS is not
// verified and a man in the middle can refuse it: verify-full protects.
func preferTLS(ctx context.Context, nc net.Conn, conf *tls.Config, timeout time.Duration, redial func() (net.Conn, error)) (net.Conn, error) {
	var deadline time.Time // none when the DSN turned timeouts off (0)
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	_ = nc.SetDeadline(deadline)
	var answer [1]byte
	if _, err := nc.Write(sslRequest); err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(nc, answer[:]); err != nil {
		return nil, err
	}
	switch answer[0] {
	case 'N':
		_ = nc.SetDeadline(time.Time{})
		return nc, nil
	case 'S':
		tc := tls.Client(nc, conf)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			if ctx.Err() != nil {
				return nil, fmt.Errorf("pgdriver: TLS handshake failed: %w", err)
			}
			pc, err := redial()
			if err == nil {
				noteDialed(ctx, pc)
			}
			return pc, err
		}
		_ = tc.SetDeadline(time.Time{})
		return tc, nil
	default:
		return nil, fmt.Errorf("pgdriver: the server answered %q to the request for TLS", answer[0])
	}
}

// connLost reports whether err says the connection to PostgreSQL broke or
// was ended, not that the server refused a statement: the server ended the
// session (SQLSTATE class 08, 57P01–57P05: shutdown, crash, idle session
// timeout), or the socket closed or failed under it. Nothing of the
// statement was committed, or if its COMMIT was cut off it may have been,
// and every history write is an idempotent upsert: it is worth once more
// on another connection. A timeout is not a broken connection: the server
// is slow or away, and a retry would only wait again.
func connLost(err error) bool {
	var pg pgdriver.Error
	if errors.As(err, &pg) {
		code := pg.Field('C')
		return strings.HasPrefix(code, "08") || (code >= "57P01" && code <= "57P05")
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && !ne.Timeout()
}
