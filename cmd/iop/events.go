package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"iop/cmd/iop/internal/client"
)

func (a *app) eventsCmd() *cobra.Command {
	var types []string
	var cmd *cobra.Command
	cmd = &cobra.Command{
		Use:   "events [--type T]…",
		Short: "Follow the edge's event feed (node lifecycle, run events, tunnels)",
		Long: `Follow the edge's event feed, one line per event, until Ctrl-C (exit 130).
--type keeps only the given types (node.registered, node.rejected,
node.draining, node.disconnected, node.config_refreshed, run.event,
tunnel.completed, config.reloaded); a trailing * matches a prefix, e.g.
--type 'node.*'. Events the edge dropped because this command read too
slowly are reported on stderr: "iop: warning: the edge dropped N events".
The feed is not resumed: when the edge stops or the connection breaks, iop
says so and exits 1 (events meanwhile are not replayed; start it again).`,
		Args: cobra.NoArgs,
		RunE: a.action(func(ctx context.Context, c *client.Client, _ []string) error {
			if err := emptyFilters(cmd, "type"); err != nil {
				return err
			}
			var ts []string
			for _, t := range types {
				for p := range strings.SplitSeq(t, ",") {
					if p = strings.TrimSpace(p); p != "" {
						ts = append(ts, p)
					}
				}
			}
			return c.Events(ctx, ts, func(ev client.BusEvent) error {
				if a.json {
					return writeJSONLine(a.stdout, ev.Raw)
				}
				_, err := fmt.Fprintln(a.stdout, a.formatEvent(ev))
				return err
			}, func(n uint64) {
				// On stderr, so that --json's stdout stays JSON lines.
				fmt.Fprintf(a.stderr, "iop: warning: the edge dropped %d events\n", n)
			})
		}),
	}
	cmd.Flags().StringArrayVar(&types, "type", nil, "only events of this type (repeatable, or comma-separated)")
	return cmd
}

// formatEvent renders a bus event on one line.
func (a *app) formatEvent(ev client.BusEvent) string {
	var b strings.Builder
	b.WriteString(ev.Time.In(a.loc).Format("15:04:05.000"))
	b.WriteString(" ")
	b.WriteString(bare(ev.Type))
	// Values are names and ids, printed bare; one with a space or a
	// control byte (a model name a caller chose, say) is quoted.
	kv := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, " %s=%s", k, bare(v))
		}
	}
	kv("node", ev.Node)
	kv("remote", ev.Remote)
	if r := ev.Run; r != nil {
		kv("run", r.RunID)
		fmt.Fprintf(&b, " #%d %s", r.Seq, bare(r.Type))
		if r.Text != "" {
			b.WriteString(" " + strconv.Quote(truncate(r.Text, 80)))
		}
		if r.Error != nil {
			// The message comes from a node or an agent's output and may hold
			// newlines or terminal escapes: quoted, it stays on the event's
			// one line and prints no control bytes.
			b.WriteString(" " + bare(r.Error.Code))
			if r.Error.Message != "" {
				b.WriteString(": " + quoteShort(r.Error.Message))
			}
		}
		if s := strings.TrimPrefix(usageSummary(r.Usage), ": "); s != "" {
			b.WriteString(" (" + s + ")")
		}
	}
	if t := ev.Tunnel; t != nil {
		kv("tunnel", t.ID)
		kv("provider", t.Provider)
		kv("model", t.Model)
		kv("path", t.Path)
		if t.Status != 0 {
			kv("status", strconv.Itoa(t.Status))
		}
		kv("bytes", strconv.FormatInt(t.BodyBytes, 10))
		kv("duration", fmt.Sprintf("%dms", t.DurationMS))
		if s := strings.TrimPrefix(usageSummary(t.Usage), ": "); s != "" {
			b.WriteString(" (" + s + ")")
		}
		if t.Error != "" {
			b.WriteString(" error=" + quoteShort(t.Error))
		}
	}
	if ev.Reason != "" {
		b.WriteString(" reason=" + strconv.Quote(ev.Reason))
	}
	return b.String()
}

// quoteShort quotes a free text (an error message) for one line of output:
// at most 200 characters, runs of whitespace as one space, control bytes
// escaped.
func quoteShort(s string) string { return strconv.Quote(truncate(s, 200)) }

// bare prints a word (an error code) as it is, unless it holds a space, a
// quote or a byte that is not printable: that one is quoted, so a hostile
// value cannot break the line either.
func bare(s string) string {
	for _, r := range s {
		if r == ' ' || r == '"' || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
