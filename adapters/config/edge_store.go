package config

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultStoreRetention is how long the edge keeps run and tunnel history.
const DefaultStoreRetention = 30 * 24 * time.Hour

// MinStoreRetention is the shortest positive store.retention the edge
// takes (validateStore's error says "1h"): it prunes hourly, so a shorter
// one would not be kept to (30m would keep rows up to 1h30m), as the
// node's MinNodeStoreRetention.
const MinStoreRetention = time.Hour

// StoreConfig is edge.yaml's store: the edge's durable run and usage history.
type StoreConfig struct {
	// DSN is a postgres:// URL, or an SQLite file path (relative to the
	// config file's directory); default "edge.db" in state_dir.
	DSN string `yaml:"dsn"`
	// Retention: older rows are pruned in the background (default 720h;
	// a negative value keeps everything).
	Retention Duration `yaml:"retention"`
	// EdgeID is written on every row, so edges sharing a database can be
	// told apart; default the host name. On PostgreSQL an edge repairs and
	// ends only the running rows of its own id (domain.RunQuery.Own).
	EdgeID string `yaml:"edge_id"`
}

// MetricsConfig is edge.yaml's metrics.
type MetricsConfig struct {
	// Listen, if set, serves GET /metrics alone on this address (besides
	// the HTTP API's own /metrics).
	Listen string `yaml:"listen"`
}

// resolveStore fills the default store file in state_dir (which
// resolvePaths has resolved) and makes a relative SQLite path relative to
// the config file.
func (c *EdgeConfig) resolveStore(configPath string) {
	base := filepath.Dir(configPath)
	switch {
	case c.Store.DSN == "":
		c.Store.DSN = filepath.Join(c.StateDir, "edge.db")
	case strings.Contains(c.Store.DSN, "://"), strings.HasPrefix(c.Store.DSN, "file:"), strings.Contains(c.Store.DSN, ":memory:"):
	case !filepath.IsAbs(c.Store.DSN):
		c.Store.DSN = filepath.Join(base, c.Store.DSN)
	}
}

