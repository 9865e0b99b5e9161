// Command iop-node runs next to the work, dials out to an iop edge,
// registers with a token and executes what the edge sends it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"go.uber.org/fx"

	"iop/adapters/config"
	"iop/adapters/procguard"
	"iop/adapters/runtime/spawn"
	"iop/adapters/transport"
	"iop/bootstrap"
)

func main() {
	// Before anything else: a child the node runs (an exec target, a CLI
	// agent steered by its prompt) is of the node's user and could otherwise
	// read the token and provider keys from /proc/$PPID/environ.
	if err := procguard.Protect(); err != nil {
		fail(err)
	}
	bootstrap.CatchHangup()     // a hangup ends neither binary
	bootstrap.CatchBrokenPipe() // nor does a log reader that went away
	var (
		cfgPath   = flag.String("config", "", "optional node config file (YAML)")
		edge      = flag.String("edge", "", "edge transport address host:port (default 127.0.0.1:7700)")
		token     = flag.String("token", "", "registration token (or IOP_NODE_TOKEN, or token/token_env in the config)")
		db        = flag.String("db", "", "SQLite DSN of the local run store (default file:iop.db?cache=shared&mode=rwc)")
		logLevel  = flag.String("log-level", "", "debug|info|warn|error")
		logFormat = flag.String("log-format", "", "text|json")
		version   = flag.Bool("version", false, "print the version and exit")
		pprofAddr = flag.String("pprof", "", "serve net/http/pprof on this loopback address (e.g. 127.0.0.1:6061)")
		statsIvl  = new(time.Duration)
		caPin     = flag.String("ca-pin", "", "trust the edge whose certificate chain holds this public key: sha256:<hex> from iop-edge --print-ca-pin")
		caFile    = flag.String("ca-file", "", "trust an edge whose certificate chains to a CA in this PEM bundle")
		insecure  = flag.Bool("insecure", false, "plaintext link, for an edge with transport.tls.mode off (which the edge allows only on a loopback listen address)")
		certFile  = flag.String("cert", "", "client certificate (PEM) for an edge that requires one")
		keyFile   = flag.String("key", "", "key of --cert (PEM)")
	)
	flag.Func("stats-interval", "how often to send node stats to the edge, a `duration` of at least 100ms (default 15s; env IOP_NODE_STATS_INTERVAL)", func(v string) error {
		d, err := config.ParseDuration(v)
		*statsIvl = d
		return err
	})
	flag.Parse()
	if *version {
		fmt.Println("iop-node", bootstrap.Version)
		return
	}
	cfg, err := config.LoadNode(*cfgPath)
	if err != nil {
		fail(err)
	}
	if *edge != "" {
		cfg.Edge = *edge
	}
	if *token != "" {
		cfg.Token = config.Secret(*token)
	} else if t := os.Getenv("IOP_NODE_TOKEN"); t != "" && cfg.Token == "" && cfg.TokenEnv == "" {
		cfg.Token = config.Secret(t)
	}
	if *db != "" {
		cfg.DB = *db
	}
	if *logLevel != "" {
		cfg.Log.Level = *logLevel
	}
	if *logFormat != "" {
		cfg.Log.Format = *logFormat
	}
	// A trust flag replaces the file's trust settings rather than adding a
	// second, conflicting one.
	if *caPin != "" || *caFile != "" || *insecure {
		cfg.TLS.CAPin, cfg.TLS.CAFile, cfg.TLS.Insecure = *caPin, *caFile, *insecure
	}
	if *certFile != "" || *keyFile != "" {
		cfg.TLS.Cert, cfg.TLS.Key = *certFile, *keyFile
	}
	if err := cfg.Validate(); err != nil {
		if errors.Is(err, config.ErrNoTrust) && alone(err) {
			// Exit 1 before dialing: the hint says which flag to add.
			printErr(err)
			os.Exit(1)
		}
		fail(err)
	}
	linkTLS, err := bootstrap.NodeLinkTLS(cfg)
	if err != nil {
		fail(err)
	}
	tok, err := cfg.ResolveToken()
	if err != nil {
		fail(err)
	}
	ivl, err := statsInterval(*statsIvl, os.Getenv("IOP_NODE_STATS_INTERVAL"))
	if err != nil {
		fail(err)
	}
	log := bootstrap.NewLogger(cfg.Log, nil)
	// Before any child starts: what a run's processes leave behind when
	// their parent exits (a tool an agent ran in a session of its own) is
	// reparented to the node, not to init, so the run's end finds and kills
	// it. Every child the node starts goes through spawn.Start.
	if err := spawn.Adopt(); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		log.Warn("leftovers of a run that left its parent are not found once their parent exits", "err", err)
	}
	stopPprof := func() {}
	if *pprofAddr != "" {
		if err := bootstrap.CheckPprofAddr(*pprofAddr); err != nil {
			fail(err)
		}
		stop, err := bootstrap.StartPprof(*pprofAddr, log)
		if err != nil {
			// A busy port is a failure to start, as for the edge's link.
			fmt.Fprintln(os.Stderr, "iop-node: cannot start:", err)
			os.Exit(1)
		}
		stopPprof = stop
	}
	code := bootstrap.Serve("iop-node", fx.New(
		bootstrap.Node(bootstrap.NodeSettings{
			Edge: cfg.Edge, Token: tok, DB: cfg.DB, Logger: log,
			MinBackoff: cfg.Reconnect.Min.Std(), MaxBackoff: cfg.Reconnect.Max.Std(),
			StatsInterval:  ivl,
			StoreRetention: cfg.Store.Retention.Std(),
			Transport:      transport.Config{TLS: linkTLS},
		}),
		bootstrap.FxLogger(log),
	), log, os.Stderr)
	stopPprof()
	os.Exit(code)
}

// statsInterval merges --stats-interval (flag, zero when not given) with
// IOP_NODE_STATS_INTERVAL (env, used only when the flag is not given) and
// checks the result once: zero means the transport's default, anything
// else must be at least transport.MinStatsInterval. The error names where
// the value came from.
func statsInterval(flag time.Duration, env string) (time.Duration, error) {
	d, src, given := flag, "--stats-interval", flag != 0
	if !given && env != "" {
		v, err := config.ParseDuration(env)
		if err != nil {
			return 0, fmt.Errorf("IOP_NODE_STATS_INTERVAL: %w", err)
		}
		d, src, given = v, "IOP_NODE_STATS_INTERVAL", true
	}
	if given && d < transport.MinStatsInterval {
		return 0, fmt.Errorf("%s %s is below %s", src, d, transport.MinStatsInterval)
	}
	return d, nil
}

func fail(err error) {
	printErr(err)
	os.Exit(2)
}

// printErr prints err on stderr, one "iop-node: " line per problem (a
// config's problems are joined with newlines).
func printErr(err error) {
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintln(os.Stderr, "iop-node:", line)
	}
}

// alone reports whether err is one problem, not several joined.
func alone(err error) bool {
	j, ok := err.(interface{ Unwrap() []error })
	return !ok || len(j.Unwrap()) == 1
}
