package vfio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctl issues a request whose argument is a plain integer (or none) and
// returns the kernel's non-negative result. EINTR is retried: every VFIO
// request this package issues is safe to repeat.
func ioctl(fd int, req uintptr, arg uintptr) (int, error) {
	for {
		r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(r), nil
	}
}

// ioctlPtr issues a request whose argument points to memory the kernel
// reads or fills. p stays live (and unmoved) for the call because it is
// converted in the Syscall argument list.
func ioctlPtr(fd int, req uintptr, p unsafe.Pointer) (int, error) {
	for {
		r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(p))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(r), nil
	}
}

// ioctlBuf issues a request on a byte buffer (info structures with a
// capability chain, irq sets with a data tail).
func ioctlBuf(fd int, req uintptr, buf []byte) (int, error) {
	if len(buf) == 0 {
		return -1, unix.EINVAL
	}
	return ioctlPtr(fd, req, unsafe.Pointer(&buf[0]))
}
