package virtiovm

import (
	"errors"
	"net"
	"syscall"
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
	rc   syscall.RawConn
	bufs [][]byte
	iovs []unix.Iovec
	msgs []mmsghdr
}

func newBatchReader(conn *net.UDPConn, batch, size int) (*batchReader, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &batchReader{rc: rc, bufs: make([][]byte, batch), iovs: make([]unix.Iovec, batch), msgs: make([]mmsghdr, batch)}
	for i := range r.bufs {
		r.bufs[i] = make([]byte, size)
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(size)
		r.msgs[i].hdr.Iov = &r.iovs[i]
		r.msgs[i].hdr.SetIovlen(1)
	}
	return r, nil
}

// read waits for datagrams (honouring the conn's read deadline) and
// returns how many arrived; datagram i is bufs[i][:msgs[i].n].
func (r *batchReader) read() (int, error) {
	var n int
	var serr error
	err := r.rc.Read(func(fd uintptr) bool {
		got, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.msgs[0])), uintptr(len(r.msgs)),
			unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EAGAIN {
			return false // wait for the socket to become readable
		}
		if e != 0 {
			serr = e
		}
		n = int(got)
		return true
	})
	if err != nil {
		return 0, err
	}
	return n, serr
}

func (r *batchReader) datagram(i int) []byte { return r.bufs[i][:r.msgs[i].n] }

// batchWriter sends one frame many times to one address per sendmmsg.
type batchWriter struct {
	rc   syscall.RawConn
	sa   unix.RawSockaddrInet4
	iov  unix.Iovec
	msgs []mmsghdr
}

func newBatchWriter(conn *net.UDPConn, dst *net.UDPAddr, frame []byte, batch int) (*batchWriter, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	ip4 := dst.IP.To4()
	if ip4 == nil {
		return nil, errors.New("batch writer: IPv4 destination needed")
	}
	w := &batchWriter{rc: rc, msgs: make([]mmsghdr, batch)}
	w.sa.Family = unix.AF_INET
	w.sa.Port = uint16(dst.Port>>8) | uint16(dst.Port&0xff)<<8 // network order
	copy(w.sa.Addr[:], ip4)
	w.iov.Base = &frame[0]
	w.iov.SetLen(len(frame))
	for i := range w.msgs {
		h := &w.msgs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&w.sa))
		h.Namelen = unix.SizeofSockaddrInet4
		h.Iov = &w.iov
		h.SetIovlen(1)
	}
	return w, nil
}

// write sends up to n copies of the frame and returns how many the kernel
// took (loopback UDP never blocks: a full receiver drops).
func (w *batchWriter) write(n int) int {
	n = min(n, len(w.msgs))
	sent := 0
	_ = w.rc.Write(func(fd uintptr) bool {
		got, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&w.msgs[0])), uintptr(n), 0, 0, 0)
		if e == 0 {
			sent = int(got)
		}
		return true
	})
	return sent
}
