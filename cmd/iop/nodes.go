package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"iop/cmd/iop/internal/client"

	"iop/domain/nodecmd"
)

// nodeInfo is one entry of GET /v1/nodes.
type nodeInfo struct {
	ID string `json:"id"`
	// Connected is false for a node of the edge's config that is not
	// connected; edges before the field existed listed connected nodes only.
	Connected      *bool      `json:"connected"`
	DisconnectedAt *time.Time `json:"disconnected_at"`
	// DisconnectReason is why an offline node left (edges before the field
	// existed send none).
	DisconnectReason string    `json:"disconnect_reason"`
	Remote           string    `json:"remote"`
	ConnectedAt      time.Time `json:"connected_at"`
	Version          string    `json:"version"`
	OS               string    `json:"os"`
	Arch             string    `json:"arch"`
	Hostname         string    `json:"hostname"`
	ConfigVersion    uint64    `json:"config_version"`
	RunsInFlight     int       `json:"runs_in_flight"`
	// Draining is true while a connected node stops: the edge sends it no
	// new run or provider request.
	Draining bool `json:"draining"`
	Adapters []struct {
		Name           string `json:"name"`
		Type           string `json:"type"`
		MaxConcurrency int    `json:"max_concurrency"`
		InFlight       int    `json:"in_flight"`
	} `json:"adapters"`
	Providers []struct {
		Name   string   `json:"name"`
		Type   string   `json:"type"`
		Models []string `json:"models"`
	} `json:"providers"`
}

func (n nodeInfo) online() bool { return n.Connected == nil || *n.Connected }

// connectedNodes is listNodes without the config's offline nodes: the ones
// a command can reach.
func connectedNodes(ctx context.Context, c *client.Client) ([]nodeInfo, error) {
	nodes, _, err := listNodes(ctx, c)
	if err != nil {
		return nil, err
	}
	online := nodes[:0]
	for _, n := range nodes {
		if n.online() {
			online = append(online, n)
		}
	}
	return online, nil
}

