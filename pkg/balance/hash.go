package balance

import "github.com/cespare/xxhash/v2"

// Hash returns the 64-bit xxHash (XXH64, seed 0) of key. It is the hash tether feeds to
// Maglev.Lookup for consistent-hash balancing, so one key maps to one instance whichever
// protocol (HTTP or SIP) carries it and whichever tether replica computes it.
func Hash(key string) uint64 { return xxhash.Sum64String(key) }
