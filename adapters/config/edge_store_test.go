package config_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/adapters/config"
)

const storeNodes = "\nnodes:\n  - {id: n1, token: store-test-token}\n"

func TestStoreDefaultsNextToTheConfig(t *testing.T) {
	dir := t.TempDir()
	c, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte(storeNodes))
	if err != nil {
		t.Fatal(err)
	}
	if c.StateDir != filepath.Join(dir, "edge-state") || c.Store.DSN != filepath.Join(dir, "edge-state", "edge.db") {
		t.Fatalf("state_dir %q, store.dsn %q", c.StateDir, c.Store.DSN)
	}
	if c.Store.Retention.Std() != 30*24*time.Hour || !c.Log.AccessLog() || c.Metrics.Listen != "" {
		t.Fatalf("defaults: retention %s, access %v, metrics %q", c.Store.Retention, c.Log.AccessLog(), c.Metrics.Listen)
	}
}

func TestStoreSettings(t *testing.T) {
	dir := t.TempDir()
	c, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte(`
state_dir: st
store: {dsn: "postgres://iop:pw@db:5432/iop?sslmode=disable", retention: 48h, edge_id: e1}
metrics: {listen: "127.0.0.1:9100"}
log: {access: false}`+storeNodes))
	if err != nil {
		t.Fatal(err)
	}
	if c.StateDir != filepath.Join(dir, "st") || !strings.HasPrefix(c.Store.DSN, "postgres://") || c.Store.Retention.Std() != 48*time.Hour ||
		c.Store.EdgeID != "e1" || c.Metrics.Listen != "127.0.0.1:9100" || c.Log.AccessLog() {
		t.Fatalf("parsed %+v %+v %+v", c.Store, c.Metrics, c.Log)
	}
	if got := c.StoreDSNForLog(); strings.Contains(got, "pw") {
		t.Fatalf("DSN for logs holds the password: %s", got)
	}
	c, err = config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte("store: {dsn: rel/h.db}"+storeNodes))
	if err != nil || c.Store.DSN != filepath.Join(dir, "rel", "h.db") {
		t.Fatalf("relative sqlite path: %q %v", c.Store.DSN, err)
	}
}

func TestStoreSettingsRefused(t *testing.T) {
	for name, yaml := range map[string]string{
		"mysql dsn":       "store: {dsn: \"mysql://x\"}",
		"bad metrics":     "metrics: {listen: \"nope\"}",
		"unknown key":     "store: {dsn: a.db, colour: red}",
		"bad retention":   "store: {retention: soon}",
		"access not bool": "log: {access: maybe}",
	} {
		if _, err := config.ParseEdge(filepath.Join(t.TempDir(), "edge.yaml"), []byte(yaml+storeNodes)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A PostgreSQL DSN the driver cannot use is refused when the config is
// read, naming what is wrong and never quoting the DSN or its password
// (url.Parse's error quotes the whole URL).
func TestStorePostgresDSNRefusedWithoutThePassword(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ name, dsn, want string }{
		{"bad escape", "postgres://iop:s3cr%zzPW@127.0.0.1:1/iop", "percent-encode"},
		{"space in host", "postgres://iop:s3cretPW@db host/iop", "not a valid URL"},
		{"no user", "postgres://:s3cretPW@127.0.0.1:1/iop", "user"},
		{"unknown sslmode", "postgres://iop:s3cretPW@127.0.0.1:1/iop?sslmode=maybe", `sslmode "maybe"`},
		{"bad timeout", "postgres://iop:s3cretPW@127.0.0.1:1/iop?connect_timeout=soon", "connect_timeout"},
		// pgdriver takes none of these: it sent each as a setting (SET
		// password TO '…'), connected as the default user, and the start
		// error printed the whole DSN.
		{"password parameter", "postgres://db/iop?user=iop&password=s3cretPW&sslmode=disable", "password parameter is not supported: give it in the URL's user part"},
		{"sslpassword parameter", "postgres://iop@db/iop?sslpassword=s3cretPW", "sslpassword parameter is not supported"},
		{"user parameter", "postgres://db/iop?user=iop", "user parameter is not supported"},
		{"dbname parameter", "postgres://iop@db?dbname=iop", "dbname parameter is not supported"},
		{"port parameter", "postgres://iop@db/iop?port=5433", "port parameter is not supported"},
		// A password whose '/', '?' or '#' is not percent-encoded ends
		// the host early (here "iop:" or "iop:2024"): the rest of it was
		// read as the path, query or fragment, and the start error showed
		// it whole.
		{"unescaped slash", "postgres://iop:/s3cretPW@127.0.0.1:1/iop", "percent-encode"},
		{"unescaped question mark", "postgres://iop:2024?s3cretPW@127.0.0.1:1/iop", "percent-encode"},
		{"unescaped hash", "postgres://iop:2024#s3cretPW@127.0.0.1:1/iop", "percent-encode"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte("store: {dsn: \""+c.dsn+"\"}"+storeNodes))
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if !strings.Contains(msg, c.want) || strings.Contains(msg, "s3cr") || strings.Contains(msg, "PW") {
				t.Fatalf("error %q: want %q in it and no password", msg, c.want)
			}
		})
	}
	// What the driver takes is accepted; files it names are read at open
	// (see edgestore's TestOpenBadPostgresDSNFailsWithoutThePassword).
	for _, dsn := range []string{
		"postgres://iop:s3cr%25PW@db/iop?sslmode=verify-full",
		"postgresql://iop@db:5432/iop?sslmode=verify-ca&sslrootcert=/nowhere.pem&connect_timeout=5",
		"postgres://iop:pw@/iop?host=/run/postgresql",
	} {
		if _, err := config.ParseEdge(filepath.Join(dir, "edge.yaml"), []byte("store: {dsn: \""+dsn+"\"}"+storeNodes)); err != nil {
			t.Errorf("%s: %v", dsn, err)
		}
	}
}

