// Package usagesql is the SQL both stores (the node's and the edge's
// history) sum usage numbers with: each row's number within the bounds
// the stores write (domain.MaxUsageTokens, domain.MaxUsageCostUSD), so a
// row written before a store clamped what it was given cannot overflow a
// sum or make it a float, NaN or infinite (a NaN or infinite cost counts 0).
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
//
// A NaN or infinite cost (which a PostgreSQL history could hold from before
// costs were bounded; SQLite stores no NaN, but infinities) counts 0, as
// domain.BoundCost makes it when it is written: PostgreSQL orders NaN above
// every number, so LEAST(GREATEST(NaN, 0), hi) alone would be hi.
func Cost(col string, postgres bool) string {
	b := bounded(col, "0.0", strconv.FormatFloat(domain.MaxUsageCostUSD, 'e', -1, 64), postgres)
	nonFinite := "9e999, -9e999" // SQLite reads these literals as ±Inf
	if postgres {
		nonFinite = "'NaN'::float8, 'Infinity'::float8, '-Infinity'::float8"
	}
	return "(CASE WHEN " + col + " IN (" + nonFinite + ") THEN 0.0 ELSE " + b + " END)"
}

func bounded(col, lo, hi string, postgres bool) string {
	if postgres {
		return "LEAST(GREATEST(" + col + ", " + lo + "), " + hi + ")"
	}
	return "MIN(MAX(" + col + ", " + lo + "), " + hi + ")" // SQLite's scalar min and max
}
