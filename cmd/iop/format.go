package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rivo/uniseg"

	"iop/cmd/iop/internal/client"
)

// table writes aligned columns; call flush when done. A write that fails
// is the command's failure through app.run's stdout, which keeps the
// first error. Columns are as wide as their widest cell on a terminal
// (uniseg.StringWidth: a CJK character takes two columns, a combining mark
// none), two spaces apart; the last column is not padded. text/tabwriter
// counted runes, so every column after an id with a wide character was
// shifted.
type table struct {
	w    io.Writer
	rows [][]string
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{w: w}
	if len(header) > 0 {
		t.row(header...)
	}
	return t
}

func (t *table) row(cols ...string) {
	cells := make([]string, len(cols))
	for i, c := range cols {
		// Whitespace that would break the row becomes a space; what is
		// left that a terminal would act on is escaped.
		cells[i] = printable(strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace(c))
		if cells[i] == "" {
			cells[i] = "-"
		}
	}
	t.rows = append(t.rows, cells)
}

func (t *table) flush() {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i == len(r)-1 {
				break // the last column is not padded
			}
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], uniseg.StringWidth(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-uniseg.StringWidth(c)+2))
			}
		}
		b.WriteByte('\n')
	}
	t.rows = nil
	_, _ = io.WriteString(t.w, b.String())
}

// printable returns text that came from the edge, a node or a provider
// (names, reasons, error messages) fit to be shown on a terminal: every rune
// that is not printable is written as a Go escape ("\x1b", "\n", "\u202e")
// and every byte that is not UTF-8 as "\xff". Raw, such text could move the
// cursor, clear the screen, set the window title, reverse the order of what
// follows it (bidi overrides) or forge lines of output. A run's own output
// is not passed through it: that is the program's, byte for byte.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case strconv.IsPrint(r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// shellWord is s (through printable) as one word of a POSIX shell command
// line, for the next-page commands iop prints to be pasted as they are: a
// value with a space or a shell character ("--session chat 1") is single
// quoted, or the pasted command read other words than the ones asked.
func shellWord(s string) string {
	s = printable(s)
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.,:/@%+=", r)))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// ago renders how long before now t was ("5m ago"); "-" for a zero time.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// humanBytes renders a size in decimal units, as Ollama does ("4.7 GB").
func humanBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "kMGTPE"[exp])
}

// shortDuration renders d for humans: "850ms", "1.2s", "3m4s".
func shortDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func (a *app) clock(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.In(a.loc).Format("2006-01-02 15:04:05")
}

func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// printJSON writes raw JSON indented, one value per call.
func printJSON(w io.Writer, raw []byte) error {
	var b bytes.Buffer
	if err := json.Indent(&b, bytes.TrimSpace(raw), "", "  "); err != nil {
		// Not JSON after all: print it as it came.
		b.Reset()
		b.Write(bytes.TrimSpace(raw))
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

// call makes one API request. With --json it prints the answer as it came
// and reports printed; otherwise the caller decodes raw for its table. An
// answer without each of need (fields the command shows, as non-empty
// strings) is reported as not the edge's (client.CallFor).
func (a *app) call(ctx context.Context, c *client.Client, method, path string, q url.Values, need ...string) (raw json.RawMessage, printed bool, err error) {
	if err := c.CallFor(ctx, method, path, q, nil, &raw, need...); err != nil {
		return nil, false, err
	}
	if a.json {
		return nil, true, printJSON(a.stdout, raw)
	}
	return raw, false, nil
}

// writeJSONLine writes v as one line of compact JSON.
func writeJSONLine(w io.Writer, v any) error {
	var b []byte
	var err error
	switch x := v.(type) {
	case json.RawMessage:
		var buf bytes.Buffer
		if err = json.Compact(&buf, x); err != nil {
			return err
		}
		b = buf.Bytes()
	default:
		if b, err = json.Marshal(v); err != nil {
			return err
		}
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
