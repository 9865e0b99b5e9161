package bootstrap_test

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// A reload SIGHUP asks for that the file refuses is logged once, as the
// reload use case logs it: the signal's handler logged the same refusal
// again ("SIGHUP reload failed"), two error lines for one event.
func TestRefusedHangupReloadIsLoggedOnce(t *testing.T) {
	e := startFileEdge(t, keyOnGPU1File)
	e.write(t, keyOnGPU1File+"bogus_key: 1\n")
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	const refused = "reload rejected; old config stays in force"
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(e.logs.String(), refused) {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal logged for the SIGHUP reload:\n%s", e.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a second line would follow at once
	logs := e.logs.String()
	if n := strings.Count(logs, "level=ERROR"); n != 1 || !strings.Contains(logs, `bogus_key`) {
		t.Fatalf("%d error lines for one refused reload, want 1 naming the bad key:\n%s", n, logs)
	}
}
