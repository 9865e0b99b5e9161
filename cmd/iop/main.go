// Command iop is the command-line client of the iop edge HTTP API.
//
// Exit codes: 0 success; 1 an error from the edge, a failed run, or an edge
// that cannot be reached; 2 a usage error; 130 interrupted (Ctrl-C) or a
// cancelled run.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"iop/cmd/iop/internal/client"
)

// Exit codes.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitInterrupted = 130
)

func main() {
	// A write to a stdout whose reader has gone ("iop run … | head -1")
	// fails with EPIPE instead of killing the process with SIGPIPE, as Go
	// does for fds 1 and 2: killed, iop run left its run to the edge
	// noticing the connection go (never, behind a proxy that keeps its
	// upstream open) and exited 141. Now it is output that cannot be
	// written: the run is cancelled by request and iop exits 1, saying so.
	// The channel is never read; delivery does not block on it.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first Ctrl-C, a second one kills the process the usual way.
	context.AfterFunc(ctx, stop)
	a := &app{
		stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv,
		stdinTTY: isTerminal(os.Stdin), stdoutTTY: isTerminal(os.Stdout), stderrTTY: isTerminal(os.Stderr),
	}
	code := a.run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// app is one invocation of the CLI, with its streams and environment.
type app struct {
	stdin                          io.Reader
	stdout, stderr                 io.Writer
	getenv                         func(string) string
	stdinTTY, stdoutTTY, stderrTTY bool
	now                            func() time.Time
	loc                            *time.Location
	httpClient                     *http.Client

	// Global flags.
	edge    string
	apiKey  string
	caFile  string
	json    bool
	verbose bool
}

// exitErr ends the command with code; err, when set, is printed as
// "iop: <err>".
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

// usageError is a mistake in the command line (exit 2).
func usageError(format string, args ...any) error {
	return &exitErr{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// groupRunE is the RunE of a command that only groups subcommands (node,
// ollama, session). Without one, cobra answers "iop node bogus" and "iop
// node" with the help on stdout and exit 0, so a mistyped subcommand looked
// like success to a script; like the root command, a word that is not a
// subcommand is a usage error, and no word at all prints the help on stderr
// with the usage exit code. Such a command takes ArbitraryArgs so that the
// unknown word reaches this function instead of being refused by an Args
// check cobra skips for a command that cannot run.
func groupRunE(a *app) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageError("unknown command %q for %q", args[0], cmd.CommandPath())
		}
		cmd.SetOut(a.stderr)
		_ = cmd.Help()
		return &exitErr{code: exitUsage}
	}
}

// idArgs checks a command's arguments: one per name, a name in brackets
// optional (at the end), and none of those given empty. An empty id made a
// request for "/v1/runs//cancel", which the edge answered not_found; an
// optional NODE given empty ("iop node caps \"$NODE\"" with NODE unset)
// is a mistake too, not "every node", which is NODE left out.
func idArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		need := 0
		for _, n := range names {
			if !strings.HasPrefix(n, "[") {
				need++
			}
		}
		// cobra's RangeArgs reads "accepts between 1 and 1 arg(s)" when
		// none is optional.
		check := cobra.RangeArgs(need, len(names))
		switch need {
		case len(names):
			check = cobra.ExactArgs(need)
		case 0:
			check = cobra.MaximumNArgs(len(names))
		}
		if err := check(cmd, args); err != nil {
			return err
		}
		for i, arg := range args {
			if arg == "" {
				return usageError("%s must not be empty", strings.Trim(names[i], "[]"))
			}
		}
		return nil
	}
}

// emptyFilters refuses each of names that was given on the command line
// with an empty value (spaces and commas only): dropped as if never given,
// as they were, "iop runs --session \"$S\"" with S unset listed every
// session's runs, and "iop events --type \"$T\"" every event. A repeated
// flag is checked in each of its values.
func emptyFilters(cmd *cobra.Command, names ...string) error {
	return emptyFlags(cmd, "no filter", names...)
}

