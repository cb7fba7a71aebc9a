//go:build vfnictest

package ring

// SetDecodeHook installs f to run after the ring reader copies each entry
// (nil removes it). Test builds only (-tags vfnictest): a driver's tests
// count with it how many times an entry is read and decoded.
func SetDecodeHook(f func(pos uint32)) { decodeHook = f }
