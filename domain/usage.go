package domain

import "math"

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
