//go:build race

package ring

// raceEnabled shortens the longer tests under the race detector.
const raceEnabled = true
