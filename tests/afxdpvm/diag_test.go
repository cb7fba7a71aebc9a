package afxdpvm

import (
	"encoding/binary"
	"fmt"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The kernel's listing of AF_XDP sockets: sock_diag for AF_XDP
// (linux/xdp_diag.h; module xsk_diag), which ss -0 prints.
const (
	xdpShowInfo = 1 << 0 // XDP_SHOW_INFO
	xdpShowUmem = 1 << 2 // XDP_SHOW_UMEM

	xdpDiagInfo = 1 // XDP_DIAG_INFO: struct xdp_diag_info
	xdpDiagUmem = 5 // XDP_DIAG_UMEM: struct xdp_diag_umem

	xdpDuZeroCopy = 1 << 0 // XDP_DU_F_ZEROCOPY, in xdp_diag_umem.flags
)

// xdpDiagReq is struct xdp_diag_req.
type xdpDiagReq struct {
	Family   uint8
	Protocol uint8
	Pad      uint16
	Ino      uint32
	Show     uint32
	Cookie   [2]uint32
}

// xsock is one AF_XDP socket as the kernel lists it.
type xsock struct {
	Ino      uint32
	Ifindex  uint32 // bound interface (XDP_DIAG_INFO), 0 before bind
	Queue    uint32
	ZeroCopy bool // its UMEM is in zero-copy mode (XDP_DU_F_ZEROCOPY)
	HasUmem  bool
}

func (x xsock) String() string {
	return fmt.Sprintf("inode %d on ifindex %d queue %d (umem %v, zero-copy %v)", x.Ino, x.Ifindex, x.Queue, x.HasUmem, x.ZeroCopy)
}

// xdpSockets lists the kernel's AF_XDP sockets (of every process).
func xdpSockets() ([]xsock, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	req := xdpDiagReq{Family: unix.AF_XDP, Show: xdpShowInfo | xdpShowUmem}
	hdr := unix.NlMsghdr{Len: unix.SizeofNlMsghdr + uint32(unsafe.Sizeof(req)), Type: unix.SOCK_DIAG_BY_FAMILY,
		Flags: unix.NLM_F_REQUEST | unix.NLM_F_DUMP, Seq: 1}
	msg := append(unsafe.Slice((*byte)(unsafe.Pointer(&hdr)), unix.SizeofNlMsghdr),
		unsafe.Slice((*byte)(unsafe.Pointer(&req)), unsafe.Sizeof(req))...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sock_diag request: %w", err)
	}
	var out []xsock
	b := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, b, 0)
		if err != nil {
			return nil, fmt.Errorf("sock_diag answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(b[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
						return nil, fmt.Errorf("sock_diag for AF_XDP (module xsk_diag): %w", syscall.Errno(-e))
					}
				}
				return nil, fmt.Errorf("sock_diag: short error message")
			case unix.SOCK_DIAG_BY_FAMILY:
				x, err := parseXsock(m.Data)
				if err != nil {
					return nil, err
				}
				out = append(out, x)
			}
		}
	}
}

// parseXsock reads struct xdp_diag_msg and its attributes, each length
// checked against what is left.
func parseXsock(b []byte) (xsock, error) {
	const msgLen = 16 // struct xdp_diag_msg
	if len(b) < msgLen {
		return xsock{}, fmt.Errorf("xdp_diag_msg of %d bytes", len(b))
	}
	x := xsock{Ino: binary.NativeEndian.Uint32(b[4:8])}
	for a := b[msgLen:]; len(a) >= 4; {
		l, typ := int(binary.NativeEndian.Uint16(a[0:2])), binary.NativeEndian.Uint16(a[2:4])
		if l < 4 || l > len(a) {
			return xsock{}, fmt.Errorf("attribute %d of %d bytes, %d left", typ, l, len(a))
		}
		v := a[4:l]
		switch {
		case typ == xdpDiagInfo && len(v) >= 8:
			x.Ifindex, x.Queue = binary.NativeEndian.Uint32(v[0:4]), binary.NativeEndian.Uint32(v[4:8])
		case typ == xdpDiagUmem && len(v) >= 36:
			// size u64, id, num_pages, chunk_size, headroom, ifindex,
			// queue_id, flags, refs u32
			x.HasUmem, x.ZeroCopy = true, binary.NativeEndian.Uint32(v[32:36])&xdpDuZeroCopy != 0
		}
		a = a[min((l+3)&^3, len(a)):]
	}
	return x, nil
}

// TestParseXsock: the attributes are read with their lengths checked; a
// length past the end is an error, never an out-of-bounds read.
func TestParseXsock(t *testing.T) {
	msg := func(attrs ...[]byte) []byte {
		b := make([]byte, 16)
		b[0] = unix.AF_XDP
		binary.NativeEndian.PutUint32(b[4:], 77)
		for _, a := range attrs {
			b = append(b, a...)
		}
		return b
	}
	attr := func(typ uint16, v []byte) []byte {
		a := make([]byte, 4, 4+len(v)+3)
		binary.NativeEndian.PutUint16(a[0:], uint16(4+len(v)))
		binary.NativeEndian.PutUint16(a[2:], typ)
		a = append(a, v...)
		for len(a)%4 != 0 {
			a = append(a, 0)
		}
		return a
	}
	info := make([]byte, 8)
	binary.NativeEndian.PutUint32(info[0:], 3)
	binary.NativeEndian.PutUint32(info[4:], 1)
	umem := make([]byte, 40)
	binary.NativeEndian.PutUint32(umem[32:], xdpDuZeroCopy)

	x, err := parseXsock(msg(attr(xdpDiagInfo, info), attr(2, []byte{1}), attr(xdpDiagUmem, umem)))
	require.NoError(t, err)
	require.Equal(t, xsock{Ino: 77, Ifindex: 3, Queue: 1, ZeroCopy: true, HasUmem: true}, x)
	umem[32] = 0
	x, err = parseXsock(msg(attr(xdpDiagUmem, umem)))
	require.NoError(t, err)
	require.Equal(t, xsock{Ino: 77, HasUmem: true}, x, "copy mode")

	_, err = parseXsock(msg()[:15])
	require.Error(t, err)
	bad := attr(xdpDiagInfo, info)
	binary.NativeEndian.PutUint16(bad[0:], 200)
	_, err = parseXsock(msg(bad))
	require.Error(t, err, "attribute longer than the message")
	binary.NativeEndian.PutUint16(bad[0:], 2)
	_, err = parseXsock(msg(bad))
	require.Error(t, err, "attribute shorter than its header")
	x, err = parseXsock(msg(attr(xdpDiagUmem, umem[:20])))
	require.NoError(t, err)
	require.False(t, x.HasUmem, "a short UMEM attribute is not read")
}
