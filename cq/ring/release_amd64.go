//go:build !race

package ring

// storeRelease32 stores v at p with release ordering: earlier stores are
// visible to a goroutine that loads v with atomic.LoadUint32. On amd64
// every store has that ordering, and a MOV costs far less than the locked
// XCHG that atomic.StoreUint32 (sequentially consistent) compiles to. The
// C reference publishes with a release store too. Being assembly, the call
// is also a compiler barrier. The race detector does not see assembly, so
// race builds use atomic.StoreUint32 (release_other.go).
//
//go:noescape
func storeRelease32(p *uint32, v uint32)
