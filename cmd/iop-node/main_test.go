package main

import (
	"strings"
	"testing"
	"time"
)

// The flag and the environment variable are merged first and checked once,
// with one message naming where the value came from.
func TestStatsIntervalMergedThenCheckedOnce(t *testing.T) {
	for _, c := range []struct {
		flag    time.Duration
		env     string
		want    time.Duration
		wantErr string
	}{
		{0, "", 0, ""},
		{2 * time.Second, "", 2 * time.Second, ""},
		{0, "250ms", 250 * time.Millisecond, ""},
		{3 * time.Second, "1ns", 3 * time.Second, ""}, // the flag wins; the env is not read
		{100 * time.Millisecond, "", 100 * time.Millisecond, ""},
		{time.Nanosecond, "", 0, "--stats-interval 1ns is below 100ms"},
		{-time.Second, "", 0, "--stats-interval -1s is below 100ms"},
		{0, "1ms", 0, "IOP_NODE_STATS_INTERVAL 1ms is below 100ms"},
		{0, "0s", 0, "IOP_NODE_STATS_INTERVAL 0s is below 100ms"},
		{0, "-5s", 0, "IOP_NODE_STATS_INTERVAL -5s is below 100ms"},
		{0, "30", 0, `IOP_NODE_STATS_INTERVAL: invalid duration "30" (use Go syntax with a unit`},
	} {
		got, err := statsInterval(c.flag, c.env)
		if c.wantErr == "" {
			if err != nil || got != c.want {
				t.Errorf("statsInterval(%s, %q) = %s, %v; want %s", c.flag, c.env, got, err, c.want)
			}
			continue
		}
		if err == nil || !strings.HasPrefix(err.Error(), c.wantErr) {
			t.Errorf("statsInterval(%s, %q) = %s, %v; want error %q", c.flag, c.env, got, err, c.wantErr)
		}
	}
}
