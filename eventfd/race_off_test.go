//go:build !race

package eventfd

// raceEnabled says the race detector is on: it makes the 8-byte buffers
// of Add and of the poller's Read escape.
const raceEnabled = false
