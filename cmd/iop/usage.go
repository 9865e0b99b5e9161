package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/spf13/cobra"

	"iop/cmd/iop/internal/client"
)

// usageTotal is one group of GET /v1/usage.
type usageTotal struct {
	Group            string  `json:"group"`
	Runs             int64   `json:"runs"`
	Tunnels          int64   `json:"tunnels"`
	Requests         int64   `json:"requests"`
	Errors           int64   `json:"errors"`
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	TotalTokens      int64   `json:"total_tokens"`
	CostUSD          float64 `json:"cost_usd"`
	BodyBytes        int64   `json:"body_bytes"`
}

func (a *app) usageCmd() *cobra.Command {
	var groupBy, since, until string
	var cmd *cobra.Command
	cmd = &cobra.Command{
		Use:   "usage [--by key|node|model|day] [--since T] [--until T]",
		Short: "Sum runs and tunnels from the edge's history: requests, errors, tokens, cost, bytes",
		Long: "Sum runs and provider tunnels recorded by the edge, grouped by caller key, node, model or UTC day.\n" +
			"--since and --until take an RFC 3339 time or a date (YYYY-MM-DD), which is 00:00 UTC.",
		Args: cobra.NoArgs,
		RunE: a.action(func(ctx context.Context, c *client.Client, _ []string) error {
			if err := emptyFilters(cmd, "since", "until"); err != nil {
				return err
			}
			switch groupBy {
			case "key", "node", "model", "day":
			default:
				return usageError("--by must be key, node, model or day, not %q", groupBy)
			}
			q := url.Values{"group_by": {groupBy}}
			if since != "" {
				q.Set("since", since)
			}
			if until != "" {
				q.Set("until", until)
			}
			raw, printed, err := a.call(ctx, c, http.MethodGet, "/v1/usage", q)
			if err != nil || printed {
				return err
			}
			var out struct {
				Usage []usageTotal `json:"usage"`
			}
			if err := json.Unmarshal(raw, &out); err != nil {
				return fmt.Errorf("decode usage: %w", err)
			}
			if len(out.Usage) == 0 {
				fmt.Fprintln(a.stderr, "no usage recorded")
				return nil
			}
			t := newTable(a.stdout, groupHeader(groupBy), "REQUESTS", "RUNS", "TUNNELS", "ERRORS", "PROMPT", "COMPLETION", "TOKENS", "COST_USD", "BYTES")
			for _, u := range out.Usage {
				g := u.Group
				if g == "" {
					g = "-"
				}
				t.row(g, strconv.FormatInt(u.Requests, 10), strconv.FormatInt(u.Runs, 10), strconv.FormatInt(u.Tunnels, 10),
					strconv.FormatInt(u.Errors, 10), strconv.FormatInt(u.PromptTokens, 10), strconv.FormatInt(u.CompletionTokens, 10),
					strconv.FormatInt(u.TotalTokens, 10), strconv.FormatFloat(u.CostUSD, 'f', 4, 64), strconv.FormatInt(u.BodyBytes, 10))
			}
			t.flush()
			return nil
		}),
	}
	cmd.Flags().StringVar(&groupBy, "by", "key", "group by key, node, model or day")
	cmd.Flags().StringVar(&since, "since", "", "only what started at or after this time")
	cmd.Flags().StringVar(&until, "until", "", "only what started before this time")
	return cmd
}

func groupHeader(by string) string {
	switch by {
	case "key":
		return "KEY"
	case "node":
		return "NODE"
	case "model":
		return "MODEL"
	}
	return "DAY"
}
