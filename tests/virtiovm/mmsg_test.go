package virtiovm

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The host side shares the machine's cores with QEMU, whose main thread
// does all of the device emulation: receiving and sending one datagram per
// system call would steal the time being measured. These helpers move up
// to a batch of datagrams per recvmmsg/sendmmsg call.

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

// batchReader receives datagrams in batches.
type batchReader struct {
	fd   int
	bufs [][]byte
	iovs []unix.Iovec
	msgs []mmsghdr
}

func newBatchReader(fd, batch, size int) *batchReader {
	r := &batchReader{fd: fd, bufs: make([][]byte, batch), iovs: make([]unix.Iovec, batch), msgs: make([]mmsghdr, batch)}
	for i := range r.bufs {
		r.bufs[i] = make([]byte, size)
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(size)
		r.msgs[i].hdr.Iov = &r.iovs[i]
		r.msgs[i].hdr.SetIovlen(1)
	}
	return r
}

// read takes the datagrams waiting, without blocking, and returns how
// many; datagram i is bufs[i][:msgs[i].n].
func (r *batchReader) read() (int, error) {
	for {
		got, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(r.fd), uintptr(unsafe.Pointer(&r.msgs[0])), uintptr(len(r.msgs)),
			unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			return int(got), nil
		case unix.EAGAIN:
			return 0, nil
		case unix.EINTR:
			continue
		}
		return 0, e
	}
}

func (r *batchReader) datagram(i int) []byte { return r.bufs[i][:r.msgs[i].n] }

// batchWriter sends one frame many times to one address per sendmmsg.
type batchWriter struct {
	fd   int
	sa   unix.RawSockaddrInet4
	iov  unix.Iovec
	msgs []mmsghdr
}

func newBatchWriter(fd int, dst unix.SockaddrInet4, frame []byte, batch int) *batchWriter {
	w := &batchWriter{fd: fd, msgs: make([]mmsghdr, batch)}
	w.sa.Family = unix.AF_INET
	w.sa.Port = uint16(dst.Port>>8) | uint16(dst.Port&0xff)<<8 // network order
	w.sa.Addr = dst.Addr
	w.iov.Base = &frame[0]
	w.iov.SetLen(len(frame))
	for i := range w.msgs {
		h := &w.msgs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&w.sa))
		h.Namelen = unix.SizeofSockaddrInet4
		h.Iov = &w.iov
		h.SetIovlen(1)
	}
	return w
}

// write sends up to n copies of the frame and returns how many the kernel
// took (loopback UDP never blocks: a full receiver drops).
func (w *batchWriter) write(n int) int {
	n = min(n, len(w.msgs))
	got, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(w.fd), uintptr(unsafe.Pointer(&w.msgs[0])), uintptr(n), 0, 0, 0)
	if e != 0 {
		return 0
	}
	return int(got)
}
