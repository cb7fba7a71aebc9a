//go:build !race

package conformance

// raceEnabled is false: allocation counts are asserted with the device
// producing.
const raceEnabled = false
