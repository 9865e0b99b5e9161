package tlsca

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Each of Run's checks warns while the CA nears its end and, once a
// running edge's CA has passed it, logs an error saying how to rotate it.
func TestRunsCheckWarnsThenErrs(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	clock := start
	var log bytes.Buffer
	m, err := Open(Options{Dir: dir, Hosts: []string{"localhost"}, CAValidity: 40 * 24 * time.Hour,
		Now: func() time.Time { return clock }, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	m.check()
	if strings.Contains(log.String(), "level=WARN") || strings.Contains(log.String(), "level=ERROR") {
		t.Fatalf("a CA with 40 days left was warned about:\n%s", log.String())
	}
	clock = start.Add(25 * 24 * time.Hour)
	log.Reset()
	m.check()
	if out := log.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "the edge CA expires soon") || !strings.Contains(out, CAKeyFile) {
		t.Fatalf("a check with 15 days left logged:\n%s", out)
	}
	clock = start.Add(41 * 24 * time.Hour)
	log.Reset()
	m.check()
	if out := log.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "expired on") || !strings.Contains(out, "delete "+dir) {
		t.Fatalf("a check past the CA's end logged:\n%s", out)
	}
}
