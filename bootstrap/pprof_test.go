package bootstrap_test

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"iop/bootstrap"
)

// --pprof answers only requests addressed to loopback (a DNS-rebinding page
// names its own host) and serves no cmdline, whose argv may hold a node's
// --token.
func TestPprofChecksHostAndServesNoCmdline(t *testing.T) {
	addr := freeAddr(t)
	stop, err := bootstrap.StartPprof(addr, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	get := func(path, host string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline", "/debug/pprof/symbol"} {
		if code, body := get(path, "attacker.example"); code != http.StatusMisdirectedRequest || !strings.Contains(body, "host_not_allowed") {
			t.Errorf("GET %s with Host attacker.example: %d %.200q; want 421 host_not_allowed", path, code, body)
		}
	}
	for _, host := range []string{addr, "localhost"} {
		if code, body := get("/debug/pprof/", host); code != http.StatusOK || !strings.Contains(body, "goroutine") {
			t.Errorf("GET /debug/pprof/ with Host %s: %d %.200s", host, code, body)
		}
	}
	if code, body := get("/debug/pprof/cmdline", addr); code != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/cmdline: %d %.200q; want 404", code, body)
	}
}