// listNodes returns every node the edge lists, offline ones of its config too.
func listNodes(ctx context.Context, c *client.Client) ([]nodeInfo, json.RawMessage, error) {
	var raw json.RawMessage
	if err := c.Call(ctx, http.MethodGet, "/v1/nodes", nil, nil, &raw); err != nil {
		return nil, nil, err
	}
	var list struct {
		Nodes []nodeInfo `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, nil, fmt.Errorf("decode node list: %w", err)
	}
	return list.Nodes, raw, nil
}

func (a *app) nodesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List nodes: connected ones and the edge config's offline ones",
		Args:  cobra.NoArgs,
		RunE: a.action(func(ctx context.Context, c *client.Client, _ []string) error {
			nodes, raw, err := listNodes(ctx, c)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout, raw)
			}
			if len(nodes) == 0 {
				fmt.Fprintln(a.stderr, "no nodes configured or connected")
				return nil
			}
			now := a.now()
			// CONNECTED is since when a node is online; for an offline one,
			// when it left (if the edge saw it leave), else "-".
			t := newTable(a.stdout, "ID", "STATUS", "REMOTE", "CONNECTED", "ADAPTERS", "VERSION")
			var reasons []string
			for _, n := range nodes {
				var ad []string
				for _, x := range n.Adapters {
					ad = append(ad, fmt.Sprintf("%s(%d/%d)", x.Name, x.InFlight, x.MaxConcurrency))
				}
				status, since := "online", ago(now, n.ConnectedAt)
				if n.online() && n.Draining {
					status = "draining"
				}
				if !n.online() {
					status, since = "offline", ""
					if n.DisconnectedAt != nil {
						since = "left " + ago(now, *n.DisconnectedAt)
					}
					if n.DisconnectReason != "" {
						reasons = append(reasons, fmt.Sprintf("%s left: %s", printable(n.ID), printable(n.DisconnectReason)))
					}
				}
				t.row(n.ID, status, n.Remote, since, strings.Join(ad, " "), n.Version)
			}
			t.flush()
			// Reasons are free text of any length: below the table, not in it.
			if len(reasons) > 0 {
				fmt.Fprintf(a.stdout, "\n%s\n", strings.Join(reasons, "\n"))
			}
			return nil
		}),
	}
}

// nodeReport is a built-in node command with its human rendering.
type nodeReport struct {
	use, command, short string
	// render prints the results; args are what the nodes were asked with.
	render func(a *app, results []nodeResult, args any) error
	// flags, when set, adds the report's flags to cmd and returns what
	// makes the command's arguments from them (one: a single NODE named).
	flags    func(cmd *cobra.Command) func(one bool) (any, error)
	flagsUse string // the flags' synopsis
}

type nodeResult struct {
	node string
	raw  json.RawMessage
}

func (a *app) nodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run node commands (caps, transport, usage, sessions, runs, exec)",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE(a),
	}
	reports := []nodeReport{
		{"caps", "capabilities", "Runtime adapters, version and platform of nodes", renderCaps, nil, ""},
		{"transport", "transport_status", "Link status of nodes: connected since, reconnects, RTT, traffic", renderTransport, nil, ""},
		{"usage", "usage_status", "Runs and token usage per adapter, from the nodes' stores, and the provider tunnels the edge relayed for them", renderUsage, nil, ""},
		{"sessions", "session_list", "Logical sessions kept by the nodes' adapters, newest first, a page per node", renderSessions, sessionFlags, "[--adapter A] [--limit N] [--cursor C]"},
		{"runs", "runs", "Runs recorded in the nodes' own stores, newest first, a page per node", renderNodeRuns, nodeRunsFlags, "[--adapter A] [--status S] [--limit N] [--cursor C]"},
	}
	for _, r := range reports {
		sub := &cobra.Command{
			Use:   r.use + " [NODE]",
			Short: r.short + " (every node when NODE is omitted)",
			Args:  idArgs("[NODE]"),
		}
		cargs := func(bool) (any, error) { return nil, nil }
		if r.flags != nil {
			cargs = r.flags(sub)
			sub.Use += " " + r.flagsUse
		}
		sub.RunE = a.action(func(ctx context.Context, c *client.Client, args []string) error {
			cmdArgs, err := cargs(len(args) == 1)
			if err != nil {
				return err
			}
			var ids []string
			if len(args) == 1 {
				ids = args
			} else {
				nodes, err := connectedNodes(ctx, c)
				if err != nil {
					return err
				}
				for _, n := range nodes {
					ids = append(ids, n.ID)
				}
			}
			var results []nodeResult
			var lastErr error
			for _, id := range ids {
				raw, err := c.Command(ctx, id, r.command, cmdArgs, nil)
				if err != nil {
					if len(args) == 1 || ctx.Err() != nil || keyRefused(err) {
						return err // one node asked for, interrupted, or the key may ask none
					}
					fmt.Fprintf(a.stderr, "iop: warning: node %s: %s\n", printable(id), printable(err.Error()))
					lastErr = err
					continue
				}
				results = append(results, nodeResult{node: id, raw: raw})
			}
			if len(results) == 0 && lastErr != nil {
				return fmt.Errorf("no node answered %s (%d asked)", r.command, len(ids))
			}
			if a.json {
				if len(args) == 1 {
					return printJSON(a.stdout, results[0].raw)
				}
				all := map[string]json.RawMessage{}
				for _, res := range results {
					all[res.node] = res.raw
				}
				b, err := json.Marshal(all)
				if err != nil {
					return err
				}
				return printJSON(a.stdout, b)
			}
			if len(results) == 0 {
				// No node was asked (every one that was and failed is the
				// error above): none is connected.
				fmt.Fprintln(a.stderr, "no node is connected")
				return nil
			}
			return r.render(a, results, cmdArgs)
		})
		cmd.AddCommand(sub)
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "exec NODE COMMAND [ARGS_JSON]",
		Short: "Run any node command and print its raw JSON result (progress goes to stderr)",
		Args:  idArgs("NODE", "COMMAND", "[ARGS_JSON]"),
		RunE: a.action(func(ctx context.Context, c *client.Client, args []string) error {
			var cargs any
			if len(args) == 3 {
				if !json.Valid([]byte(args[2])) {
					return usageError("ARGS_JSON is not valid JSON: %s", args[2])
				}
				cargs = json.RawMessage(args[2])
			}
			raw, err := c.Command(ctx, args[0], args[1], cargs, func(p json.RawMessage) error {
				return writeJSONLine(a.stderr, p)
			})
			if err != nil {
				return err
			}
			return printJSON(a.stdout, raw)
		}),
	})
	return cmd
}

// keyRefused tells an edge's refusal of the key itself (401, or 403
// without the admin scope node commands need), which every node would
// answer alike: it was a warning per node, then "no node answered".
func keyRefused(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && !ae.Foreign && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden)
}

// decodeEach decodes each node's result and hands it to fn. Of several
// nodes, one whose result does not decode (a node of another version, a
// broken one) is a warning on stderr, as a node that did not answer is:
// it failed the whole report, and the other nodes' rows were lost. One
// node's result, or every node's, that does not decode is the error.
func decodeEach[T any](a *app, results []nodeResult, fn func(node string, v T)) error {
	var lastErr error
	decoded := 0
	for _, r := range results {
		var v T
		if err := json.Unmarshal(r.raw, &v); err != nil {
			lastErr = fmt.Errorf("node %s: decode result: %w", r.node, err)
			if len(results) > 1 {
				fmt.Fprintf(a.stderr, "iop: warning: %s\n", printable(lastErr.Error()))
			}
			continue
		}
		decoded++
		fn(r.node, v)
	}
	switch {
	case decoded > 0:
		return nil
	case len(results) > 1:
		return fmt.Errorf("no node's result could be read (%d answered)", len(results))
	}
	return lastErr
}

func renderCaps(a *app, results []nodeResult, _ any) error {
	nt := newTable(a.stdout, "NODE", "VERSION", "PLATFORM", "HOSTNAME", "CONFIG")
	at := [][]string{{"NODE", "ADAPTER", "TYPE", "RUNS", "SESSIONS", "COMMANDS"}}
	err := decodeEach(a, results, func(node string, c nodecmd.Capabilities) {
		nt.row(node, c.Version, c.OS+"/"+c.Arch, c.Hostname, "v"+strconv.FormatUint(c.ConfigVersion, 10))
		for _, ad := range c.Adapters {
			sess := "no"
			if ad.Sessions {
				sess = "yes"
			}
			at = append(at, []string{node, ad.Name, ad.Type, fmt.Sprintf("%d/%d", ad.InFlight, ad.MaxConcurrency), sess, strings.Join(ad.Commands, ",")})
		}
	})
	if err != nil {
		return err
	}
	nt.flush()
	if len(at) > 1 {
		fmt.Fprintln(a.stdout)
		t := newTable(a.stdout)
		for _, row := range at {
			t.row(row...)
		}
		t.flush()
	}
	return nil
}

func renderTransport(a *app, results []nodeResult, _ any) error {
	now := a.now()
	t := newTable(a.stdout, "NODE", "CONNECTED", "RECONNECTS", "RTT", "FRAMES IN/OUT", "BYTES IN/OUT", "RUNS")
	err := decodeEach(a, results, func(node string, s nodecmd.TransportStatus) {
		since := "no"
		if s.Connected {
			since = "yes"
			if s.ConnectedSince != nil {
				since = ago(now, *s.ConnectedSince)
			}
		}
		t.row(node, since, strconv.FormatInt(s.Reconnects, 10), fmt.Sprintf("%.1fms", s.LastRTTMillis),
			fmt.Sprintf("%d/%d", s.FramesIn, s.FramesOut), humanBytes(s.BytesIn)+"/"+humanBytes(s.BytesOut), strconv.Itoa(s.RunsInFlight))
	})
	if err != nil {
		return err
	}
	t.flush()
	return nil
}

// renderUsage prints the runs of each node's adapters and, below them, the
// provider tunnels the edge relayed for each node (usage_status's
// "tunnels", which the edge adds): a node that only relays providers has
// all its usage there.
func renderUsage(a *app, results []nodeResult, _ any) error {
	t := newTable(a.stdout, "NODE", "ADAPTER", "RUNS", "OK", "FAILED", "CANCELLED", "RUNNING", "PROMPT", "COMPLETION", "TOTAL", "COST")
	tun := [][]string{{"NODE", "PROVIDER", "MODEL", "KEY", "TUNNELS", "ERRORS", "PROMPT", "COMPLETION", "TOTAL", "BYTES"}}
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	err := decodeEach(a, results, func(node string, u nodecmd.UsageStatus) {
		for _, x := range u.Adapters {
			t.row(node, x.Adapter, itoa(x.RunsTotal), itoa(x.Succeeded), itoa(x.Failed), itoa(x.Cancelled), itoa(x.Running),
				itoa(x.PromptTokens), itoa(x.CompletionTokens), itoa(x.TotalTokens), fmt.Sprintf("$%.4f", x.CostUSD))
		}
		for _, x := range u.Tunnels {
			tun = append(tun, []string{node, x.Provider, x.Model, x.Key, itoa(x.Requests), itoa(x.Errors),
				itoa(x.PromptTokens), itoa(x.CompletionTokens), itoa(x.TotalTokens), itoa(x.BodyBytes)})
		}
	})
	if err != nil {
		return err
	}
	t.flush()
	if len(tun) > 1 {
		fmt.Fprintln(a.stdout)
		tt := newTable(a.stdout)
		for _, row := range tun {
			tt.row(row...)
		}
		tt.flush()
	}
	return nil
}

// sessionFlags are the flags of iop node sessions: session_list's
// arguments (a page per node, newest first).
func sessionFlags(cmd *cobra.Command) func(one bool) (any, error) {
	var a nodecmd.SessionListArgs
	cmd.Flags().StringVar(&a.Adapter, "adapter", "", "only this adapter's sessions")
	cmd.Flags().IntVar(&a.Limit, "limit", 0, "at most this many sessions per node (node default 100, at most 1000)")
	cmd.Flags().StringVar(&a.Cursor, "cursor", "", "continue a node's listing (the cursor a previous page printed; name the NODE)")
	return func(one bool) (any, error) {
		if err := emptyFilters(cmd, "adapter"); err != nil {
			return nil, err
		}
		return a, checkPage(a.Limit, a.Cursor, one)
	}
}

func renderSessions(a *app, results []nodeResult, args any) error {
	var rows [][]string
	var more []string
	now := a.now()
	// The next page is asked with the same filter and page size (the
	// cursor holds only the position).
	var filters string
	q, _ := args.(nodecmd.SessionListArgs)
	if q.Adapter != "" {
		filters += " --adapter " + shellWord(q.Adapter)
	}
	if q.Limit > 0 {
		filters += " --limit " + strconv.Itoa(q.Limit)
	}
	err := decodeEach(a, results, func(node string, l nodecmd.SessionList) {
		// A node lists its sessions newest first. One that predates the
		// adapter filter ignores it: it is applied here too.
		for _, s := range l.Sessions {
			if q.Adapter != "" && s.Adapter != q.Adapter {
				continue
			}
			rows = append(rows, []string{node, s.Adapter, s.Target, s.SessionID, strconv.Itoa(s.Turns), ago(now, s.LastUsed)})
		}
		if l.NextCursor != "" {
			more = append(more, fmt.Sprintf("more sessions on node %s: iop node sessions %s%s --cursor %s", printable(node), shellWord(node), filters, shellWord(l.NextCursor)))
		}
	})
	if err != nil {
		return err
	}
	return writePages(a, "no sessions", []string{"NODE", "ADAPTER", "TARGET", "SESSION", "TURNS", "LAST USED"}, rows, more)
}

// nodeRunsFlags are the flags of iop node runs: the runs command's
// arguments (a page per node, newest first).
func nodeRunsFlags(cmd *cobra.Command) func(one bool) (any, error) {
	var a nodecmd.RunsArgs
	cmd.Flags().StringVar(&a.Adapter, "adapter", "", "only this adapter's runs")
	cmd.Flags().StringVar(&a.Status, "status", "", "only runs with this status (queued, running, succeeded, failed, cancelled)")
	cmd.Flags().IntVar(&a.Limit, "limit", 0, "at most this many runs per node (node default 50, at most 1000)")
	cmd.Flags().StringVar(&a.Cursor, "cursor", "", "continue a node's listing (the cursor a previous page printed; name the NODE)")
	return func(one bool) (any, error) {
		if err := emptyFilters(cmd, "adapter", "status"); err != nil {
			return nil, err
		}
		return a, checkPage(a.Limit, a.Cursor, one)
	}
}

func renderNodeRuns(a *app, results []nodeResult, args any) error {
	var rows [][]string
	var more []string
	now := a.now()
	// The next page is asked with the same filters and page size (the
	// cursor holds only the position).
	var filters string
	q, _ := args.(nodecmd.RunsArgs)
	if q.Adapter != "" {
		filters += " --adapter " + shellWord(q.Adapter)
	}
	if q.Status != "" {
		filters += " --status " + shellWord(q.Status)
	}
	if q.Limit > 0 {
		filters += " --limit " + strconv.Itoa(q.Limit)
	}
	err := decodeEach(a, results, func(node string, l nodecmd.RunList) {
		// A node lists its runs newest first. One that predates the
		// filters ignores them: they are applied here too.
		for _, r := range l.Runs {
			if (q.Adapter != "" && r.Adapter != q.Adapter) || (q.Status != "" && r.Status != q.Status) {
				continue
			}
			ri := runInfo(r)
			rows = append(rows, []string{node, r.RunID, r.Adapter, r.Target, r.Status, a.clock(r.CreatedAt), ri.duration(now), truncate(ri.errorText(), 60)})
		}
		if l.NextCursor != "" {
			more = append(more, fmt.Sprintf("more runs on node %s: iop node runs %s%s --cursor %s", printable(node), shellWord(node), filters, shellWord(l.NextCursor)))
		}
	})
	if err != nil {
		return err
	}
	return writePages(a, "no runs", []string{"NODE", "RUN", "ADAPTER", "TARGET", "STATUS", "CREATED", "DURATION", "ERROR"}, rows, more)
}

// checkPage checks the paging flags of a per-node listing: a cursor is
// one node's position, so it needs the NODE named.
func checkPage(limit int, cursor string, one bool) error {
	switch {
	case limit < 0:
		return usageError("--limit must not be negative")
	case cursor != "" && !one:
		return usageError("--cursor continues one node's listing: name the NODE")
	}
	return nil
}

// writePages prints the nodes' pages as one table (or none, when it is
// empty, on stderr), then each node's next-page hint on stderr.
func writePages(a *app, none string, header []string, rows [][]string, more []string) error {
	if len(rows) == 0 {
		fmt.Fprintln(a.stderr, none)
	} else {
		t := newTable(a.stdout, header...)
		for _, r := range rows {
			t.row(r...)
		}
		t.flush()
	}
	for _, m := range more {
		fmt.Fprintln(a.stderr, m)
	}
	return nil
}

// resolveNode picks the node for a command: the named one, else the only
// connected node, else the only one with an adapter of type adapterType.
func resolveNode(ctx context.Context, c *client.Client, node, adapterType string) (string, error) {
	if node != "" {
		return node, nil
	}
	nodes, err := connectedNodes(ctx, c)
	if err != nil {
		return "", err
	}
	switch len(nodes) {
	case 0:
		return "", &client.APIError{Code: "no_node_available", Message: "no node is connected"}
	case 1:
		return nodes[0].ID, nil
	}
	var fit []string
	for _, n := range nodes {
		for _, ad := range n.Adapters {
			if ad.Type == adapterType {
				fit = append(fit, n.ID)
				break
			}
		}
	}
	if len(fit) == 1 {
		return fit[0], nil
	}
	var ids []string
	for _, n := range nodes {
		ids = append(ids, n.ID)
	}
	return "", usageError("%d nodes are connected (%s): name one with --node", len(nodes), strings.Join(ids, ", "))
}
