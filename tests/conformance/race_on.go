//go:build race

package conformance

// raceEnabled: the race detector's instrumentation makes syscall wrappers
// (eventfd writes by the device loop and the feeder) allocate, so
// allocation counts are only asserted while nothing else runs.
const raceEnabled = true
