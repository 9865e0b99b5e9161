//go:build unix

package exec

import (
	"syscall"
	"testing"
	"time"
)

// reportCPU reports the process's user+system CPU per iteration of b, from
// getrusage around fn: unlike ns/op, it does not move with what else the
// machine runs.
func reportCPU(b *testing.B, fn func()) {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	fn()
	b.ReportMetric(float64((cpu()-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
}
