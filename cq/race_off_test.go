//go:build !race

package cq

// raceEnabled shortens the longer tests under the race detector.
const raceEnabled = false
