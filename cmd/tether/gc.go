package main

import (
	"log/slog"

	"github.com/tether-dev/tether/pkg/config"
	"github.com/tether-dev/tether/pkg/gcfloor"
)

// gcPlan is what tether serve does with the garbage collector at start: a heap-goal floor of
// floorMiB (0: none), or nothing because the operator set GOGC.
type gcPlan struct {
	floorMiB int
	gogc     string // GOGC from the environment, "" if unset
}

// planGC decides tether serve's GC setting from the config and the environment: the floor
// runtime.gcHeapFloorMiB over Go's default GOGC=100, unless GOGC is set, in which case the
// operator's GOGC (including "off") stands alone. GOMEMLIMIT needs nothing here: the runtime
// reads it and caps the heap under the floor too.
func planGC(rt config.Runtime, getenv func(string) string) gcPlan {
	if v := getenv("GOGC"); v != "" {
		return gcPlan{gogc: v}
	}
	return gcPlan{floorMiB: rt.GCHeapFloorMiB}
}

// startGC applies p and logs it; the returned function undoes it.
func startGC(p gcPlan, log *slog.Logger) (stop func()) {
	switch {
	case p.gogc != "":
		log.Info("gc: GOGC is set; runtime.gcHeapFloorMiB not applied", "GOGC", p.gogc)
		return func() {}
	case p.floorMiB == 0:
		return func() {}
	}
	f := gcfloor.Start(uint64(p.floorMiB)<<20, 100)
	log.Info("gc: heap goal floor", "floorMiB", p.floorMiB, "gcPercent", f.Percentage())
	return f.Stop
}