// IsPostgresDSN reports whether dsn selects PostgreSQL.
func IsPostgresDSN(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

func (c *EdgeConfig) validateStore() error {
	var errs []error
	if strings.Contains(c.Store.DSN, "://") && !IsPostgresDSN(c.Store.DSN) {
		errs = append(errs, atf("store.dsn", "store.dsn: only postgres:// URLs or SQLite file paths are supported"))
	}
	if IsPostgresDSN(c.Store.DSN) {
		if err := checkPostgresDSN(c.Store.DSN); err != nil {
			errs = append(errs, at(err, "store.dsn"))
		}
	}
	if r := c.Store.Retention; r > 0 && r.Std() < MinStoreRetention {
		errs = append(errs, atf("store.retention", "store.retention must be at least 1h (the history is pruned hourly), or negative to keep everything; got %s", r))
	}
	if c.Metrics.Listen != "" {
		if err := checkHostPort("metrics.listen", c.Metrics.Listen, true); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkPostgresDSN refuses a postgres:// DSN the driver (pgdriver) would
// panic on when the edge opens it, a panic that prints the DSN, password
// included. Its errors never quote the DSN: url.Parse's error does, so it
// is replaced by a hint. Files the DSN names (sslrootcert, sslcert,
// sslkey) are read when the store opens, like the config's other files,
// not here: edgestore.Open turns the driver's panic over them into an error.
func checkPostgresDSN(dsn string) error {
	u, err := url.Parse(dsn)
	if err != nil {
		return errors.New("store.dsn is not a valid URL: percent-encode special characters in the user name and password " +
			"(% as %25, @ as %40, : as %3A, / as %2F, # as %23, ? as %3F, a space as %20) and check the host")
	}
	if u.User != nil && u.User.Username() == "" {
		return errors.New("store.dsn has no user name before the '@'")
	}
	if strayAt(u, dsn) {
		return errors.New("store.dsn has an '@' that is not after a user part: a password holding '/', '?' or '#' ends the host there, " +
			"so percent-encode them (/ as %2F, ? as %3F, # as %23; an '@' in a parameter as %40)")
	}
	q := u.Query()
	// libpq's connection parameters pgdriver does not take: it sends each
	// as a setting (SET password TO '…', which the server refuses and may
	// log, password and all), and connects as the default user to the
	// default database.
	for _, p := range []struct{ key, hint string }{
		{"password", "give it in the URL's user part, postgres://user:password@host/db (percent-encoded)"},
		{"sslpassword", "an encrypted sslkey is not supported: give an unencrypted key file only the edge's user can read"},
		{"user", "give it in the URL's user part, postgres://user:password@host/db"},
		{"dbname", "give it as the URL's path, postgres://user@host/dbname"},
		{"port", "give it with the host, postgres://user@host:port/db"},
	} {
		if q.Has(p.key) {
			return fmt.Errorf("store.dsn: the %s parameter is not supported: %s", p.key, p.hint)
		}
	}
	mode := q.Get("sslmode")
	switch mode {
	case "", "disable", "allow", "prefer", "require", "verify-ca", "verify-full": // what pgdriver knows
	default:
		return fmt.Errorf("store.dsn: sslmode %q is not one of disable, allow, prefer, require, verify-ca, verify-full", mode)
	}
	for _, k := range []string{"timeout", "dial_timeout", "connect_timeout", "read_timeout", "write_timeout"} {
		v := q.Get(k)
		if v == "" {
			continue
		}
		if _, err := strconv.Atoi(v); err == nil {
			continue
		}
		if _, err := time.ParseDuration(v); err != nil {
			return fmt.Errorf("store.dsn: %s %q is neither seconds nor a duration such as 5s", k, v)
		}
	}
	return nil
}

// strayAt reports whether dsn, parsed as u, has no user part yet holds an
// '@': a password with an unescaped '/', '?' or '#' that ends the URL's
// host early ("postgres://iop:/s3cret@db/iop" is the host "iop:" and the
// path "/s3cret@db/iop"), so the password would be read, and shown, as the
// DSN's path, query or fragment.
func strayAt(u *url.URL, dsn string) bool {
	return u.User == nil && strings.Contains(dsn, "@")
}

// StoreDSNForLog is store.dsn without a password, for logs and errors:
// the password of its user part, the value of every query parameter but
// those known to hold none (logDSNParams) and any fragment are ***. A DSN
// that is not a URL is hidden whole.
func (c *EdgeConfig) StoreDSNForLog() string {
	d := c.Store.DSN
	if !IsPostgresDSN(d) {
		return d
	}
	u, err := url.Parse(d)
	if err != nil || strayAt(u, d) {
		return "postgres://*** (not a valid URL)"
	}
	var b strings.Builder
	b.WriteString(u.Scheme + "://")
	if u.User != nil {
		b.WriteString(url.User(u.User.Username()).String())
		if _, ok := u.User.Password(); ok {
			b.WriteString(":***")
		}
		b.WriteString("@")
	}
	b.WriteString(u.Host)
	b.WriteString(u.EscapedPath())
	if u.RawQuery != "" || u.ForceQuery {
		b.WriteString("?")
		for i, kv := range strings.Split(u.RawQuery, "&") {
			if i > 0 {
				b.WriteString("&")
			}
			k, _, hasValue := strings.Cut(kv, "=")
			if key, err := url.QueryUnescape(k); err == nil && logDSNParams[key] || !hasValue {
				b.WriteString(kv)
			} else {
				b.WriteString(k + "=***")
			}
		}
	}
	if u.Fragment != "" {
		b.WriteString("#***")
	}
	return b.String()
}

// logDSNParams are the DSN's query parameters whose values StoreDSNForLog
// shows: how to connect, never a secret (a key file's path, not the key).
var logDSNParams = map[string]bool{
	"sslmode": true, "sslrootcert": true, "sslcert": true, "sslkey": true, "host": true, "application_name": true,
	"timeout": true, "dial_timeout": true, "connect_timeout": true, "read_timeout": true, "write_timeout": true,
}
