//go:build !race

package memstore_test

// raceEnabled reports whether the race detector is on: a few scale tests shrink under it.
const raceEnabled = false
