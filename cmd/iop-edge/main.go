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
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof on this loopback address (e.g. 127.0.0.1:6060)")
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
	if *pprofAddr != "" {
		stop, err := bootstrap.StartPprof(*pprofAddr, log)
		if err != nil {
			fmt.Fprintln(os.Stderr, "iop-edge:", err)
			os.Exit(2)
		}
		defer stop()
	}
	fx.New(
		bootstrap.Edge(bootstrap.EdgeSettings{Config: cfg, ConfigPath: *cfgPath, Logger: log}),
		bootstrap.FxLogger(log),
	).Run()
}
