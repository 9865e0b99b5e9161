package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"iop/cmd/iop/internal/client"

	"iop/domain/nodecmd"
)

// runInfo is a run as the edge reports it (from its history or a node's store).
type runInfo nodecmd.Run

// duration is how long the run took, or has been going ("+"). It counts
// from started_at when there is one (a node's store has it) and from
// created_at otherwise: the edge's history, what iop runs and run-get
// usually read, records no start time (adapters/http/history.go).
func (r runInfo) duration(now time.Time) string {
	start := r.StartedAt
	if start == nil && !r.CreatedAt.IsZero() {
		start = &r.CreatedAt
	}
	if start == nil {
		return "-"
	}
	if r.FinishedAt == nil {
		return shortDuration(now.Sub(*start)) + "+"
	}
	return shortDuration(r.FinishedAt.Sub(*start))
}

func (r runInfo) errorText() string {
	if r.Error == nil {
		return ""
	}
	if r.Error.Message == "" {
		return r.Error.Code
	}
	return r.Error.Code + ": " + r.Error.Message
}

func (a *app) runsCmd() *cobra.Command {
	var (
		node, status, adapter, key, session, since, until, cursor string
		limit                                                     int
	)
	var cmd *cobra.Command
	cmd = &cobra.Command{
		Use:   "runs [--node N] [--status S] [--adapter A] [--key K] [--session S] [--since T] [--until T] [--limit N] [--cursor C]",
		Short: "List recent runs, newest first, from the edge's history",
		Args:  cobra.NoArgs,
		RunE: a.action(func(ctx context.Context, c *client.Client, _ []string) error {
			if err := emptyFilters(cmd, "node", "status", "adapter", "key", "session", "since", "until"); err != nil {
				return err
			}
			if limit < 0 {
				return usageError("--limit must not be negative")
			}
			q := url.Values{}
			if node != "" {
				q.Set("node", node)
			}
			if status != "" {
				q.Set("status", status)
			}
			if limit > 0 {
				q.Set("limit", strconv.Itoa(limit))
			}
			for name, v := range map[string]string{"adapter": adapter, "key": key, "session": session, "since": since, "until": until, "cursor": cursor} {
				if v != "" {
					q.Set(name, v)
				}
			}
			raw, printed, err := a.call(ctx, c, http.MethodGet, "/v1/runs", q)
			if err != nil || printed {
				return err
			}
			var list struct {
				Runs       []runInfo `json:"runs"`
				NextCursor string    `json:"next_cursor"`
				Errors     []struct {
					Node    string `json:"node"`
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"errors"`
			}
			if err := json.Unmarshal(raw, &list); err != nil {
				return fmt.Errorf("decode run list: %w", err)
			}
			for _, e := range list.Errors {
				fmt.Fprintf(a.stderr, "iop: warning: node %s did not answer: %s (%s)\n", printable(e.Node), printable(e.Message), printable(e.Code))
			}
			if len(list.Runs) == 0 {
				fmt.Fprintln(a.stderr, "no runs")
				return nil
			}
			now := a.now()
			t := newTable(a.stdout, "RUN", "NODE", "ADAPTER", "TARGET", "STATUS", "CREATED", "DURATION", "ERROR")
			for _, r := range list.Runs {
				t.row(r.RunID, r.Node, r.Adapter, r.Target, r.Status, a.clock(r.CreatedAt), r.duration(now), truncate(r.errorText(), 60))
			}
			t.flush()
			if list.NextCursor != "" {
				// The cursor holds only the position: the next page is
				// asked with the same filters and page size, or it lists
				// every run after the position.
				next := "iop runs"
				for _, f := range [][2]string{{"node", node}, {"status", status}, {"adapter", adapter}, {"key", key}, {"session", session}, {"since", since}, {"until", until}} {
					if f[1] != "" {
						next += " --" + f[0] + " " + shellWord(f[1])
					}
				}
				if limit > 0 {
					next += " --limit " + strconv.Itoa(limit)
				}
				fmt.Fprintf(a.stderr, "more runs: %s --cursor %s\n", next, shellWord(list.NextCursor))
			}
			return nil
		}),
	}
	cmd.Flags().StringVar(&adapter, "adapter", "", "only this adapter")
	cmd.Flags().StringVar(&key, "key", "", "only runs made with this API key name (anonymous: without one)")
	cmd.Flags().StringVar(&session, "session", "", "only runs of this session id")
	cmd.Flags().StringVar(&since, "since", "", "only runs created at or after this time (RFC 3339, or YYYY-MM-DD: 00:00 UTC, while CREATED is local time)")
	cmd.Flags().StringVar(&until, "until", "", "only runs created before this time (as --since)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue a listing (the cursor a previous page printed)")
	cmd.Flags().StringVar(&node, "node", "", "only this node")
	cmd.Flags().StringVar(&status, "status", "", "only runs with this status (queued, running, succeeded, failed, cancelled)")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many runs (edge default 50)")
	get := a.runGetCmd()
	get.Use = "get RUN_ID"
	cmd.AddCommand(get)
	return cmd
}

func (a *app) runGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "run-get RUN_ID",
		Short: "Show one run (from the edge's history, else from its node's store)",
		Args:  idArgs("RUN_ID"),
		RunE: a.action(func(ctx context.Context, c *client.Client, args []string) error {
			raw, printed, err := a.call(ctx, c, http.MethodGet, "/v1/runs/"+url.PathEscape(args[0]), nil, "run_id")
			if err != nil || printed {
				return err
			}
			var r runInfo
			if err := json.Unmarshal(raw, &r); err != nil {
				return fmt.Errorf("decode run: %w", err)
			}
			return a.printRun(r)
		}),
	}
}

func (a *app) printRun(r runInfo) error {
	t := newTable(a.stdout)
	field := func(k, v string) { t.row(k+":", v) }
	field("run", r.RunID)
	field("node", r.Node)
	field("adapter", r.Adapter)
	field("target", r.Target)
	field("session", r.SessionID)
	field("background", strconv.FormatBool(r.Background))
	field("status", r.Status)
	field("created", a.clock(r.CreatedAt))
	if r.StartedAt != nil {
		field("started", a.clock(*r.StartedAt))
	}
	if r.FinishedAt != nil {
		field("finished", a.clock(*r.FinishedAt))
	}
	field("duration", r.duration(a.now()))
	if r.Error != nil {
		field("error", r.errorText())
	}
	var u *client.Usage
	if r.Usage != nil {
		u = &client.Usage{PromptTokens: r.Usage.PromptTokens, CompletionTokens: r.Usage.CompletionTokens, TotalTokens: r.Usage.TotalTokens, CostUSD: r.Usage.CostUSD}
	}
	if s := strings.TrimPrefix(usageSummary(u), ": "); s != "" {
		field("usage", s)
	}
	t.flush()
	return nil
}

func (a *app) cancelCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cancel RUN_ID",
		Short: "Cancel a run on the node that runs it",
		Args:  idArgs("RUN_ID"),
		RunE: a.action(func(ctx context.Context, c *client.Client, args []string) error {
			raw, printed, err := a.call(ctx, c, http.MethodPost, "/v1/runs/"+url.PathEscape(args[0])+"/cancel", nil, "run_id")
			if err != nil || printed {
				return err
			}
			var ans struct {
				RunID string `json:"run_id"`
				Node  string `json:"node"`
			}
			_ = json.Unmarshal(raw, &ans)
			_, err = fmt.Fprintf(a.stdout, "cancelling run %s on node %s\n", printable(ans.RunID), printable(ans.Node))
			return err
		}),
	}
}

func (a *app) sessionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Manage logical sessions",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE(a),
	}
	var node, adapter, target string
	var end *cobra.Command // its flags are read in its RunE
	end = &cobra.Command{
		Use:   "end SESSION_ID --adapter A [--node N] [--target T]",
		Short: "End a logical session; a run in flight in it is cancelled",
		Args:  idArgs("SESSION_ID"),
		RunE: a.action(func(ctx context.Context, c *client.Client, args []string) error {
			if adapter == "" {
				return usageError("--adapter is required")
			}
			if err := emptyFlags(end, "the default", "node", "target"); err != nil {
				return err
			}
			q := url.Values{"adapter": {adapter}}
			if node != "" {
				q.Set("node", node)
			}
			if target != "" {
				q.Set("target", target)
			}
			raw, printed, err := a.call(ctx, c, http.MethodDelete, "/v1/sessions/"+url.PathEscape(args[0]), q)
			if err != nil || printed {
				return err
			}
			var ans struct {
				Node string `json:"node"`
			}
			_ = json.Unmarshal(raw, &ans)
			where := ""
			if ans.Node != "" {
				where = " on node " + printable(ans.Node)
			}
			_, err = fmt.Fprintf(a.stdout, "session %s of adapter %s ended%s\n", printable(args[0]), printable(adapter), where)
			return err
		}),
	}
	end.Flags().StringVar(&adapter, "adapter", "", "runtime adapter keeping the session (required)")
	end.Flags().StringVar(&node, "node", "", "node (default: the only connected node)")
	end.Flags().StringVar(&target, "target", "", "adapter target")
	cmd.AddCommand(end)
	return cmd
}

func (a *app) reloadCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "reload",
		Short: "Make the edge re-read its config and refresh connected nodes",
		Args:  cobra.NoArgs,
		RunE: a.action(func(ctx context.Context, c *client.Client, _ []string) error {
			raw, printed, err := a.call(ctx, c, http.MethodPost, "/v1/admin/reload", nil)
			var ae *client.APIError
			if errors.As(err, &ae) && ae.Code == "config_error" && strings.Contains(ae.Message, "\n") {
				// A refused file's problems come one a line, each naming
				// its line of edge.yaml: printed so, as iop-edge prints
				// them at start, each line escaped on its own, rather than
				// run together on one line with the newlines escaped.
				lines := strings.Split(ae.Message, "\n")
				for i, l := range lines {
					if i == len(lines)-1 {
						l += " (" + ae.Code + ")"
					}
					fmt.Fprintf(a.stderr, "iop: %s\n", printable(l))
				}
				return &exitErr{code: exitError}
			}
			if err != nil || printed {
				return err
			}
			var res struct {
				Nodes        int      `json:"nodes"`
				Refreshed    []string `json:"refreshed"`
				Disconnected []string `json:"disconnected"`
				Unchanged    []string `json:"unchanged"`
				Failed       []string `json:"failed"`
				NeedsRestart []string `json:"needs_restart"`
			}
			if err := json.Unmarshal(raw, &res); err != nil {
				return fmt.Errorf("decode reload result: %w", err)
			}
			fmt.Fprintf(a.stdout, "config reloaded: %d node(s) configured\n", res.Nodes)
			list := func(label string, ids []string) {
				if len(ids) > 0 {
					fmt.Fprintf(a.stdout, "  %s: %s\n", label, printable(strings.Join(ids, ", ")))
				}
			}
			list("refreshed", res.Refreshed)
			list("disconnected", res.Disconnected)
			list("unchanged", res.Unchanged)
			list("failed", res.Failed)
			if len(res.NeedsRestart) > 0 {
				// The nodes were applied: not a failure, but the rest of
				// the file's changes are not in force yet.
				fmt.Fprintf(a.stdout, "note: these changes take effect after a restart of the edge: %s\n", printable(strings.Join(res.NeedsRestart, ", ")))
			}
			if len(res.Failed) > 0 {
				return &exitErr{code: exitError, err: fmt.Errorf("%d node(s) could not be refreshed", len(res.Failed))}
			}
			return nil
		}),
	}
}
