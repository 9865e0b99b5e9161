package requestid_test

import (
	"net/http"
	"regexp"
	"testing"

	"iop/adapters/internal/requestid"
)

var shape = regexp.MustCompile(`^req_[0-9A-Za-z]{24}$`)

func TestNewHasAnthropicsShapeAndIsUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		id := requestid.New()
		if !shape.MatchString(id) {
			t.Fatalf("id %q is not req_ and 24 alphanumerics", id)
		}
		if seen[id] {
			t.Fatalf("id %q made twice", id)
		}
		seen[id] = true
	}
}

func TestStampKeepsAnIDAlreadySet(t *testing.T) {
	h := http.Header{}
	id := requestid.Stamp(h)
	if !shape.MatchString(id) || h.Get("request-id") != id {
		t.Fatalf("Stamp = %q, header %v", id, h)
	}
	if again := requestid.Stamp(h); again != id || len(h.Values("request-id")) != 1 {
		t.Fatalf("a second Stamp = %q (first %q), header %v", again, id, h)
	}
}