// emptyFlags is emptyFilters for flags that choose rather than filter,
// whose absence means unset (the default): "iop run --session \"$S\""
// with S unset ran without a session, the conversation silently lost, and
// "--node \"$N\"" let the edge choose any node.
func emptyFlags(cmd *cobra.Command, unset string, names ...string) error {
	for _, n := range names {
		f := cmd.Flags().Lookup(n)
		if f == nil || !f.Changed {
			continue
		}
		vals := []string{f.Value.String()}
		if sv, ok := f.Value.(interface{ GetSlice() []string }); ok {
			vals = sv.GetSlice()
		}
		for _, v := range vals {
			if strings.Trim(v, " ,") == "" {
				return usageError("--%s must not be empty (leave it out for %s)", n, unset)
			}
		}
	}
	return nil
}

// helpCmd replaces cobra's help command, which answered "iop help bogus"
// with the root help and exit 0: a topic that is no command is a usage
// error, as "iop bogus" is.
func (a *app) helpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			switch {
			case err != nil || cmd == nil:
				return usageError("unknown command %q for %q", args[0], "iop")
			case len(rest) > 0:
				return usageError("unknown command %q for %q", rest[0], cmd.CommandPath())
			}
			cmd.InitDefaultHelpFlag()
			cmd.InitDefaultVersionFlag()
			return cmd.Help()
		},
	}
}

func (a *app) run(ctx context.Context, args []string) int {
	if a.now == nil {
		a.now = time.Now
	}
	if a.loc == nil {
		a.loc = time.Local
	}
	// Every write to stdout goes through out, which keeps the first error:
	// a command whose output was lost (a full disk, a closed file) must
	// not exit 0. A broken pipe (main catches SIGPIPE) is such an error.
	out := &stickyWriter{w: a.stdout}
	a.stdout = out
	defer func() { a.stdout = out.w }()
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	cmd, err := root.ExecuteContextC(ctx)
	var we writeError
	if werr := out.Err(); werr != nil && (err == nil || errors.As(err, &we)) {
		// The command went through but its output did not: not a success.
		// (A command that failed says so itself, with its own exit code.)
		// cobra, printing --version itself, returns the write's error as
		// it came, which read as one of its usage errors (exit 2).
		err = &exitErr{code: exitError, err: werr}
	}
	if err == nil {
		return exitOK
	}
	// A usage error points at the help of the command that was used.
	help := "iop"
	if cmd != nil && cmd.Name() != "help" {
		help = cmd.CommandPath()
	}
	// An error's text holds what the edge, a node or a provider said (and
	// what the user typed): escaped, it stays on its one line and cannot
	// drive the terminal.
	var ee *exitErr
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(a.stderr, "iop: %s\n", printable(ee.err.Error()))
			if ee.code == exitUsage {
				fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", help)
			}
		}
		return ee.code
	}
	// Anything else comes from cobra itself: unknown commands and flags,
	// wrong argument counts.
	fmt.Fprintf(a.stderr, "iop: %s\nRun '%s --help' for usage.\n", printable(err.Error()), help)
	return exitUsage
}

// stickyWriter is stdout: it keeps the first write error, and fails every
// write after it with that error, so output is never partly written and
// a command can tell that what it printed was lost.
type stickyWriter struct {
	w   io.Writer
	err error
}

func (s *stickyWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if err != nil {
		s.err = writeError{err}
	}
	return n, s.err
}

// Err is the first write error, nil while every write went through.
func (s *stickyWriter) Err() error { return s.err }

// writeError is a failed write to stdout; it reads "write /dev/stdout: no
// space left on device" (the *os.PathError's own words), or "write stdout:
// …" for an error that names no file.
type writeError struct{ err error }

func (e writeError) Error() string {
	var pe *fs.PathError
	if errors.As(e.err, &pe) {
		return e.err.Error()
	}
	return "write stdout: " + e.err.Error()
}

func (e writeError) Unwrap() error { return e.err }

// stdoutErr is the first failed write to stdout, or nil.
func (a *app) stdoutErr() error {
	if s, ok := a.stdout.(*stickyWriter); ok {
		return s.Err()
	}
	return nil
}

// version is the build's version, set with -ldflags "-X main.version=…";
// a plain "go build" falls back to the module's build information.
var version = "dev"