// The DSN in logs and start errors shows how the edge connects and none of
// its secrets: a password in the user part, any query value not known to
// be harmless (a password= parameter, an unknown one), a fragment.
func TestStoreDSNForLog(t *testing.T) {
	for _, c := range []struct{ dsn, want string }{
		{"postgres://iop:s3cret@db:5432/iop?sslmode=require", "postgres://iop:***@db:5432/iop?sslmode=require"},
		{"postgresql://iop@db/iop", "postgresql://iop@db/iop"},
		{"postgres://db/iop?user=iop&password=s3cret&sslmode=disable", "postgres://db/iop?user=***&password=***&sslmode=disable"},
		{"postgres://iop:p%40ss@db/iop?sslmode=verify-full&sslrootcert=/etc/ca.pem&connect_timeout=5&application_name=edge",
			"postgres://iop:***@db/iop?sslmode=verify-full&sslrootcert=/etc/ca.pem&connect_timeout=5&application_name=edge"},
		{"postgres://iop@db/iop?search_path=s3cret&options=-c%20x%3Ds3cret", "postgres://iop@db/iop?search_path=***&options=***"},
		{"postgres://iop@db/iop?sslmode=disable#s3cret", "postgres://iop@db/iop?sslmode=disable#***"},
		{"postgres://iop:s3cr%zz@db/iop", "postgres://*** (not a valid URL)"},
		{"postgres://iop:/s3cret@db/iop", "postgres://*** (not a valid URL)"},
		{"postgres://iop:2024?s3cret@db/iop", "postgres://*** (not a valid URL)"},
		{"postgres://iop:2024/s3cret@db/iop", "postgres://*** (not a valid URL)"},
		{"/var/lib/iop/edge.db", "/var/lib/iop/edge.db"},
	} {
		c0 := config.EdgeConfig{Store: config.StoreConfig{DSN: c.dsn}}
		if got := c0.StoreDSNForLog(); got != c.want || strings.Contains(got, "s3cr") {
			t.Errorf("StoreDSNForLog(%s) = %s, want %s", c.dsn, got, c.want)
		}
	}
}

// The edge prunes its history hourly, so a store.retention under an hour
// was accepted and not kept to (30m kept rows up to 1h30m). It is refused
// as the node refuses its own, on its line; 1h, and a negative retention
// (keep everything), load.
func TestStoreRetentionUnderAnHourRefused(t *testing.T) {
	for _, r := range []string{"30m", "1s", "59m59s"} {
		_, err := config.ParseEdge("edge.yaml", []byte("store:\n  retention: "+r+storeNodes))
		if err == nil || !strings.Contains(err.Error(), "edge.yaml: line 2: store.retention must be at least 1h (the history is pruned hourly), or negative to keep everything") {
			t.Errorf("retention %s: %v", r, err)
		}
	}
	for _, r := range []string{"1h", "-1s", "0s"} {
		if _, err := config.ParseEdge("edge.yaml", []byte("store:\n  retention: "+r+storeNodes)); err != nil {
			t.Errorf("retention %s: %v", r, err)
		}
	}
}
