// Command iop-edge is the front server: nodes dial in over TCP, callers use
// its HTTP API, the OpenAI-compatible surface or the iop CLI.
//
//	iop-edge [--config F]                 serve
//	iop-edge [--config F] --print-ca-pin  print the pin nodes pass as --ca-pin
//	iop-edge [--config F] join [--address H:P] NODE_ID
//	                                      print the iop-node command line for a node
//	iop-edge hash-token                   read a token on stdin, print its token_sha256
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"go.uber.org/fx"

	"iop/adapters/config"
	"iop/adapters/procguard"
	"iop/bootstrap"
)

func main() {
	// Before anything else: the edge holds API keys, DSN passwords and its
	// CA key, which any process of its user could otherwise read from
	// /proc/PID/environ and /proc/PID/mem.
	if err := procguard.Protect(); err != nil {
		fmt.Fprintln(os.Stderr, "iop-edge:", err)
		os.Exit(2)
	}
	bootstrap.CatchHangup()     // a hangup ends neither binary
	bootstrap.CatchBrokenPipe() // nor does a log reader that went away
	cfgPath := flag.String("config", "configs/edge.yaml", "edge config file (YAML)")
	version := flag.Bool("version", false, "print the version and exit")
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof on this loopback address (e.g. 127.0.0.1:6060)")
	printPin := flag.Bool("print-ca-pin", false, "print the node-link CA pin (sha256:<hex>) nodes pass as --ca-pin, creating the CA on first use, and exit")
	flag.Usage = usage
	flag.Parse()
	if *version {
		fmt.Println("iop-edge", bootstrap.Version)
		return
	}
	if args := flag.Args(); len(args) > 0 {
		switch args[0] {
		case "hash-token":
			exit(hashToken(os.Stdin, os.Stdout, os.Stderr, args[1:]))
		case "join":
			exit(join(*cfgPath, os.Stdout, os.Stderr, args[1:]))
		default:
			fmt.Fprintf(os.Stderr, "iop-edge: unknown command %q\n", args[0])
			usage()
			os.Exit(2)
		}
	}
	load := config.LoadEdge
	if *printPin {
		// The pin is public: printing it reads no key_env/token_env
		// variable, which live in the service's environment, not in the
		// shell that asks for the pin.
		load = config.LoadEdgeShape
	}
	cfg, err := load(*cfgPath)
	if err != nil {
		printErr(err)
		os.Exit(2)
	}
	if *printPin {
		exit(printCAPin(cfg, os.Stdout, os.Stderr))
	}
	log := bootstrap.NewLogger(cfg.Log, nil)
	if len(cfg.Nodes) == 0 {
		log.Warn("no nodes configured: no node can register until nodes[] is added to the config (then POST /v1/admin/reload or SIGHUP)", "config", *cfgPath)
	}
	stopPprof := func() {}
	if *pprofAddr != "" {
		if err := bootstrap.CheckPprofAddr(*pprofAddr); err != nil {
			fmt.Fprintln(os.Stderr, "iop-edge:", err)
			os.Exit(2)
		}
		stop, err := bootstrap.StartPprof(*pprofAddr, log)
		if err != nil {
			// A busy port is a failure to start, as for the other listeners.
			fmt.Fprintln(os.Stderr, "iop-edge: cannot start:", err)
			os.Exit(1)
		}
		stopPprof = stop
	}
	code := bootstrap.Serve("iop-edge", fx.New(
		bootstrap.Edge(bootstrap.EdgeSettings{Config: cfg, ConfigPath: *cfgPath, Logger: log}),
		bootstrap.FxLogger(log),
	), log, os.Stderr)
	stopPprof()
	os.Exit(code)
}

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  iop-edge [--config edge.yaml]                 run the edge
  iop-edge [--config edge.yaml] --print-ca-pin  print the pin nodes pass as --ca-pin
  iop-edge [--config edge.yaml] join [--address host:port] NODE_ID
                                                print the iop-node command line for NODE_ID
  iop-edge hash-token < token                   print the token's token_sha256 for edge.yaml
flags:
`)
	flag.PrintDefaults()
}

// exit ends the process: 0 on nil, else the message and code 1.
func exit(err error) {
	if err != nil {
		printErr(err)
		if errors.As(err, new(usageError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
	os.Exit(0)
}

// printErr prints err on stderr, one "iop-edge: " line per problem (a
// config's problems are joined with newlines), as iop-node does.
func printErr(err error) {
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintln(os.Stderr, "iop-edge:", line)
	}
}

func printCAPin(cfg *config.EdgeConfig, out, errOut io.Writer) error {
	lt, err := bootstrap.OpenLinkTLS(cfg, warnLogger(errOut))
	if err != nil {
		return err
	}
	if lt.Pin == "" {
		return fmt.Errorf("transport.tls.mode is off: the node link has no certificate to pin (nodes use --insecure)")
	}
	_, err = fmt.Fprintln(out, lt.Pin)
	return err
}

// warnLogger drops the "created the edge CA" lines when only printing, and
// passes warnings on to errOut: one that changed a file the operator hands
// out (a CA re-signed, so --ca-file nodes need the new ca.pem) or that a
// certificate nears its end.
func warnLogger(errOut io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelWarn,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
}
