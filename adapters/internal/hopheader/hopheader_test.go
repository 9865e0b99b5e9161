package hopheader

import (
	"net/http"
	"testing"
)

func TestListedReadsEveryConnectionLine(t *testing.T) {
	h := http.Header{"Connection": {"keep-alive, x-private"}, "connection": {" Upgrade ,,x-other"}, "X-Private": {"1"}}
	got := Listed(h)
	for _, want := range []string{"Keep-Alive", "X-Private", "Upgrade", "X-Other"} {
		if !got[want] {
			t.Errorf("Listed(%v) lacks %s: %v", h, want, got)
		}
	}
	if len(got) != 4 {
		t.Errorf("Listed = %v, want 4 names", got)
	}
	if Listed(http.Header{"Content-Type": {"a"}}) != nil {
		t.Error("a header without Connection listed names")
	}
	if !Hop("X-Private", got) || !Hop("Transfer-Encoding", nil) || Hop("Content-Type", got) {
		t.Error("Hop disagrees with the hop-by-hop set and the listed names")
	}
}

func TestCallerOnly(t *testing.T) {
	for _, k := range []string{"Authorization", "X-Api-Key", "Api-Key", "Cookie", "Host", "Content-Length", "Accept-Encoding", "Expect", "X-Iop-Node"} {
		if !CallerOnly(k) {
			t.Errorf("%s would reach the provider", k)
		}
	}
	for _, k := range []string{"Content-Type", "Anthropic-Version", "Openai-Beta", "User-Agent"} {
		if CallerOnly(k) {
			t.Errorf("%s would be kept from the provider", k)
		}
	}
}
