package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"iop/domain"
)

// Duration is a time.Duration written in YAML as a Go duration string
// ("30s", "1m30s", "0s"). A bare number other than 0 is refused because its
// unit would be a guess.
type Duration time.Duration

// UnmarshalYAML reports a malformed duration as a type error so that yaml.v3
// keeps its line number and collects it with the file's other errors.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: a duration must be a string such as \"30s\"", n.Line)}}
	}
	v, err := ParseDuration(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*d = Duration(v)
	return nil
}

// ParseDuration reads v as a config file's duration is read: Go syntax
// with a unit. Its error is the one message for a malformed duration,
// whether it came from a file, a flag or an environment variable; a bare
// number is refused saying a unit is needed (its unit would be a guess).
func ParseDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (use Go syntax with a unit, such as \"500ms\", \"30s\", \"1m\")", v)
	}
	return d, nil
}

// MarshalYAML writes the duration in the same syntax UnmarshalYAML reads.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

const redacted = "[redacted]"

// Secret is a string that is never printed: fmt (every verb), encoding/json,
// yaml.v3 and log/slog all render it as "[redacted]". Convert it with
// string(s) where the value itself is needed.
type Secret string

// Format implements fmt.Formatter so that no verb, not even %#v or %x, shows the value.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, s.mask()) }

// MarshalText keeps the value out of JSON, YAML and text log output.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.mask()), nil }

// LogValue keeps the value out of log/slog output.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.mask()) }

func (s Secret) mask() string {
	if s == "" {
		return ""
	}
	return redacted
}

// unsetEnvError is the error for a *_env key (key, token_env, key_env) whose
// variable is unset or empty. It names the variable only when name has the
// shape of one, upper-case letters, digits and '_' (IOP_NODE_TOKEN), and is
// not a run of 16 or more hex digits: pasting the secret itself into the
// *_env key (token_env: 9f86d0…, key_env: sk-…) is an easy slip, and the
// message reaches stderr, the log and POST /v1/admin/reload's answer. what
// names the secret ("token", "key").
func unsetEnvError(key, name, what string) error {
	if domain.ConventionalEnvName(name) {
		return fmt.Errorf("%s: environment variable %s is unset or empty", key, name)
	}
	return fmt.Errorf("%s: the environment variable it names is unset or empty %s", key, NameNotShown(key, what))
}

// NameNotShown says why the value of *_env key key is not quoted: it is no
// domain.ConventionalEnvName, and may be the secret (what: "token", "key") itself.
func NameNotShown(key, what string) string {
	return fmt.Sprintf("(the name is not shown: it is not an upper-case variable name such as IOP_NODE_TOKEN, "+
		"and may be the %s itself; %s takes the name of a variable that holds it)", what, key)
}

// Log levels and formats accepted in log.level and log.format.
const (
	LogDebug = "debug"
	LogInfo  = "info"
	LogWarn  = "warn"
	LogError = "error"

	LogText = "text"
	LogJSON = "json"
)

// LogConfig selects the log level and output format of a binary.
type LogConfig struct {
	Level  string `yaml:"level"`  // debug|info|warn|error; default info
	Format string `yaml:"format"` // text|json; default text
	// Access turns the edge's per-request access log (info) on or off;
	// default on.
	Access *bool `yaml:"access"`
}

// AccessLog reports whether access logging is on (the default).
func (l LogConfig) AccessLog() bool { return l.Access == nil || *l.Access }

// SetDefaults fills unset fields.
func (l *LogConfig) SetDefaults() {
	if l.Level == "" {
		l.Level = LogInfo
	}
	if l.Format == "" {
		l.Format = LogText
	}
}

// Validate reports an unknown level or format.
func (l LogConfig) Validate() error {
	var errs []error
	if _, ok := slogLevels[l.Level]; !ok {
		errs = append(errs, atf("log.level", "log.level %q is not one of debug, info, warn, error", l.Level))
	}
	if l.Format != LogText && l.Format != LogJSON {
		errs = append(errs, atf("log.format", "log.format %q is not one of text, json", l.Format))
	}
	return errors.Join(errs...)
}

// SlogLevel returns the slog level for Level; an invalid level maps to info.
func (l LogConfig) SlogLevel() slog.Level { return slogLevels[l.Level] }

var slogLevels = map[string]slog.Level{
	LogDebug: slog.LevelDebug,
	LogInfo:  slog.LevelInfo,
	LogWarn:  slog.LevelWarn,
	LogError: slog.LevelError,
}

