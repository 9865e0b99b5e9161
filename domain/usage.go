package domain

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// Bounds of a usage number as the stores keep and sum it, per run or
// tunnel. Nodes, providers and CLI agents report these numbers, and one
// absurd report (tokens near the int64 maximum, a cost of 1e308) overflowed
// every sum over it, so the usage a store answers failed for its whole
// retention. No real run comes near them: 10^12 tokens leaves room for 9
// million such rows in one int64 sum.
const (
	MaxUsageTokens  int64   = 1_000_000_000_000
	MaxUsageCostUSD float64 = 1e9
)

// BoundTokens is a reported token count within [0, MaxUsageTokens]: a
// negative count is 0.
func BoundTokens(n int64) int64 { return min(max(n, 0), MaxUsageTokens) }

// BoundCost is a reported cost within [0, MaxUsageCostUSD]: a NaN or
// infinity (a node's or a provider's bug) is 0, and so is a negative cost.
// SQLite stores NaN as NULL and PostgreSQL keeps it, so every sum over it
// is NaN, which JSON cannot encode.
func BoundCost(c float64) float64 {
	if math.IsNaN(c) || math.IsInf(c, 0) || c < 0 {
		return 0
	}
	return min(c, MaxUsageCostUSD)
}

// Bounded returns u with its token counts and cost within the bounds
// (BoundTokens, BoundCost); a total left unreported stays 0.
func (u Usage) Bounded() Usage {
	u.PromptTokens, u.CompletionTokens, u.TotalTokens = BoundTokens(u.PromptTokens), BoundTokens(u.CompletionTokens), BoundTokens(u.TotalTokens)
	u.CostUSD = BoundCost(u.CostUSD)
	return u
}

// AddTokens is a + b, saturating at the int64 limits instead of wrapping:
// an adapter that adds counts a provider reported (prompt and completion
// into a total, a turn's calls into its sum) must not turn an absurd
// report into a negative one.
func AddTokens(a, b int64) int64 {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// ParseCount reads a number a provider or a server reports (a token count,
// a duration in nanoseconds) from its JSON: an integer, or one written
// otherwise — 3.0, 3e2, "3" — as some OpenAI-compatible servers do,
// saturating at the int64 limits. Anything else (null, text, NaN) is 0,
// never an error: one odd field must not lose the others beside it.
// Negative counts are kept; callers bound them (BoundTokens).
func ParseCount(b []byte) int64 {
	if n, ok := smallInt(b); ok {
		return n // nearly every count: no allocation
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if json.Unmarshal(b, &s) != nil {
			return 0
		}
		b = []byte(strings.TrimSpace(s))
	}
	if n, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		return n
	}
	f, err := strconv.ParseFloat(string(b), 64)
	switch {
	case err != nil || math.IsNaN(f):
		return 0
	case f >= math.MaxInt64:
		return math.MaxInt64
	case f <= math.MinInt64:
		return math.MinInt64
	}
	return int64(f)
}

// smallInt is b as a JSON integer of at most 18 digits (no overflow).
func smallInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, false
		}
		n = n*10 + int64(d-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}
