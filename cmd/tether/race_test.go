//go:build race

package main

// raceEnabled reports whether the race detector is on: the fault suite shrinks its stream count under it.
const raceEnabled = true
