package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"time"
)

// Defaults of the node-local config.
const (
	DefaultNodeEdge     = "127.0.0.1:7700"
	DefaultNodeDB       = "file:iop.db?cache=shared&mode=rwc"
	DefaultReconnectMin = 500 * time.Millisecond
	DefaultReconnectMax = 30 * time.Second
	// DefaultNodeStoreRetention is how long the node keeps a finished run
	// and an idle session, as the edge keeps its history.
	DefaultNodeStoreRetention = DefaultStoreRetention
	// MinNodeStoreRetention is the shortest positive store.retention the
	// node takes (Validate's error says "1h"): it prunes hourly, so a
	// shorter one would not be kept to.
	MinNodeStoreRetention = time.Hour
)

// NodeConfig holds the settings iop-node keeps locally; everything about
// adapters and providers comes from the edge at register time.
type NodeConfig struct {
	Edge      string          `yaml:"edge"`
	Token     Secret          `yaml:"token"`
	TokenEnv  string          `yaml:"token_env"`
	DB        string          `yaml:"db"`
	Log       LogConfig       `yaml:"log"`
	Reconnect ReconnectConfig `yaml:"reconnect"`
	Store     NodeStoreConfig `yaml:"store"`
	// TLS holds ca_pin, ca_file, insecure, cert and key, at the top level.
	TLS NodeTLS `yaml:",inline"`

	// src is the file the config was parsed from, so that Validate can name
	// the line of a value it refuses; nil for a config not from a file.
	src *nodeSource
}

// nodeSource is where a NodeConfig was read from: the file's name, the line
// of each key and the values as the file gave them (after defaults), to
// tell a value the file set from one a flag replaced since.
type nodeSource struct {
	name  string
	lines keyLines
	file  NodeConfig
}

// ReconnectConfig bounds the node's exponential reconnect backoff.
type ReconnectConfig struct {
	Min Duration `yaml:"min"`
	Max Duration `yaml:"max"`
}

// NodeStoreConfig is node.yaml's store: what the node keeps in its store (db).
type NodeStoreConfig struct {
	// Retention: finished runs that ended longer ago, and chat and agent
	// sessions idle longer, are pruned in the background (default 720h;
	// a negative value keeps everything).
	Retention Duration `yaml:"retention"`
}

// LoadNode reads and parses the node config at path without validating it,
// so that flags can still fill in fields (the token) before Validate. An
// empty path returns the defaults: the file is optional.
func LoadNode(path string) (*NodeConfig, error) {
	if path == "" {
		c := &NodeConfig{}
		c.SetDefaults()
		return c, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read node config: %w", err)
	}
	return ParseNode(path, data)
}

// ParseNode decodes data strictly and applies defaults; it checks field names
// and types but not values, which is Validate's job. name prefixes errors.
func ParseNode(name string, data []byte) (*NodeConfig, error) {
	var c NodeConfig
	if err := decodeStrict(name, data, &c); err != nil {
		return nil, err
	}
	c.SetDefaults()
	c.src = &nodeSource{name: name, lines: indexLines(data), file: c}
	return &c, nil
}

// SetDefaults fills every unset (zero) field with its default.
func (c *NodeConfig) SetDefaults() {
	if c.Edge == "" {
		c.Edge = DefaultNodeEdge
	}
	if c.DB == "" {
		c.DB = DefaultNodeDB
	}
	if c.Reconnect.Min == 0 {
		c.Reconnect.Min = Duration(DefaultReconnectMin)
	}
	if c.Reconnect.Max == 0 {
		c.Reconnect.Max = Duration(DefaultReconnectMax)
	}
	if c.Store.Retention == 0 {
		c.Store.Retention = Duration(DefaultNodeStoreRetention)
	}
	c.Log.SetDefaults()
}

// Validate checks the values, that a token can be resolved and that exactly
// one way to trust the edge is set, reporting every problem found, one per
// line. A problem with a value the config file set (and no flag replaced)
// starts "FILE: line N: ". The error matches ErrNoTrust (errors.Is) when no
// trust option is set.
func (c *NodeConfig) Validate() error {
	var errs []error
	if err := checkHostPort("edge", c.Edge, false); err != nil {
		errs = append(errs, err)
	} else if host, _, _ := net.SplitHostPort(c.Edge); host == "" && c.TLS.CAFile != "" {
		// A CA bundle checks the edge's certificate against the name
		// dialled; with none, every handshake fails, retried for ever.
		errs = append(errs, at(fmt.Errorf("edge %q names no host, which ca_file needs to check the edge's certificate against (as in 127.0.0.1%s)", c.Edge, c.Edge), "edge", "ca_file"))
	}
	if _, err := c.ResolveToken(); err != nil {
		errs = append(errs, at(err, "token", "token_env"))
	}
	if c.DB == "" {
		errs = append(errs, atf("db", "db must not be empty"))
	}
	errs = appendFlat(errs, c.Log.Validate())
	errs = appendFlat(errs, c.TLS.validate())
	if c.Reconnect.Min <= 0 {
		errs = append(errs, atf("reconnect.min", "reconnect.min must be positive, got %s", c.Reconnect.Min))
	}
	if c.Reconnect.Max < c.Reconnect.Min {
		errs = append(errs, at(fmt.Errorf("reconnect.max (%s) must not be less than reconnect.min (%s)", c.Reconnect.Max, c.Reconnect.Min), "reconnect.max", "reconnect.min"))
	}
	if r := c.Store.Retention; r > 0 && r.Std() < MinNodeStoreRetention {
		errs = append(errs, atf("store.retention", "store.retention must be at least 1h (the store is pruned hourly), or negative to keep everything; got %s", r))
	}
	err := errors.Join(errs...)
	if c.src == nil {
		return err
	}
	return locate(c.src.name, c.src.lines, err, c.fromFile, false)
}

// fromFile reports whether the value at path is still the one the config
// file gave it: a flag may have replaced it since, and then the file's line
// is not where the problem is.
func (c *NodeConfig) fromFile(path string) bool {
	now, ok := fieldByPath(reflect.ValueOf(c).Elem(), path)
	if !ok {
		return false
	}
	was, _ := fieldByPath(reflect.ValueOf(&c.src.file).Elem(), path)
	return reflect.DeepEqual(now.Interface(), was.Interface())
}

// ResolveToken returns Token if set, else the value of the environment
// variable TokenEnv. Token wins when both are set, so a --token flag copied
// into Token overrides a token_env from the file. Errors never contain the token.
func (c *NodeConfig) ResolveToken() (string, error) {
	switch {
	case c.Token != "":
		return string(c.Token), nil
	case c.TokenEnv != "":
		v := os.Getenv(c.TokenEnv)
		if v == "" {
			return "", unsetEnvError("token_env", c.TokenEnv, "token")
		}
		return v, nil
	default:
		return "", errors.New("a token is required: pass --token, set $IOP_NODE_TOKEN, or set token or token_env in the node config")
	}
}
