package edgestore

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"iop/adapters/store/pgtest"
)

// Where an ended idle connection cannot be seen before use (the check
// taken away, as on !unix, or a connection that breaks just after it),
// the batch that took it is written again on another, and a read asked
// again: nothing is lost, nothing answered 503, with the database up.
func TestPostgresBrokenConnectionIsRetriedOnce(t *testing.T) {
	saved := checkIdle
	checkIdle = nil
	defer func() { checkIdle = saved }()
	srv, err := pgtest.Start()
	if errors.Is(err, pgtest.ErrUnavailable) {
		t.Skipf("skipping the PostgreSQL run: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	ctx := context.Background()
	dsn, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := &Store{db: db}
	restart := func() {
		t.Helper()
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	// One statement at a time: the pool holds one idle connection.
	if lost, err := s.writeBatch(ctx, []any{runRow{ID: "run_1", Status: "running", KeyName: "k"}}); lost != 0 {
		t.Fatal(err)
	}
	restart()
	if lost, err := s.writeBatch(ctx, []any{runRow{ID: "run_2", Status: "running", KeyName: "k"}}); lost != 0 {
		t.Fatalf("after a restart: %d rows lost: %v", lost, err)
	}
	restart()
	if _, err := s.GetRun(ctx, "run_2"); err != nil {
		t.Fatalf("a read after a restart: %v", err)
	}
	if got := storedIDs(t, db); got != "[run_1 run_2] []" {
		t.Fatalf("stored %s", got)
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestConnLost(t *testing.T) {
	for _, err := range []error{io.EOF, io.ErrUnexpectedEOF, &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}} {
		if !connLost(err) {
			t.Errorf("connLost(%v) = false", err)
		}
	}
	for _, err := range []error{context.DeadlineExceeded, timeoutErr{}, errors.New("pgdriver: something")} {
		if connLost(err) {
			t.Errorf("connLost(%v) = true", err)
		}
	}
}

// withSSLMode is dsn with its sslmode replaced (mode "" leaves it out).
func withSSLMode(t *testing.T, dsn, mode string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Del("sslmode")
	if mode != "" {
		q.Set("sslmode", mode)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// openOverTLS opens dsn, writes and reads a row through the store, and
// reports whether its connection is encrypted.
func openOverTLS(t *testing.T, dsn string) (bool, error) {
	t.Helper()
	ctx := context.Background()
	db, err := Open(ctx, dsn)
	if err != nil {
		return false, err
	}
	defer db.Close()
	s := &Store{db: db}
	if lost, err := s.writeBatch(ctx, []any{runRow{ID: "run_tls", Status: "running", KeyName: "k"}}); lost != 0 {
		return false, err
	}
	if _, err := s.GetRun(ctx, "run_tls"); err != nil {
		return false, err
	}
	var ssl bool
	err = db.bun.QueryRowContext(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl)
	return ssl, err
}

// sslmode keeps libpq's meaning: prefer (the default) takes TLS when the
// server has it and plaintext when it has none, allow plaintext unless the
// server refuses it. pgdriver required TLS for both, so they failed on a
// server without TLS ("SSL is not enabled on the server").
func TestPostgresSSLModes(t *testing.T) {
	plain := pgtest.DSN(t)
	srv, err := pgtest.StartWith(pgtest.Options{TLSOnly: true})
	if err != nil {
		t.Fatal(err) // pgtest.DSN above skipped the test without PostgreSQL
	}
	defer srv.Stop()
	secure, err := srv.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dsn, mode string
		want      string // "tls", "plain" or an error's text
	}{
		{plain, "", "plain"},
		{plain, "prefer", "plain"},
		{plain, "allow", "plain"},
		{plain, "disable", "plain"},
		{plain, "require", "SSL is not enabled on the server"},
		{secure, "", "tls"},
		{secure, "prefer", "tls"},
		{secure, "allow", "tls"},
		{secure, "require", "tls"},
		{secure, "disable", "no encryption"},
	} {
		name := "plain server"
		if c.dsn == secure {
			name = "TLS-only server"
		}
		t.Run(name+", sslmode="+c.mode, func(t *testing.T) {
			ssl, err := openOverTLS(t, withSSLMode(t, c.dsn, c.mode))
			got := map[bool]string{true: "tls", false: "plain"}[ssl]
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, c.want) {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
}

// prefer goes on in plaintext, on a new connection, when the server
// agreed to TLS and the handshake failed (as libpq's).
func TestPreferTLSFallsBackWhenTheHandshakeFails(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	go func() {
		defer server.Close()
		req := make([]byte, len(sslRequest))
		if _, err := io.ReadFull(server, req); err != nil || string(req) != string(sslRequest) {
			return
		}
		_, _ = server.Write([]byte("S"))
		hello := make([]byte, 64<<10)
		if _, err := server.Read(hello); err != nil { // the client's hello
			return
		}
		_, _ = server.Write([]byte("not a TLS server hello\n"))
	}()
	second, other := net.Pipe()
	defer second.Close()
	defer other.Close()
	got, err := preferTLS(context.Background(), client, &tls.Config{InsecureSkipVerify: true}, time.Minute,
		func() (net.Conn, error) { return second, nil })
	if err != nil || got != second {
		t.Fatalf("preferTLS = %v, %v; want the plaintext connection dialled again", got, err)
	}
}

// The DSN's timeouts are the driver's: they were overridden by the
// store's 5 s default, so connect_timeout=30 still gave up after 5 s.
func TestPostgresDSNTimeouts(t *testing.T) {
	for dsn, want := range map[string][3]time.Duration{
		"postgres://iop@db/iop": {5 * time.Second, 5 * time.Second, 5 * time.Second},
		"postgres://iop@db/iop?connect_timeout=30&read_timeout=1m":   {30 * time.Second, time.Minute, 5 * time.Second},
		"postgres://iop@db/iop?timeout=10s&sslmode=allow":            {10 * time.Second, 10 * time.Second, 10 * time.Second},
		"postgres://iop@db/iop?timeout=20&write_timeout=2s&sslmode=": {20 * time.Second, 20 * time.Second, 2 * time.Second},
	} {
		c, err := newPGConnector(dsn)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range c.attempts {
			conf := a.Config()
			if got := [3]time.Duration{conf.DialTimeout, conf.ReadTimeout, conf.WriteTimeout}; got != want {
				t.Errorf("%s: dial, read, write timeouts %v, want %v", dsn, got, want)
			}
		}
	}
}
