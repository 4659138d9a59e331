// Package gcfloor keeps the Go garbage collector's heap goal at or above a floor, so that a
// process whose live heap is small spends less CPU on collection.
//
// The Go runtime sets the heap goal of each cycle to live + (live + stacks + globals) × GOGC/100
// (GOGC defaults to 100). A server with a few MB of live heap and a steady allocation rate
// therefore collects every few MB allocated, and each cycle marks the whole live heap (in tether
// mostly the protobuf, Kubernetes and JSON registries built at init), whatever it allocates per
// request. A Floor raises GOGC, after every cycle, just enough that the next goal is at least
// its floor; once the live heap is large enough that the GOGC-derived goal is above the floor,
// it sets the base GOGC and the runtime behaves as without it. It is the effect of the old
// "heap ballast" without a ballast, and the same idea as a JVM's minimum heap (-Xms): the
// process may use up to about floor bytes of heap where it would otherwise use less.
//
// A memory limit (GOMEMLIMIT, debug.SetMemoryLimit) still applies: the runtime's goal is the
// lower of the GOGC goal and the limit's, so a floor above the limit does not raise the heap
// past it.
//
// A Floor owns the process's GC percentage (debug.SetGCPercent) while it runs; nothing else
// should set it then. Start at most one at a time.
package gcfloor
