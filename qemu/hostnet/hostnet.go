// Package hostnet is the host's side of a guest NIC on a dgram netdev
// (qemu.NetDgram): moving Ethernet frames to and from QEMU's UDP socket in
// batches, and keeping that socket supplied for a receive benchmark
// without flooding it.
//
// The host shares its cores with QEMU, whose main thread does all of the
// device emulation: receiving or sending one datagram per system call
// would steal the time being measured, so the reader and writer move up to
// a batch per recvmmsg/sendmmsg call.
package hostnet

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

// BatchReader receives datagrams in batches.
type BatchReader struct {
	fd   int
	bufs [][]byte
	iovs []unix.Iovec
	msgs []mmsghdr
}

// NewBatchReader returns a reader of up to batch datagrams of up to size
// bytes per call from the socket fd.
func NewBatchReader(fd, batch, size int) *BatchReader {
	r := &BatchReader{fd: fd, bufs: make([][]byte, batch), iovs: make([]unix.Iovec, batch), msgs: make([]mmsghdr, batch)}
	for i := range r.bufs {
		r.bufs[i] = make([]byte, size)
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(size)
		r.msgs[i].hdr.Iov = &r.iovs[i]
		r.msgs[i].hdr.SetIovlen(1)
	}
	return r
}

// Read takes the datagrams waiting, without blocking, and returns how
// many; datagram i is then Datagram(i), valid until the next Read.
func (r *BatchReader) Read() (int, error) {
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

// Datagram is the i-th datagram of the last Read.
func (r *BatchReader) Datagram(i int) []byte { return r.bufs[i][:r.msgs[i].n] }

// BatchWriter sends one frame many times to one address per sendmmsg.
type BatchWriter struct {
	fd   int
	sa   unix.RawSockaddrInet4
	iov  unix.Iovec
	msgs []mmsghdr
}

// NewBatchWriter returns a writer of up to batch copies of frame per call
// from the socket fd to dst. frame must stay unchanged while it is used.
func NewBatchWriter(fd int, dst unix.SockaddrInet4, frame []byte, batch int) *BatchWriter {
	w := &BatchWriter{fd: fd, msgs: make([]mmsghdr, batch)}
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

// Write sends up to n copies of the frame and returns how many the kernel
// took (loopback UDP never blocks: a full receiver drops).
func (w *BatchWriter) Write(n int) int {
	n = min(n, len(w.msgs))
	got, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(w.fd), uintptr(unsafe.Pointer(&w.msgs[0])), uintptr(n), 0, 0, 0)
	if e != 0 {
		return 0
	}
	return int(got)
}

// UDPState is one UDP socket's line of /proc/net/udp.
type UDPState struct {
	// Queued is rx_queue: the bytes of datagrams waiting (their truesize).
	Queued uint64
	// Drops counts the datagrams the socket dropped for want of room.
	Drops uint64
	// OK says the socket was found and its line parsed.
	OK bool
}

// Socket reads the state of the 127.0.0.1 UDP socket bound to port.
func Socket(port int) UDPState {
	b, err := os.ReadFile("/proc/net/udp")
	if err != nil {
		return UDPState{}
	}
	want := fmt.Sprintf("0100007F:%04X", port)
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 13 || f[1] != want {
			continue
		}
		q := strings.SplitN(f[4], ":", 2)
		if len(q) != 2 {
			return UDPState{}
		}
		rq, err1 := strconv.ParseUint(q[1], 16, 64)
		dr, err2 := strconv.ParseUint(f[12], 10, 64)
		return UDPState{Queued: rq, Drops: dr, OK: err1 == nil && err2 == nil}
	}
	return UDPState{}
}

// Feeding a receive benchmark. QEMU shares the host's cores with the
// sender: datagrams sent beyond what it reads are dropped at its socket,
// and every one of them costs the CPU time QEMU needs (a fixed-rate flood
// took most of a core here and dropped three quarters of what it sent).
// So Feed reads the socket's queue about every FeedCheck and tops it up to
// FeedFill: QEMU never waits for input, and little is dropped.
const (
	// FeedCheck is the interval between looks at the socket's queue.
	FeedCheck = 300 * time.Microsecond
	// FeedFill is the queue depth in bytes (the kernel counts each
	// datagram's truesize, about 800 bytes for a 64-byte one on
	// loopback), short of the default 208 KiB receive buffer.
	FeedFill = 180 << 10
	// feedTruesize is the truesize of one 64-byte loopback datagram, measured.
	feedTruesize = 832
	// feedMaxRate bounds the rate in case the socket's state cannot be read.
	feedMaxRate = 1000000 // frames/s
)

// FeedStats says how a Feed went.
type FeedStats struct {
	// Sent is the number of frames sent.
	Sent int
	// Checks and Empty count the looks at the socket's queue and those
	// that found it empty (QEMU may have waited for input).
	Checks, Empty int
	// Elapsed is how long it fed.
	Elapsed time.Duration
}

// Feed keeps the QEMU socket on port supplied with w's frame until ctx
// ends or d has passed (d <= 0: until ctx ends).
func Feed(ctx context.Context, w *BatchWriter, port int, d time.Duration) FeedStats {
	var st FeedStats
	start := time.Now()
	for ctx.Err() == nil {
		if d > 0 && time.Since(start) >= d {
			break
		}
		want := int(FeedCheck.Seconds() * feedMaxRate)
		if s := Socket(port); s.OK {
			st.Checks++
			if s.Queued == 0 {
				st.Empty++
			}
			want = max(0, (FeedFill-int(s.Queued))/feedTruesize)
		}
		for want > 0 {
			k := w.Write(want)
			if k <= 0 {
				break
			}
			st.Sent += k
			want -= k
		}
		// Not time.Sleep: the runtime's timers wake about a millisecond
		// late on a loaded machine, by which time QEMU has emptied its
		// socket.
		ts := unix.NsecToTimespec(int64(FeedCheck))
		_ = unix.Nanosleep(&ts, nil)
	}
	st.Elapsed = time.Since(start)
	return st
}
