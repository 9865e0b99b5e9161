package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"iop/cmd/iop/internal/client"
)

const (
	ansiDim   = "\x1b[2m"
	ansiReset = "\x1b[0m"
)

func (a *app) runCmd() *cobra.Command {
	var (
		req     client.RunRequest
		kv      []string
		options string
	)
	var cmd *cobra.Command // its flags are read in its RunE
	cmd = &cobra.Command{
		Use:   "run --adapter A [--node N] [--target T] [INPUT|-]",
		Short: "Start a run and stream its output",
		Long: `Start a run and stream its output as it arrives: text to stdout, reasoning to
stderr (dimmed on a terminal). The input is INPUT, or stdin when INPUT is "-"
or absent and stdin is not a terminal.

With --background the run keeps going on its node whatever happens to this
command; iop prints its id and node. Ctrl-C during a foreground run cancels it
and says whether the edge confirmed the cancel (it waits 5 s for the answer).

Exit codes: 0 complete, 1 error (a run the edge refused included), 2 usage
error (no --adapter, --target missing for an adapter that needs one, a bad
--option or --options, input that is not UTF-8 text, input on stdin over
8 MiB), 130 cancelled or interrupted.`,
		Args: cobra.MaximumNArgs(1),
		RunE: a.action(func(ctx context.Context, c *client.Client, args []string) error {
			if req.Adapter == "" {
				return usageError("--adapter is required")
			}
			if err := emptyFlags(cmd, "the default", "node", "target"); err != nil {
				return err
			}
			if err := emptyFlags(cmd, "a run without a session", "session"); err != nil {
				return err
			}
			opts, err := buildOptions(options, kv)
			if err != nil {
				return err
			}
			req.Options = opts
			if req.Input, err = a.readInput(ctx, args); err != nil {
				return err
			}
			return a.doRun(ctx, c, req)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&req.Node, "node", "", "node to run on (default: the edge chooses)")
	f.StringVar(&req.Adapter, "adapter", "", "runtime adapter on the node (required)")
	f.StringVar(&req.Target, "target", "", "adapter target (exec command name, model, …)")
	f.StringVar(&req.SessionID, "session", "", "logical session id to continue")
	f.BoolVar(&req.Background, "background", false, "run in the background and print its id")
	f.StringArrayVar(&kv, "option", nil, "adapter option `key=value` (value parsed as JSON when it is JSON); repeatable")
	f.StringVar(&options, "options", "", "adapter options as a JSON object")
	return cmd
}

// buildOptions merges --option pairs over the --options object.
func buildOptions(raw string, kv []string) (json.RawMessage, error) {
	opts := map[string]json.RawMessage{}
	if strings.TrimSpace(raw) != "" {
		if err := json.Unmarshal([]byte(raw), &opts); err != nil || opts == nil {
			return nil, usageError("--options must be a JSON object: %s", raw)
		}
	}
	for _, p := range kv {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, usageError("--option wants key=value, not %q", p)
		}
		if json.Valid([]byte(v)) && v != "" {
			opts[k] = json.RawMessage(v)
		} else {
			b, _ := json.Marshal(v)
			opts[k] = b
		}
	}
	if len(opts) == 0 {
		return nil, nil
	}
	return json.Marshal(opts)
}

// readInput returns the run's input: INPUT, or stdin. The API carries
// text, as a JSON string, so input that is not UTF-8 is refused: encoding
// it would turn each bad byte into U+FFFD, and the program would get other
// bytes than were given, without a word. Reading stdin ends when ctx does
// (Ctrl-C), with ctx's error: the first Ctrl-C was ignored while stdin
// stayed open. The read itself cannot be stopped; the goroutine doing it
// ends with stdin, or with the process, which exits right after.
func (a *app) readInput(ctx context.Context, args []string) (string, error) {
	if len(args) == 1 && args[0] != "-" {
		if !utf8.ValidString(args[0]) {
			return "", usageError("INPUT is not UTF-8 text; a run's input must be")
		}
		return args[0], nil
	}
	if len(args) == 0 && a.stdinTTY {
		return "", nil
	}
	type read struct {
		b   []byte
		err error
	}
	done := make(chan read, 1)
	go func() {
		// The edge takes at most MaxRequest bytes: reading on past it
		// only grew memory (a file of gigabytes, or /dev/zero, without
		// end) for a run the edge then refused.
		b, err := io.ReadAll(io.LimitReader(a.stdin, client.MaxRequest+1))
		done <- read{b, err}
	}()
	var b []byte
	select {
	case r := <-done:
		if r.err != nil {
			return "", fmt.Errorf("read input from stdin: %w", r.err)
		}
		b = r.b
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if len(b) > client.MaxRequest {
		return "", usageError("the input on stdin is over %d MiB, the most the edge takes in a request", client.MaxRequest>>20)
	}
	if !utf8.Valid(b) {
		return "", usageError("the input on stdin is not UTF-8 text; a run's input must be")
	}
	return string(b), nil
}

// runOutput renders a run stream for humans.
type runOutput struct {
	a            *app
	wrote        bool // something went to stdout
	endsNewline  bool // ... and it ended with a newline
	reasoning    bool // reasoning text is open on stderr
	reasonNLDone bool
}

// interruptCancelWait bounds the cancel iop run sends on Ctrl-C; a second
// Ctrl-C ends the process at once meanwhile.
var interruptCancelWait = 5 * time.Second

func (a *app) doRun(ctx context.Context, c *client.Client, req client.RunRequest) error {
	// The stream outlives an interrupt: on Ctrl-C iop asks the edge to
	// cancel the run, and closes the stream only after the answer. Closed
	// first, as it was, the run was only cancelled if the edge saw the
	// connection go (not behind a proxy that keeps its upstream open, nor
	// over a broken network), and iop said "run … is cancelled" without
	// knowing. Until the edge answers the run's start, Ctrl-C abandons the
	// request, which the edge takes as the caller leaving.
	sctx, endStream := context.WithCancel(context.WithoutCancel(ctx))
	defer endStream()
	unhook := context.AfterFunc(ctx, endStream)
	rs, err := c.StartRun(sctx, req)
	if !unhook() && err == nil {
		// Interrupted as the run started: its stream is already cut.
		defer rs.Close()
		if rs.Background {
			return &exitErr{code: exitInterrupted, err: fmt.Errorf("interrupted; run %s was started in the background on node %s", printable(rs.RunID), printable(rs.Node))}
		}
		return interruptedRun(rs.RunID, cancelRun(ctx, c, rs.RunID))
	}
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	var apiErr *client.APIError
	if req.Target == "" && errors.As(err, &apiErr) && apiErr.Code == "target_not_found" {
		// The adapter needs a target and none was given: a usage error.
		return usageError("--target is required for adapter %q: %s", req.Adapter, apiErr.Message)
	}
	if err != nil {
		return err
	}
	defer rs.Close()
	if rs.Background {
		if a.json {
			return writeJSONLine(a.stdout, map[string]string{"run_id": rs.RunID, "node": rs.Node})
		}
		_, err := fmt.Fprintf(a.stdout, "%s started in the background on node %s\n", printable(rs.RunID), printable(rs.Node))
		return err
	}
	if a.verbose {
		fmt.Fprintf(a.stderr, "run %s on node %s\n", printable(rs.RunID), printable(rs.Node))
	}
	cancelled := make(chan error, 1)
	unwatch := context.AfterFunc(ctx, func() {
		cancelled <- cancelRun(ctx, c, rs.RunID)
		rs.Close() // ends the Next below
	})
	watching := true
	defer func() {
		if watching && !unwatch() {
			<-cancelled // the cancel was sent: wait for its answer, whatever ended the run
		}
	}()
	out := &runOutput{a: a}
	for {
		ev, raw, err := rs.Next()
		if err != nil {
			out.finishLine()
			if ctx.Err() != nil {
				watching = false // the deferred wait has nothing left to wait for
				return interruptedRun(rs.RunID, <-cancelled)
			}
			switch {
			case errors.Is(err, io.EOF):
				err = errors.New("the stream ended before the run did")
			case errors.Is(err, io.ErrUnexpectedEOF):
				// The connection dropped inside the answer: the edge was
				// killed, or the network between went away.
				err = errors.New("the connection to the edge broke before the run ended")
			}
			return fmt.Errorf("run %s: %w", rs.RunID, err)
		}
		if a.json {
			// A failed write is stdoutErr's, below.
			if err := writeJSONLine(a.stdout, raw); err != nil && a.stdoutErr() == nil {
				return err
			}
		} else {
			out.show(ev)
		}
		if err := a.stdoutErr(); err != nil {
			// The output is lost: reading on would only lose more. The run
			// is cancelled as on Ctrl-C (unless Ctrl-C came meanwhile and
			// did that), then the stream closed (deferred above).
			if watching = !unwatch(); watching {
				return err
			}
			return fmt.Errorf("%w; %s", err, cancelOutcome(rs.RunID, cancelRun(ctx, c, rs.RunID)))
		}
		if ev.Terminal() {
			if ctx.Err() != nil {
				// Interrupted, and the run ended meanwhile: most often by
				// the cancel iop sent, whose answer the edge gives after
				// the stream's last event. Said as for a stream cut short,
				// from the cancel's answer, unless the event itself says
				// the run is cancelled.
				out.finishLine()
				watching = false
				cerr := <-cancelled
				if ev.Type == "cancelled" {
					cerr = nil
				}
				return interruptedRun(rs.RunID, cerr)
			}
			return out.end(rs, ev)
		}
	}
}

// cancelRun asks the edge to cancel run id, for an interrupt or lost
// output, and returns its answer; it waits interruptCancelWait at most,
// even once ctx has ended.
func cancelRun(ctx context.Context, c *client.Client, id string) error {
	cctx, done := context.WithTimeout(context.WithoutCancel(ctx), interruptCancelWait)
	defer done()
	err := c.CallFor(cctx, http.MethodPost, "/v1/runs/"+url.PathEscape(id)+"/cancel", nil, nil, nil, "run_id")
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no answer within %v", interruptCancelWait)
	}
	return err
}

// interruptedRun is the end of a run interrupted with Ctrl-C, given the
// answer to the cancel iop sent.
func interruptedRun(id string, cerr error) error {
	return &exitErr{code: exitInterrupted, err: errors.New("interrupted; " + cancelOutcome(id, cerr))}
}

// cancelOutcome says what became of run id, given the answer to its cancel.
func cancelOutcome(id string, cerr error) string {
	id = printable(id)
	var apiErr *client.APIError
	switch {
	case cerr == nil:
		return fmt.Sprintf("run %s is cancelled", id)
	case errors.As(cerr, &apiErr) && apiErr.Code == "run_finished":
		return fmt.Sprintf("run %s had already ended: see iop run-get %s", id, id)
	}
	return fmt.Sprintf("run %s may still be running, its cancel failed: %v; see iop run-get %s, or iop cancel %s", id, cerr, id, id)
}

func (o *runOutput) show(ev client.RunEvent) {
	a := o.a
	switch ev.Type {
	case "delta":
		if ev.Text == "" {
			return
		}
		o.closeReasoning()
		_, _ = io.WriteString(a.stdout, ev.Text)
		o.wrote = true
		o.endsNewline = strings.HasSuffix(ev.Text, "\n")
	case "reasoning_delta":
		if ev.Text == "" {
			return
		}
		if a.stderrTTY {
			_, _ = io.WriteString(a.stderr, ansiDim+ev.Text+ansiReset)
		} else {
			_, _ = io.WriteString(a.stderr, ev.Text)
		}
		o.reasoning = true
		o.reasonNLDone = strings.HasSuffix(ev.Text, "\n")
	}
}

// closeReasoning ends the reasoning line on stderr before answer text.
func (o *runOutput) closeReasoning() {
	if o.reasoning && !o.reasonNLDone {
		_, _ = io.WriteString(o.a.stderr, "\n")
	}
	o.reasoning = false
}

// finishLine ends a partial line of output on a terminal, so the prompt
// (or iop's error) starts on a line of its own. Piped or redirected, stdout
// is the run's output byte for byte: a newline the program never printed
// would change a file, a checksum, or the next program's input.
func (o *runOutput) finishLine() {
	if o.a.json {
		return
	}
	o.closeReasoning()
	if o.a.stdoutTTY && o.wrote && !o.endsNewline {
		_, _ = io.WriteString(o.a.stdout, "\n")
		o.endsNewline = true
	}
}

func (o *runOutput) end(rs *client.RunStream, ev client.RunEvent) error {
	o.finishLine()
	a := o.a
	switch ev.Type {
	case "complete":
		if a.verbose {
			fmt.Fprintf(a.stderr, "run %s complete on node %s%s\n", printable(rs.RunID), printable(rs.Node), usageSummary(ev.Usage))
		}
		return nil
	case "cancelled":
		// The event says why when it was not the caller's own cancel (the
		// node shutting down, its session ended): "run … was cancelled:
		// node shutting down".
		why := ""
		if ev.Error != nil && ev.Error.Message != "" {
			why = ": " + printable(ev.Error.Message)
		}
		return &exitErr{code: exitInterrupted, err: fmt.Errorf("run %s was cancelled%s", printable(rs.RunID), why)}
	}
	code, msg := "run_failed", "the run failed"
	if ev.Error != nil {
		code, msg = ev.Error.Code, ev.Error.Message
	}
	return &exitErr{code: exitError, err: &client.APIError{Code: code, Message: msg}}
}

// usageSummary renders usage as ": 12 prompt + 30 completion = 42 tokens, …".
func usageSummary(u *client.Usage) string {
	if u == nil {
		return ""
	}
	var parts []string
	total := u.TotalTokens
	if total == 0 {
		total = u.PromptTokens + u.CompletionTokens
	}
	if total > 0 {
		parts = append(parts, fmt.Sprintf("%d prompt + %d completion = %d tokens", u.PromptTokens, u.CompletionTokens, total))
	}
	if u.CostUSD > 0 {
		parts = append(parts, fmt.Sprintf("$%.4f", u.CostUSD))
	}
	if u.DurationMS > 0 {
		parts = append(parts, fmt.Sprintf("%dms", u.DurationMS))
	}
	// The model and the stop reason are the provider's words.
	if u.Model != "" {
		parts = append(parts, "model "+printable(u.Model))
	}
	if u.StopReason != "" {
		parts = append(parts, "stop "+printable(u.StopReason))
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}
