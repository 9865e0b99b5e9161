package edgestore

import (
	"math"
	"strings"
	"testing"

	"iop/domain"
)

// The usage of a group is its runs' sums and its tunnels' added: each fits
// (the database checks), their total may not, and is refused as a sum
// the database refused is, never wrapped negative.
func TestUsageTotalsThatWouldWrapAreRefused(t *testing.T) {
	half := int64(math.MaxInt64/2 + 1)
	for _, col := range []string{"prompt", "completion", "total", "body"} {
		r := usageRow{Group: "k", N: 1}
		switch col {
		case "prompt":
			r.PromptTokens = half
		case "completion":
			r.CompletionTokens = half
		case "total":
			r.TotalTokens = half
		case "body":
			r.BodyBytes = half
		}
		got, err := addTotals(domain.GroupByKey, []usageRow{r}, []usageRow{r})
		if domain.CodeOf(err) != domain.CodeInvalidRequest || !strings.Contains(err.Error(), "narrow since and until") {
			t.Fatalf("%s: %+v, %v; want invalid_request", col, got, err)
		}
	}
	// Totals that fit are added.
	r := usageRow{Group: "k", N: 2, Errors: 1, PromptTokens: half - 1, BodyBytes: 7}
	got, err := addTotals(domain.GroupByKey, []usageRow{r}, []usageRow{{Group: "k", N: 1, PromptTokens: half}})
	if err != nil || len(got) != 1 || got[0].PromptTokens != math.MaxInt64 || got[0].Requests != 3 || got[0].Runs != 2 || got[0].Tunnels != 1 {
		t.Fatalf("%+v, %v", got, err)
	}
}