// decodeStrict decodes exactly one YAML document from data into out, refusing
// unknown fields. An empty document leaves out untouched, so that an empty
// file means "all defaults".
func decodeStrict(name string, data []byte, out any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return yamlError(name, data, err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return yamlError(name, data, err)
	case isEmptyDocument(&extra):
		return nil
	default:
		return fmt.Errorf("%s: line %d: a second YAML document is not allowed", name, extra.Line)
	}
}

func isEmptyDocument(n *yaml.Node) bool {
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	return n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// yamlError rewrites yaml.v3 errors as "name: line N: problem", one line per
// problem, dropping yaml's own "yaml: unmarshal errors:" preamble.
func yamlError(name string, data []byte, err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		lines := make([]string, len(te.Errors))
		for i, e := range te.Errors {
			lines[i] = name + ": " + userMessage(data, e)
		}
		return errors.New(strings.Join(lines, "\n"))
	}
	if lines := unquotedAddrErrors(data, err); lines != nil {
		for i, l := range lines {
			lines[i] = name + ": " + l
		}
		return errors.New(strings.Join(lines, "\n"))
	}
	return fmt.Errorf("%s: %s", name, userMessage(data, strings.TrimPrefix(err.Error(), "yaml: ")))
}

// appendFlat appends err to errs, splicing in the errors it joins so that a
// list of problems stays one level deep.
func appendFlat(errs []error, err error) []error {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		return append(errs, joined.Unwrap()...)
	}
	if err != nil {
		errs = append(errs, err)
	}
	return errs
}

// checkHostPort accepts "host:port" and ":port" with a numeric port; port 0
// is accepted only when allowZero (a listener picking a free port). The
// error is about the value at field.
func checkHostPort(field, addr string, allowZero bool) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return atf(field, "%s %q is not host:port: %w%s", field, addr, unwrapAddrErr(err), ipv6Hint(addr))
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return atf(field, "%s %q: port %q is not a number from 0 to 65535", field, addr, port)
	}
	if n == 0 && !allowZero {
		return atf(field, "%s %q: port must not be 0", field, addr)
	}
	return nil
}

// ipv6Hint explains, for an address with an IPv6 host outside brackets
// ("::1:7700"), how to write it; "" for any other address.
func ipv6Hint(addr string) string {
	if strings.Count(addr, ":") < 2 || strings.HasPrefix(addr, "[") {
		return ""
	}
	if i := strings.LastIndex(addr, ":"); i > 0 && net.ParseIP(addr[:i]) != nil {
		if _, err := strconv.ParseUint(addr[i+1:], 10, 16); err == nil {
			return fmt.Sprintf(" (an IPv6 address goes in brackets, and in YAML in quotes: \"[%s]:%s\")", addr[:i], addr[i+1:])
		}
	}
	return " (an IPv6 address goes in brackets before the port, and in YAML in quotes, as in \"[::1]:7700\")"
}

// listenAddr is a listen setting: its key and its host:port ("" unset).
type listenAddr struct{ key, addr string }

// listenClashes refuses two listen settings that would bind the same port
// on a host both cover: the second listener to bind failed the start as
// "in use by another process (is another instance running?)". A host left
// empty or unspecified (":9000", "0.0.0.0:9000", "[::]:9000") covers every
// host, and localhost is 127.0.0.1; port 0 (the kernel's choice) never
// clashes. Unset and malformed settings are left to their own checks.
func listenClashes(addrs ...listenAddr) []error {
	var errs []error
	for i, a := range addrs {
		for _, b := range addrs[i+1:] {
			if !listenOverlap(a.addr, b.addr) {
				continue
			}
			if a.addr == b.addr {
				errs = append(errs, at(fmt.Errorf("%s and %s are both %q; they need different ports", b.key, a.key, a.addr), b.key, a.key))
			} else {
				errs = append(errs, at(fmt.Errorf("%s %q and %s %q bind the same port on the same host; they need different ports", b.key, b.addr, a.key, a.addr), b.key, a.key))
			}
		}
	}
	return errs
}

func listenOverlap(a, b string) bool {
	ha, pa, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	hb, pb, err := net.SplitHostPort(b)
	if err != nil || pa != pb || pa == "0" {
		return false
	}
	wild := func(h string) bool { ip := net.ParseIP(h); return h == "" || ip != nil && ip.IsUnspecified() }
	norm := func(h string) string {
		if strings.EqualFold(h, "localhost") {
			return "127.0.0.1"
		}
		if ip := net.ParseIP(h); ip != nil {
			return ip.String()
		}
		return strings.ToLower(h)
	}
	return wild(ha) || wild(hb) || norm(ha) == norm(hb)
}

// unwrapAddrErr drops net.AddrError's repetition of the address.
func unwrapAddrErr(err error) error {
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return errors.New(ae.Err)
	}
	return err
}
