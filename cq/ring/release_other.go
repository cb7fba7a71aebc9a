//go:build !amd64 || race

package ring

import "sync/atomic"

// storeRelease32 stores v at p with (at least) release ordering; see
// release_amd64.go.
func storeRelease32(p *uint32, v uint32) { atomic.StoreUint32(p, v) }
