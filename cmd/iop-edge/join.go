package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"

	"iop/adapters/config"
	"iop/adapters/tlsca"
	"iop/bootstrap"
	"iop/domain"
)

// join prints what to run on a node's machine to connect it to this edge:
// the edge address, how to trust it (--ca-pin) and how to hand over the
// token without putting it on a command line, where ps and shell history
// would show it.
func join(cfgPath string, out, errOut io.Writer, args []string) error {
	fs := flag.NewFlagSet("join", flag.ContinueOnError)
	fs.SetOutput(errOut)
	addr := fs.String("address", "", "host:port nodes dial (default: from transport.listen, or the first transport.tls.hosts name)")
	// Flags may come before or after the node id (the flag package alone
	// stops at the first argument that is not a flag).
	var ids []string
	for {
		if err := fs.Parse(args); err != nil {
			return usageError{err}
		}
		if fs.NArg() == 0 {
			break
		}
		ids = append(ids, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(ids) != 1 {
		return usageError{errors.New("usage: iop-edge --config edge.yaml join [--address host:port] NODE_ID")}
	}
	id := ids[0]
	// No secret is needed here: the token_env/key_env variables live in the
	// service's environment, not in the shell that runs join.
	cfg, err := config.LoadEdgeShape(cfgPath)
	if err != nil {
		return usageError{err}
	}
	var node *config.NodeEntry
	for i := range cfg.Nodes {
		if cfg.Nodes[i].ID == id {
			node = &cfg.Nodes[i]
		}
	}
	if node == nil {
		return fmt.Errorf("no node %q in %s (add it under nodes: first)", id, cfgPath)
	}
	edgeAddr := *addr
	if edgeAddr == "" {
		if edgeAddr, err = dialAddress(cfg, errOut); err != nil {
			return err
		}
	}
	lt, err := bootstrap.OpenLinkTLS(cfg, warnLogger(errOut))
	if err != nil {
		return err
	}
	if config.IsLoopbackListen(cfg.Transport.Listen) {
		// The default: README step 1 is to change it. Mode off is
		// loopback-only: the edge refuses to start on any other address.
		also := ""
		if cfg.Transport.TLS.Mode == config.TLSOff {
			also = " and set transport.tls.mode: auto (nodes then need --ca-pin: run join again after the restart)"
		}
		fmt.Fprintf(errOut, "iop-edge: warning: transport.listen %s is a loopback address: only a node on this machine (or one a tunnel brings to it) can connect; "+
			"for a node on another machine, set transport.listen to an address it reaches (e.g. \"0.0.0.0:7700\")%s and restart the edge\n", cfg.Transport.Listen, also)
	}
	warnUncoveredHost(lt, edgeAddr, cfg.Transport.TLS.Mode, errOut)
	cmd := []string{"iop-node", "--edge", shellQuote(edgeAddr)}
	if lt.Pin == "" {
		cmd = append(cmd, "--insecure")
	} else {
		cmd = append(cmd, "--ca-pin", lt.Pin)
	}
	if cfg.Transport.TLS.ClientCAFile != "" {
		cmd = append(cmd, "--cert", shellQuote(id+".pem"), "--key", shellQuote(id+".key"))
	}
	var where string
	switch {
	case node.TokenEnv != "" && !domain.ConventionalEnvName(node.TokenEnv):
		// Perhaps the token itself, pasted where its variable's name goes:
		// this output is made to be copied to another machine.
		where = "the value of the variable its token_env names in the edge's environment " + config.NameNotShown("token_env", "token")
	case node.TokenEnv != "":
		where = "the value of " + node.TokenEnv + " in the edge's environment"
	case node.TokenSHA256 != "":
		where = "the token you hashed into its token_sha256 (the edge keeps only the hash)"
	default:
		where = "its token (nodes[].token in " + cfgPath + ")"
	}
	fmt.Fprintf(out, "# Node %s: run on its machine. Paste %s at the prompt;\n", id, where)
	fmt.Fprintln(out, "# iop-node reads it from IOP_NODE_TOKEN, so it is never on a command line.")
	if cfg.Transport.TLS.ClientCAFile != "" {
		fmt.Fprintf(out, "# --cert/--key: a client certificate from transport.tls.client_ca_file")
		if cfg.Transport.TLS.BindNodeIdentity {
			fmt.Fprintf(out, " whose CN or a DNS name is %s", id)
		}
		fmt.Fprintln(out, ".")
	}
	fmt.Fprintln(out, tokenPrompt(id))
	fmt.Fprintln(out, strings.Join(cmd, " "))
	return nil
}

// warnUncoveredHost warns when the certificate the node link serves does
// not name the host in addr, which the node is told to dial: the node
// checks it (unless its pin is the certificate's own) and would stop at
// once, refusing the edge.
func warnUncoveredHost(lt *bootstrap.LinkTLS, addr, mode string, errOut io.Writer) {
	leaf := lt.Leaf()
	if leaf == nil || tlsca.Pin(leaf) == lt.Pin {
		return
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || leaf.VerifyHostname(host) == nil {
		return
	}
	fix := "add it to transport.tls.hosts in the config and restart the edge"
	if mode == config.TLSFiles {
		fix = "transport.tls.cert_file must name it"
	}
	names := append([]string(nil), leaf.DNSNames...)
	for _, ip := range leaf.IPAddresses {
		names = append(names, ip.String())
	}
	fmt.Fprintf(errOut, "iop-edge: warning: the node-link certificate does not name %s, so a node dialing it refuses the edge: %s, or pass --address with a name it has (%s)\n",
		host, fix, strings.Join(names, ", "))
}

// tokenPrompt is the line that reads the node's token into IOP_NODE_TOKEN
// without echoing it. It is POSIX sh, so it runs the same in bash, zsh and
// dash (read -s and read -p are bash's); echo is turned back on whether or
// not read succeeds, and stty's complaint on a stdin that is not a terminal
// is dropped. id is a node id, which has no character printf or the shell
// treats specially.
func tokenPrompt(id string) string {
	return "printf 'iop token for node " + id + ": '; stty -echo 2>/dev/null; read -r IOP_NODE_TOKEN; stty echo 2>/dev/null; echo; export IOP_NODE_TOKEN"
}

// dialAddress guesses the address nodes dial from transport.listen.
func dialAddress(cfg *config.EdgeConfig, errOut io.Writer) (string, error) {
	host, port, err := net.SplitHostPort(cfg.Transport.Listen)
	if err != nil {
		return "", err
	}
	if port == "0" {
		return "", errors.New("transport.listen uses port 0; pass --address host:port")
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		// The first certificate name a node can dial: a wildcard
		// ("*.example.com") names no host.
		named := ""
		for _, h := range cfg.Transport.TLS.Hosts {
			if !strings.HasPrefix(h, "*") {
				named = h
				break
			}
		}
		switch {
		case named != "":
			host = named
		default:
			if host, err = os.Hostname(); err != nil {
				return "", errors.New("cannot tell which address nodes dial; pass --address host:port")
			}
			fmt.Fprintf(errOut, "iop-edge: using this machine's name %q as the edge address; pass --address if nodes reach it by another name (and add that name to transport.tls.hosts)\n", host)
		}
	}
	return net.JoinHostPort(host, port), nil
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9._:/@%+=,-]+$`)

func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// hashToken reads one token from in and prints the hex SHA-256 that
// edge.yaml's token_sha256 takes. From a terminal it asks on errOut and
// reads with echo off, so the token does not stay on the screen or in the
// terminal's scrollback.
func hashToken(in io.Reader, out, errOut io.Writer, args []string) error {
	if len(args) > 0 {
		return errors.New("hash-token reads the token on stdin, never as an argument (arguments show in ps and shell history)")
	}
	// read ends the prompt's line once the token is read (the Enter typed
	// is not echoed), before the hash is printed: ended as the command
	// returned, the hash stood on the prompt's line.
	endPrompt := func() {}
	if f, ok := in.(*os.File); ok {
		if restore, ok := withoutEcho(f.Fd()); ok {
			// Echo comes back however the read ends, an interrupt included.
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
			done := make(chan struct{})
			endPrompt = sync.OnceFunc(func() {
				signal.Stop(sig)
				close(done)
				restore()
				fmt.Fprintln(errOut)
			})
			defer endPrompt()
			go func() {
				select {
				case <-sig:
					restore()
					fmt.Fprintln(errOut)
					os.Exit(130)
				case <-done:
				}
			}()
			fmt.Fprint(errOut, "token (not shown): ")
		}
	}
	line, err := bufio.NewReader(io.LimitReader(in, 64<<10)).ReadString('\n')
	endPrompt()
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read token: %w", err)
	}
	tok := strings.TrimRight(line, "\r\n")
	if tok == "" {
		return errors.New("no token on stdin: pipe one in (iop-edge hash-token < token-file), or run it from a terminal to type it")
	}
	if len(tok) < config.MinTokenLength {
		return fmt.Errorf("the token on stdin is shorter than %d characters", config.MinTokenLength)
	}
	_, err = fmt.Fprintln(out, config.TokenHash(tok))
	return err
}

// usageError is a mistake in the command line or the config file: the
// process exits 2 for it, as for the edge's own flags and config.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }
