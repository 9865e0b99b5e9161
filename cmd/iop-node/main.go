// Command iop-node runs next to the work, dials out to an iop edge,
// registers with a token and executes what the edge sends it.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"go.uber.org/fx"

	"iop/adapters/config"
	"iop/bootstrap"
)

func main() {
	var (
		cfgPath   = flag.String("config", "", "optional node config file (YAML)")
		edge      = flag.String("edge", "", "edge transport address host:port (default 127.0.0.1:7700)")
		token     = flag.String("token", "", "registration token (or IOP_NODE_TOKEN, or token/token_env in the config)")
		db        = flag.String("db", "", "SQLite DSN of the local run store (default file:iop.db?cache=shared&mode=rwc)")
		logLevel  = flag.String("log-level", "", "debug|info|warn|error")
		logFormat = flag.String("log-format", "", "text|json")
		version   = flag.Bool("version", false, "print the version and exit")
		pprofAddr = flag.String("pprof", "", "serve net/http/pprof on this loopback address (e.g. 127.0.0.1:6061)")
		statsIvl  = flag.Duration("stats-interval", 0, "how often to send node stats to the edge (default 15s; env IOP_NODE_STATS_INTERVAL)")
	)
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
	if err := cfg.Validate(); err != nil {
		fail(err)
	}
	tok, err := cfg.ResolveToken()
	if err != nil {
		fail(err)
	}
	if *statsIvl == 0 {
		if v := os.Getenv("IOP_NODE_STATS_INTERVAL"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				fail(fmt.Errorf("IOP_NODE_STATS_INTERVAL %q is not a positive duration", v))
			}
			*statsIvl = d
		}
	}
	if *statsIvl < 0 {
		fail(fmt.Errorf("--stats-interval must be positive"))
	}
	log := bootstrap.NewLogger(cfg.Log, nil)
	if *pprofAddr != "" {
		stop, err := bootstrap.StartPprof(*pprofAddr, log)
		if err != nil {
			fail(err)
		}
		defer stop()
	}
	fx.New(
		bootstrap.Node(bootstrap.NodeSettings{
			Edge: cfg.Edge, Token: tok, DB: cfg.DB, Logger: log,
			MinBackoff: cfg.Reconnect.Min.Std(), MaxBackoff: cfg.Reconnect.Max.Std(),
			StatsInterval: *statsIvl,
		}),
		bootstrap.FxLogger(log),
	).Run()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "iop-node:", err)
	os.Exit(2)
}
