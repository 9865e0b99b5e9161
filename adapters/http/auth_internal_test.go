package httpapi

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/lockedbuf"
)

func TestFailureThrottleBucketAndAggregatedLog(t *testing.T) {
	var logs lockedbuf.Buffer
	th := newFailureThrottle(3, time.Second, time.Minute, slog.New(slog.NewTextHandler(&logs, nil)))
	now := time.Unix(1000, 0)
	th.now = func() time.Time { return now }

	for i := range 3 {
		if th.blocked("10.0.0.1") {
			t.Fatalf("blocked after %d failures, burst is 3", i)
		}
		th.fail("10.0.0.1")
	}
	if !th.blocked("10.0.0.1") || th.blocked("10.0.0.2") {
		t.Fatal("the bucket is per address")
	}
	if d := th.retryAfter("10.0.0.1"); d <= 0 || d > time.Second {
		t.Fatalf("retryAfter = %v", d)
	}
	now = now.Add(time.Second)
	if th.blocked("10.0.0.1") {
		t.Fatal("a token must come back after the refill period")
	}
	th.fail("10.0.0.1")
	if n := strings.Count(logs.String(), "rejected invalid API keys"); n != 1 {
		t.Fatalf("%d log lines for 4 failures within a minute, want 1:\n%s", n, logs.String())
	}
	now = now.Add(time.Minute)
	th.fail("10.0.0.1")
	if n := strings.Count(logs.String(), "rejected invalid API keys"); n != 2 || !strings.Contains(logs.String(), "count=4") {
		t.Fatalf("the next interval's line must carry the count of the failures since:\n%s", logs.String())
	}
}

func TestFailureThrottleIsBounded(t *testing.T) {
	th := newFailureThrottle(2, time.Second, time.Minute, slog.New(slog.DiscardHandler))
	now := time.Unix(1000, 0)
	th.now = func() time.Time { return now }
	for i := range maxThrottled + 500 {
		th.fail(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
	}
	if n := len(th.m); n > maxThrottled {
		t.Fatalf("%d addresses tracked, bound is %d", n, maxThrottled)
	}
}

// Wrong keys are counted per network: two addresses of one IPv6 /64 share
// a bucket (a host picks any address of its /64), IPv4 addresses do not.
func TestFailuresCountedPerNetwork(t *testing.T) {
	th := newFailureThrottle(2, time.Hour, time.Hour, slog.New(slog.DiscardHandler))
	req := func(remote string) string {
		r, _ := http.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		return remoteHost(r)
	}
	th.fail(req("[2001:db8:1:2::10]:5000"))
	th.fail(req("[2001:db8:1:2:abcd::99]:6000"))
	if !th.blocked(req("[2001:db8:1:2:ffff::1]:7000")) {
		t.Fatal("another address of the same /64 is not throttled")
	}
	if th.blocked(req("[2001:db8:1:3::10]:5000")) {
		t.Fatal("another /64 is throttled")
	}
	th.fail(req("192.0.2.1:5000"))
	th.fail(req("192.0.2.1:5001"))
	if !th.blocked(req("192.0.2.1:9")) || th.blocked(req("192.0.2.2:9")) {
		t.Fatal("IPv4 addresses are not counted one by one")
	}
}
