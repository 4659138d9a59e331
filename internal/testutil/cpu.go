package testutil

import (
	"syscall"
	"testing"
	"time"
)

// CPUPerOp reports, when the returned function is called after a benchmark's loop, the
// process's CPU time (user and system, every thread: GC included) per iteration as
// cpu-ns/op. On a shared, overloaded machine wall time also counts the time spent waiting for
// a core; CPU time does not, so paired ratios of it are steadier.
func CPUPerOp(b *testing.B) func() {
	start := ProcessCPU(b)
	return func() { b.ReportMetric(float64(ProcessCPU(b)-start)/float64(b.N), "cpu-ns/op") }
}

// ProcessCPU returns the user and system CPU time the process has used so far.
func ProcessCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