func buildVersion() string {
	if version != "dev" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
	}
	return version
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "iop",
		Short: "Command-line client of the iop edge",
		Long: `iop talks to an iop edge over its HTTP API: it starts runs on nodes and streams
their output, lists and cancels runs, ends sessions, runs node commands and
follows the edge's event feed.

The edge is --edge, else $IOP_EDGE, else ` + client.DefaultEdge + `.
An edge with API keys needs one: --api-key, else $IOP_API_KEY.

Exit codes: 0 success, 1 error, 2 usage error, 130 interrupted or cancelled.`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		Version:           buildVersion(),
		// Without a command there is nothing to do: the help, on stderr,
		// and the usage exit code.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SetOut(a.stderr)
			_ = cmd.Help()
			return &exitErr{code: exitUsage}
		},
	}
	root.SetVersionTemplate("iop {{.Version}}\n")
	root.SetHelpCommand(a.helpCmd())
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError("%v", err) })
	pf := root.PersistentFlags()
	pf.StringVar(&a.edge, "edge", "", "edge HTTP API `URL` (default $IOP_EDGE or "+client.DefaultEdge+"); https:// for an edge with http.tls")
	pf.StringVar(&a.apiKey, "api-key", "", "API `key` for an edge with http.api_keys (default $IOP_API_KEY); prefer the variable, flags show in ps")
	pf.StringVar(&a.caFile, "ca-file", "", "PEM `file` of CAs to trust for an https edge (default $IOP_CA_FILE, else the system's)")
	pf.BoolVar(&a.json, "json", false, "print JSON instead of human-readable output")
	pf.BoolVarP(&a.verbose, "verbose", "v", false, "print more detail (run ids, usage) to stderr")

	root.AddCommand(
		a.runCmd(), a.runsCmd(), a.runGetCmd(), a.cancelCmd(), a.sessionCmd(),
		a.nodesCmd(), a.nodeCmd(), a.eventsCmd(), a.ollamaCmd(), a.reloadCmd(), a.usageCmd(),
	)
	return root
}

// client builds the API client for the selected edge.
func (a *app) client() (*client.Client, error) {
	edge := a.edge
	if edge == "" {
		edge = a.getenv("IOP_EDGE")
	}
	hc := a.httpClient
	caFile, from := a.caFile, "--ca-file"
	if caFile == "" {
		// Named as it was given: a bad $IOP_CA_FILE was reported as a
		// --ca-file the command line did not hold.
		caFile, from = a.getenv("IOP_CA_FILE"), "IOP_CA_FILE"
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, usageError("%s: %v", from, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usageError("%s %s holds no PEM certificate", from, caFile)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		// Nothing more to set here: client.New refuses redirects on any
		// client it is given, and the client bounds its waits for the
		// edge itself (CallTimeout, HeaderTimeout, StreamIdleTimeout).
		hc = &http.Client{Transport: tr}
	}
	c, err := client.New(edge, hc)
	if err != nil {
		return nil, usageError("%v", err)
	}
	key := a.apiKey
	if key == "" {
		key = a.getenv("IOP_API_KEY")
	}
	if err := c.SetAPIKey(strings.TrimSpace(key)); err != nil {
		return nil, usageError("%v", err)
	}
	return c, nil
}

// action wraps a command body: it hands it the API client and turns its
// errors into exit codes.
func (a *app) action(fn func(ctx context.Context, c *client.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		// Given empty ("--api-key \"$APP_KEY\"" with APP_KEY unset), a
		// global flag fell back to its variable or default as if left
		// out: the command went with $IOP_API_KEY's key (an admin's,
		// say) or to the local edge, without a word.
		for _, f := range [][2]string{
			{"edge", "$IOP_EDGE, else " + client.DefaultEdge},
			{"api-key", "$IOP_API_KEY"},
			{"ca-file", "$IOP_CA_FILE, else the system's CAs"},
		} {
			if err := emptyFlags(cmd, f[1], f[0]); err != nil {
				return err
			}
		}
		c, err := a.client()
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		return a.classify(ctx, fn(ctx, c, args))
	}
}

func (a *app) classify(ctx context.Context, err error) error {
	var ee *exitErr
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee):
		return ee
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return &exitErr{code: exitInterrupted, err: errors.New("interrupted")}
	}
	return &exitErr{code: exitError, err: err}
}
