// Package pgtest starts throwaway PostgreSQL servers for tests: initdb into
// a temporary directory, pg_ctl on a free loopback port, removed at the
// end. When PostgreSQL's binaries are not installed, tests that need one
// skip and say why (.ci/run installs them, so CI always runs them).
package pgtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"
)

// ErrUnavailable is returned when no PostgreSQL binaries are installed.
var ErrUnavailable = errors.New("PostgreSQL binaries not found (apt-get install -y postgresql, or set IOP_PG_BIN)")

// Server is one running throwaway server. Its superuser is "iop", trusted
// on loopback only.
type Server struct {
	bin   string
	dir   string
	data  string
	port  int
	runAs string // "" when the current user may run PostgreSQL itself
	tls   bool   // TLS only: plaintext connections from TCP are refused

	mu      sync.Mutex
	running bool
}

// binDir finds initdb and pg_ctl: $IOP_PG_BIN, else the newest
// /usr/lib/postgresql/*/bin, else $PATH.
func binDir() (string, error) {
	if d := os.Getenv("IOP_PG_BIN"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", ErrUnavailable
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Options of a server.
type Options struct {
	// TLSOnly: the server has TLS (a self-signed certificate) and refuses
	// plaintext connections over TCP, as a pg_hba.conf of hostssl lines
	// does. Its DSNs ask for sslmode=require.
	TLSOnly bool
}

// Start initialises and starts a server. PostgreSQL refuses to run as
// root, so as root it runs as the "postgres" system user (which the Debian
// package creates).
func Start() (*Server, error) { return StartWith(Options{}) }

// StartWith is Start with options.
func StartWith(o Options) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, tls: o.TLSOnly}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("running as root needs the postgres system user: %w", err)
		}
		s.runAs = "postgres"
	}
	s.dir, err = os.MkdirTemp("", "iop-pg-")
	if err != nil {
		return nil, err
	}
	s.data = filepath.Join(s.dir, "data")
	if s.runAs != "" {
		if err := exec.Command("chown", s.runAs, s.dir).Run(); err != nil {
			_ = os.RemoveAll(s.dir)
			return nil, fmt.Errorf("chown %s: %w", s.dir, err)
		}
	}
	if out, err := s.command("initdb", "-D", s.data, "-A", "trust", "-U", "iop", "--no-sync", "-E", "UTF8").CombinedOutput(); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	if s.tls {
		if err := s.requireTLS(); err != nil {
			_ = os.RemoveAll(s.dir)
			return nil, err
		}
	}
	// Another process may take the free port before the server binds it:
	// try a few.
	for attempt := 0; ; attempt++ {
		if s.port, err = freePort(); err != nil {
			_ = os.RemoveAll(s.dir)
			return nil, err
		}
		if err = s.Resume(); err == nil {
			return s, nil
		}
		if attempt == 2 {
			_ = os.RemoveAll(s.dir)
			return nil, err
		}
	}
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, name)
	if s.runAs != "" {
		return exec.Command("runuser", append([]string{"-u", s.runAs, "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Resume starts the server (again) on its port.
func (s *Server) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return nil
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -c unix_socket_directories=%s -c fsync=off -c full_page_writes=off -c synchronous_commit=off", s.port, s.dir)
	out, err := s.command("pg_ctl", "start", "-w", "-t", "60", "-D", s.data, "-l", filepath.Join(s.dir, "log"), "-o", opts).CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		return fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, log)
	}
	s.running = true
	return nil
}

// Pause stops the server (fast shutdown: its clients are disconnected);
// Resume brings it back with its data.
func (s *Server) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return nil
	}
	out, err := s.command("pg_ctl", "stop", "-w", "-m", "fast", "-D", s.data).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v: %s", err, out)
	}
	s.running = false
	return nil
}

// Stop stops the server and removes its files.
func (s *Server) Stop() {
	_ = s.Pause()
	_ = os.RemoveAll(s.dir)
}

// DSN is the URL of database name on the server.
func (s *Server) DSN(name string) string {
	mode := "disable"
	if s.tls {
		mode = "require"
	}
	return fmt.Sprintf("postgres://iop@127.0.0.1:%d/%s?sslmode=%s", s.port, name, mode)
}

// requireTLS gives the server a self-signed certificate, turns TLS on and
// lets TCP clients in over TLS only.
func (s *Server) requireTLS() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"server.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"pg_hba.conf": []byte("local all all trust\n" +
			"hostssl all all 127.0.0.1/32 trust\n" +
			"hostnossl all all 127.0.0.1/32 reject\n"),
	}
	conf, err := os.OpenFile(filepath.Join(s.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = conf.WriteString("\nssl = on\n")
	if cerr := conf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	for name, b := range files {
		path := filepath.Join(s.data, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return err
		}
		if s.runAs != "" {
			if out, err := exec.Command("chown", s.runAs, path).CombinedOutput(); err != nil {
				return fmt.Errorf("chown %s: %v: %s", path, err, out)
			}
		}
	}
	return nil
}

// NewDatabase creates an empty database with a random name and returns its DSN.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	db := bun.NewDB(sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(s.DSN("postgres")), pgdriver.WithTimeout(10*time.Second))), pgdialect.New())
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	return s.DSN(name), nil
}

var (
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
)

// Shared returns the process's shared server, starting it on first use;
// call StopShared from TestMain after m.Run.
func Shared() (*Server, error) {
	sharedOnce.Do(func() { shared, sharedErr = Start() })
	return shared, sharedErr
}

// StopShared stops the shared server if one was started.
func StopShared() {
	if shared != nil {
		shared.Stop()
	}
}

// DSN returns a fresh database on the shared server, or skips t, saying
// why, when PostgreSQL is not installed. Any other failure to start fails t.
func DSN(t testing.TB) string {
	t.Helper()
	s, err := Shared()
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("skipping the PostgreSQL run: %v", err)
	}
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, err := s.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// Own starts a server of t's own (one the test may pause, resume or stop),
// stopped when t ends, and returns it with the DSN of a fresh database on
// it; it skips t, saying why, when PostgreSQL is not installed.
func Own(t testing.TB) (*Server, string) {
	t.Helper()
	s, err := Start()
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("skipping the PostgreSQL run: %v", err)
	}
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(s.Stop)
	dsn, err := s.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s, dsn
}
