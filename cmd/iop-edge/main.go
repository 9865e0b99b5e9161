// Command iop-edge is the front server: nodes dial in over TCP, callers use
// its HTTP API, the OpenAI-compatible surface or the iop CLI.
package main

import (
	"flag"
	"fmt"
	"os"

	"go.uber.org/fx"

	"iop/adapters/config"
	"iop/bootstrap"
)

func main() {
	cfgPath := flag.String("config", "configs/edge.yaml", "edge config file (YAML)")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *version {
		fmt.Println("iop-edge", bootstrap.Version)
		return
	}
	cfg, err := config.LoadEdge(*cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "iop-edge:", err)
		os.Exit(2)
	}
	log := bootstrap.NewLogger(cfg.Log, nil)
	if len(cfg.Nodes) == 0 {
		log.Warn("no nodes configured: no node can register until nodes[] is added to the config (then POST /v1/admin/reload or SIGHUP)", "config", *cfgPath)
	}
	os.Exit(bootstrap.Serve("iop-edge", fx.New(
		bootstrap.Edge(bootstrap.EdgeSettings{Config: cfg, ConfigPath: *cfgPath, Logger: log}),
		bootstrap.FxLogger(log),
	), os.Stderr))
}
