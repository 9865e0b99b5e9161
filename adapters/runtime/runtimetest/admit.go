package runtimetest

import (
	"testing"

	"iop/domain"
	"iop/ports"
)

// AdmitRefusesABlankPrompt checks a CLI agent adapter's admission: an
// empty or blank prompt is refused with invalid_request before the run
// starts, and a prompt is admitted.
func AdmitRefusesABlankPrompt(t *testing.T, a ports.RunAdmitter) {
	t.Helper()
	for _, in := range []string{"", " \n\t"} {
		if err := a.Admit(domain.RunRequest{Input: []byte(in)}); domain.CodeOf(err) != domain.CodeInvalidRequest {
			t.Errorf("admitting prompt %q: %v, want invalid_request", in, err)
		}
	}
	if err := a.Admit(domain.RunRequest{Input: []byte("hi")}); err != nil {
		t.Errorf("admitting a prompt: %v", err)
	}
}
