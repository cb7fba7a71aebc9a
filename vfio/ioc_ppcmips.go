//go:build linux && (ppc64 || ppc64le || mips || mipsle || mips64 || mips64le)

package vfio

// powerpc and mips encode "no data" as direction 1 in a 3-bit field at
// bit 29, so _IO() numbers differ from the generic ones.
const (
	iocNone     = 1
	iocDirShift = 29
)
