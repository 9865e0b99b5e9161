package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"iop/adapters/tlsca"
)

// Modes of transport.tls.mode.
const (
	TLSAuto  = "auto"  // the edge's own CA and certificate in state_dir (default)
	TLSFiles = "files" // an operator's cert_file and key_file
	TLSOff   = "off"   // plaintext, only on a loopback listen address
)

// LinkTLS is transport.tls in edge.yaml: how the node link is secured.
type LinkTLS struct {
	Mode     string `yaml:"mode"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// Hosts are extra DNS names or IPs (public names, NAT addresses) the
	// auto-mode certificate covers, besides the listen host and loopback.
	Hosts []string `yaml:"hosts"`
	// ClientCAFile, when set, makes a client certificate from these CAs
	// mandatory for every node (mTLS).
	ClientCAFile string `yaml:"client_ca_file"`
	// BindNodeIdentity requires the client certificate's CN or one of its
	// DNS SANs to equal the id of the node the token belongs to.
	BindNodeIdentity bool `yaml:"bind_node_identity"`
}

var dnsNamePattern = regexp.MustCompile(`^(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`)

func (l LinkTLS) validate(listen string) error {
	var errs []error
	add := func(paths []string, format string, args ...any) {
		errs = append(errs, at(fmt.Errorf(format, args...), paths...))
	}
	const (
		mode     = "transport.tls.mode"
		certFile = "transport.tls.cert_file"
		keyFile  = "transport.tls.key_file"
		clientCA = "transport.tls.client_ca_file"
		hosts    = "transport.tls.hosts"
	)
	switch l.Mode {
	case TLSAuto:
		if l.CertFile != "" || l.KeyFile != "" {
			add([]string{certFile, keyFile}, "transport.tls.cert_file and key_file are used only with mode: files (mode is auto)")
		}
	case TLSFiles:
		if l.CertFile == "" || l.KeyFile == "" {
			add([]string{mode}, "transport.tls.mode files needs both cert_file and key_file")
		}
		if len(l.Hosts) > 0 {
			add([]string{hosts}, "transport.tls.hosts is used only with mode: auto (in files mode the certificate names its hosts)")
		}
	case TLSOff:
		if !IsLoopbackListen(listen) {
			add([]string{mode, "transport.listen"}, "transport.tls.mode off sends node tokens and all run data in clear; it is allowed only when transport.listen is a loopback address, and %q is not (use mode: auto)", listen)
		}
		if l.CertFile != "" || l.KeyFile != "" || l.ClientCAFile != "" || len(l.Hosts) > 0 {
			add([]string{certFile, keyFile, clientCA, hosts}, "transport.tls: cert_file, key_file, client_ca_file and hosts need TLS (mode is off)")
		}
	default:
		add([]string{mode}, "transport.tls.mode %q is not one of auto, files, off", l.Mode)
	}
	if l.BindNodeIdentity && l.ClientCAFile == "" {
		add([]string{"transport.tls.bind_node_identity"}, "transport.tls.bind_node_identity needs client_ca_file (node identities come from client certificates)")
	}
	for i, h := range l.Hosts {
		if net.ParseIP(h) == nil && !dnsNamePattern.MatchString(h) {
			add([]string{fmt.Sprintf("%s[%d]", hosts, i)}, "transport.tls.hosts: %q is neither an IP address nor a DNS name", h)
		}
	}
	return errors.Join(errs...)
}

// IsLoopbackListen reports whether addr's host is a loopback address or
// "localhost"; an empty host (all interfaces) is not.
func IsLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// resolvePaths fills the default state_dir and makes relative paths in the
// file relative to the file's directory rather than to the process's.
func (c *EdgeConfig) resolvePaths(configPath string) {
	base := filepath.Dir(configPath)
	rel := func(p *string) {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(base, *p)
		}
	}
	rel(&c.StateDir)
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir(configPath)
	}
	rel(&c.Transport.TLS.CertFile)
	rel(&c.Transport.TLS.KeyFile)
	rel(&c.Transport.TLS.ClientCAFile)
	if c.HTTP.TLS != nil {
		rel(&c.HTTP.TLS.CertFile)
		rel(&c.HTTP.TLS.KeyFile)
	}
}

// DefaultStateDir is the state_dir of an edge config that names none:
// "<config name>-state" beside the config file.
func DefaultStateDir(configPath string) string {
	name := strings.TrimSuffix(filepath.Base(configPath), filepath.Ext(configPath))
	return filepath.Join(filepath.Dir(configPath), name+"-state")
}

// TLSDir is where auto mode keeps the node-link CA and certificate.
func (c *EdgeConfig) TLSDir() string { return filepath.Join(c.StateDir, "tls") }

// certHostName is h as a certificate name: lower case, without a final dot.
func certHostName(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// CertHosts lists the names the auto-mode server certificate covers: the
// listen host (or, listening on all interfaces, this machine's hostname and
// interface addresses), loopback, and transport.tls.hosts.
func (c *EdgeConfig) CertHosts() []string {
	seen := map[string]bool{}
	var out []string
	add := func(h string) {
		h = certHostName(h)
		if h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	for _, h := range c.Transport.TLS.Hosts {
		add(h)
	}
	host, _, _ := net.SplitHostPort(c.Transport.Listen)
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if hn, err := os.Hostname(); err == nil {
			add(hn)
		}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
					add(ipn.IP.String())
				}
			}
		}
	} else {
		add(host)
	}
	for _, h := range []string{"localhost", "127.0.0.1", "::1"} {
		add(h)
	}
	return out
}

// NodeTLS is the node's side of the link's security: flags and node.yaml keys.
type NodeTLS struct {
	// CAPin is "sha256:<hex>" of a public key in the edge's chain (iop-edge
	// --print-ca-pin).
	CAPin string `yaml:"ca_pin"`
	// CAFile is a PEM bundle the edge's certificate must chain to.
	CAFile string `yaml:"ca_file"`
	// Insecure speaks plaintext, for an edge with transport.tls.mode off.
	Insecure bool `yaml:"insecure"`
	// Cert and Key are the node's client certificate for an mTLS edge.
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// ErrNoTrust is returned when a node is given no way to trust its edge.
var ErrNoTrust = errors.New("no way to trust the edge: pass --ca-pin sha256:<hex> (print it on the edge with iop-edge --config edge.yaml --print-ca-pin), " +
	"--ca-file <PEM bundle>, or --insecure for an edge whose transport.tls.mode is off")

func (n NodeTLS) validate() error {
	var errs []error
	set := 0
	for _, on := range []bool{n.CAPin != "", n.CAFile != "", n.Insecure} {
		if on {
			set++
		}
	}
	switch {
	case set == 0:
		errs = append(errs, ErrNoTrust)
	case set > 1:
		errs = append(errs, at(errors.New("set only one of ca_pin, ca_file and insecure"), "ca_pin", "ca_file", "insecure"))
	}
	if n.CAPin != "" {
		if _, err := tlsca.ParsePin(n.CAPin); err != nil {
			errs = append(errs, at(fmt.Errorf("ca_pin: %w", err), "ca_pin"))
		}
	}
	if (n.Cert == "") != (n.Key == "") {
		errs = append(errs, at(errors.New("cert and key go together: pass both or neither"), "cert", "key"))
	}
	if n.Insecure && n.Cert != "" {
		errs = append(errs, at(errors.New("cert and key need TLS; they cannot be used with insecure"), "cert", "key", "insecure"))
	}
	return errors.Join(errs...)
}
