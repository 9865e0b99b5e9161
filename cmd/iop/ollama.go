package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"iop/cmd/iop/internal/client"
	"iop/domain/nodecmd"
)

func (a *app) ollamaCmd() *cobra.Command {
	var node, adapter string
	cmd := &cobra.Command{
		Use:   "ollama",
		Short: "Manage the models of a node's Ollama (pull, list, ps, show, delete, version)",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE(a),
	}
	cmd.PersistentFlags().StringVar(&node, "node", "", "node (default: the only node, or the only one with an ollama adapter)")
	cmd.PersistentFlags().StringVar(&adapter, "adapter", "", "ollama adapter on the node, when it has several")
	cmd.PersistentPreRunE = func(sub *cobra.Command, _ []string) error {
		return emptyFlags(sub, "the default", "node", "adapter")
	}

	// call runs the ollama.* command name and hands the JSON result to render.
	call := func(name string, nargs int, render func(node string, args []string, raw json.RawMessage) error) func(*cobra.Command, []string) error {
		return a.action(func(ctx context.Context, c *client.Client, args []string) error {
			n, err := resolveNode(ctx, c, node, "ollama")
			if err != nil {
				return err
			}
			oa := nodecmd.OllamaArgs{Selector: nodecmd.Selector{Adapter: adapter}}
			if nargs == 1 {
				oa.Model = args[0]
			}
			raw, err := c.Command(ctx, n, name, oa, nil)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout, raw)
			}
			return render(n, args, raw)
		})
	}

	cmd.AddCommand(&cobra.Command{
		Use:   "pull MODEL",
		Short: "Pull a model, showing download progress",
		Args:  idArgs("MODEL"),
		RunE: a.action(func(ctx context.Context, c *client.Client, args []string) error {
			n, err := resolveNode(ctx, c, node, "ollama")
			if err != nil {
				return err
			}
			view := &pullView{w: a.stdout, errw: a.stderr, tty: a.stdoutTTY, json: a.json, bars: map[string]*progressbar.ProgressBar{}}
			raw, err := c.Command(ctx, n, nodecmd.CmdOllamaPull, nodecmd.OllamaArgs{Model: args[0], Selector: nodecmd.Selector{Adapter: adapter}}, view.progress)
			view.endBar()
			if err != nil {
				return err
			}
			if a.json {
				return writeJSONLine(a.stdout, raw)
			}
			var res nodecmd.OllamaStatus
			_ = json.Unmarshal(raw, &res)
			if st := printable(res.Status); st != "" && st != view.lastStatus {
				fmt.Fprintln(a.stdout, st)
			}
			fmt.Fprintf(a.stdout, "pulled %s on node %s\n", printable(args[0]), printable(n))
			return nil
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the models a node's Ollama has",
		Args:  cobra.NoArgs,
		RunE: call(nodecmd.CmdOllamaList, 0, func(_ string, _ []string, raw json.RawMessage) error {
			var l nodecmd.OllamaModelList
			if err := json.Unmarshal(raw, &l); err != nil {
				return fmt.Errorf("decode model list: %w", err)
			}
			now := a.now()
			t := newTable(a.stdout, "NAME", "SIZE", "MODIFIED")
			for _, m := range l.Models {
				t.row(m.Name, humanBytes(m.Size), ago(now, m.ModifiedAt))
			}
			t.flush()
			return nil
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "ps",
		Short: "List the models loaded in a node's Ollama",
		Args:  cobra.NoArgs,
		RunE: call(nodecmd.CmdOllamaPS, 0, func(_ string, _ []string, raw json.RawMessage) error {
			var l nodecmd.OllamaRunningList
			if err := json.Unmarshal(raw, &l); err != nil {
				return fmt.Errorf("decode model list: %w", err)
			}
			t := newTable(a.stdout, "NAME", "SIZE", "VRAM", "UNTIL")
			for _, m := range l.Models {
				t.row(m.Name, humanBytes(m.Size), humanBytes(m.SizeVRAM), a.clock(m.ExpiresAt))
			}
			t.flush()
			return nil
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "show MODEL",
		Short: "Show a model's details",
		Args:  idArgs("MODEL"),
		RunE: call(nodecmd.CmdOllamaShow, 1, func(_ string, args []string, raw json.RawMessage) error {
			var s nodecmd.OllamaShow
			if err := json.Unmarshal(raw, &s); err != nil {
				return fmt.Errorf("decode model: %w", err)
			}
			t := newTable(a.stdout)
			t.row("model:", args[0])
			t.row("family:", s.Details.Family)
			t.row("parameters:", s.Details.ParameterSize)
			t.row("quantization:", s.Details.QuantizationLevel)
			t.row("format:", s.Details.Format)
			t.row("capabilities:", strings.Join(s.Capabilities, ", "))
			t.flush()
			return nil
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "delete MODEL",
		Short: "Delete a model from a node's Ollama",
		Args:  idArgs("MODEL"),
		RunE: call(nodecmd.CmdOllamaDelete, 1, func(n string, args []string, _ json.RawMessage) error {
			fmt.Fprintf(a.stdout, "deleted %s on node %s\n", printable(args[0]), printable(n))
			return nil
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Show the version of a node's Ollama",
		Args:  cobra.NoArgs,
		RunE: call(nodecmd.CmdOllamaVersion, 0, func(n string, _ []string, raw json.RawMessage) error {
			var v nodecmd.OllamaVersion
			if err := json.Unmarshal(raw, &v); err != nil {
				return fmt.Errorf("decode version: %w", err)
			}
			fmt.Fprintf(a.stdout, "ollama %s on node %s\n", printable(v.Version), printable(n))
			return nil
		}),
	})
	return cmd
}

// pullView renders ollama pull progress: one progress bar (bytes and
// percentage) per layer digest on a terminal; status lines, and a
// percentage every 10% per layer, otherwise.
type pullView struct {
	w, errw io.Writer
	tty     bool
	json    bool

	bars       map[string]*progressbar.ProgressBar
	current    *progressbar.ProgressBar
	lastStatus string // as shown: printable
	lastDecile map[string]int64
}

func (p *pullView) progress(raw json.RawMessage) error {
	if p.json {
		return writeJSONLine(p.w, raw)
	}
	var pr nodecmd.OllamaPullProgress
	if err := json.Unmarshal(raw, &pr); err != nil {
		return nil // not ours to judge; the final result decides
	}
	if pr.Error != "" {
		p.endBar()
		fmt.Fprintf(p.errw, "iop: %s\n", printable(pr.Error))
		return nil
	}
	if pr.Digest != "" && pr.Total > 0 {
		if p.tty {
			p.bar(pr)
		} else {
			p.percent(pr)
		}
		return nil
	}
	p.endBar()
	p.status(pr.Status)
	return nil
}

func (p *pullView) status(s string) {
	s = printable(s)
	if s != "" && s != p.lastStatus {
		fmt.Fprintln(p.w, s)
		p.lastStatus = s
	}
}

func (p *pullView) bar(pr nodecmd.OllamaPullProgress) {
	b := p.bars[pr.Digest]
	if b == nil {
		p.endBar()
		desc := printable(pr.Status)
		if desc == "" {
			desc = "pulling " + printable(shortDigest(pr.Digest))
		}
		b = progressbar.NewOptions64(pr.Total,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetDescription(desc),
			progressbar.OptionShowBytes(true),
			progressbar.OptionShowCount(),
			progressbar.OptionShowTotalBytes(true),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(p.w) }),
		)
		p.bars[pr.Digest] = b
		p.lastStatus = desc
	} else if b != p.current {
		p.endBar()
	}
	p.current = b
	if b.GetMax64() != pr.Total {
		b.ChangeMax64(pr.Total)
	}
	_ = b.Set64(min(max(pr.Completed, 0), pr.Total))
	if pr.Completed >= pr.Total {
		p.current = nil
	}
}

// endBar leaves the line of an unfinished bar so the next output starts
// on its own line.
func (p *pullView) endBar() {
	if p.current != nil && !p.current.IsFinished() {
		fmt.Fprintln(p.w)
	}
	p.current = nil
}

func (p *pullView) percent(pr nodecmd.OllamaPullProgress) {
	if p.lastDecile == nil {
		p.lastDecile = map[string]int64{}
	}
	// Held to 0–total as the bar holds it: a count past the total (or
	// below 0) printed 150% or -5%.
	done := min(max(pr.Completed, 0), pr.Total)
	d := scaled(done, pr.Total, 10)
	if last, ok := p.lastDecile[pr.Digest]; ok && last == d {
		return
	}
	p.lastDecile[pr.Digest] = d
	label := printable(pr.Status)
	if label == "" {
		label = "pulling " + printable(shortDigest(pr.Digest))
	}
	fmt.Fprintf(p.w, "%s: %d%% (%s/%s)\n", label, scaled(done, pr.Total, 100), humanBytes(done), humanBytes(pr.Total))
	p.lastStatus = label
}

// scaled is done*scale/total, rounded down, for 0 <= done <= total and
// total > 0, without the overflow of done*scale in int64: a total past
// 2^63/100 bytes printed negative percentages.
func scaled(done, total int64, scale uint64) int64 {
	hi, lo := bits.Mul64(uint64(done), scale)
	q, _ := bits.Div64(hi, lo, uint64(total))
	return int64(q)
}

func shortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		return d[:12]
	}
	return d
}
