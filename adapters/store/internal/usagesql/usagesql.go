// Package usagesql is the SQL both stores (the node's and the edge's
// history) sum usage numbers with: each row's number within the bounds
// the stores write (domain.MaxUsageTokens, domain.MaxUsageCostUSD), so a
// row written before a store clamped what it was given cannot overflow a
// sum or make it a float, NaN or infinite.
package usagesql

import (
	"strconv"

	"iop/domain"
)

// Tokens is an SQL expression of the token count col within [0,
// domain.MaxUsageTokens]; NULL stays NULL on SQLite and is 0 on
// PostgreSQL, which both sum alike.
func Tokens(col string, postgres bool) string {
	return bounded(col, "0", strconv.FormatInt(domain.MaxUsageTokens, 10), postgres)
}

// Cost is an SQL expression of the cost col within [0,
// domain.MaxUsageCostUSD]. Literals of the column's type: SQLite's
// MAX(cost_usd, 0) of a negative cost is the integer 0, and a sum of
// those an integer, not a float.
func Cost(col string, postgres bool) string {
	return bounded(col, "0.0", strconv.FormatFloat(domain.MaxUsageCostUSD, 'e', -1, 64), postgres)
}

func bounded(col, lo, hi string, postgres bool) string {
	if postgres {
		return "LEAST(GREATEST(" + col + ", " + lo + "), " + hi + ")"
	}
	return "MIN(MAX(" + col + ", " + lo + "), " + hi + ")" // SQLite's scalar min and max
}
