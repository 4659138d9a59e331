//go:build race

package session_test

// raceEnabled reports whether the race detector is on: a few scale tests shrink under it.
const raceEnabled = true
