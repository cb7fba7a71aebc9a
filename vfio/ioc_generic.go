//go:build linux && !(ppc64 || ppc64le || mips || mipsle || mips64 || mips64le)

package vfio

// Direction field of an _IO() request on architectures using
// asm-generic/ioctl.h (amd64, arm64, riscv64, s390x, loong64, ...).
const (
	iocNone     = 0
	iocDirShift = 30
)
