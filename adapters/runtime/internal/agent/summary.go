package agent

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// MaxSummary is the most text a tool-use or tool-result summary keeps of
// any one string (and of raw JSON that is too large to keep whole).
const MaxSummary = 2 << 10

// Truncate cuts s to at most max bytes at a rune boundary, appending "…"
// when it cut; ok reports whether it did.
func Truncate(s string, max int) (out string, cut bool) {
	if len(s) <= max {
		return s, false
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…", true
}

// ShrinkJSON returns raw with every string longer than MaxSummary bytes
// truncated, so a summary keeps its shape but not a whole file's content.
// If the result is still larger than 8×MaxSummary, it is replaced by a JSON
// string holding the first MaxSummary bytes of its text. Invalid JSON is
// returned as a truncated string.
func ShrinkJSON(raw json.RawMessage) json.RawMessage {
	if len(raw) <= MaxSummary {
		return raw
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return asString(string(raw))
	}
	out, err := Marshal(shrink(v))
	if err != nil || len(out) > 8*MaxSummary {
		return asString(string(raw))
	}
	return out
}

func shrink(v any) any {
	switch x := v.(type) {
	case string:
		s, _ := Truncate(x, MaxSummary)
		return s
	case []any:
		for i := range x {
			x[i] = shrink(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = shrink(x[k])
		}
	}
	return v
}

func asString(s string) json.RawMessage {
	t, _ := Truncate(s, MaxSummary)
	b, _ := Marshal(t)
	return b
}
