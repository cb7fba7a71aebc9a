package vethtest

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestType is the EtherType of the test's frames (IEEE local experimental):
// anything else on the wire (there should be nothing) is ignored.
const TestType = 0x88b5

// FrameLen is the length of test frame seq: 60 to 1514 bytes.
func FrameLen(seq uint64) int { return 60 + int(seq%1455) }

// MakeFrame writes test frame seq from src to dst into b and returns it:
// the sequence number after the Ethernet header, then bytes derived from
// it, so that a frame's content says which frame it is.
func MakeFrame(b []byte, dst, src net.HardwareAddr, seq uint64) []byte {
	n := FrameLen(seq)
	b = b[:n]
	copy(b[0:], dst)
	copy(b[6:], src)
	binary.BigEndian.PutUint16(b[12:], TestType)
	binary.LittleEndian.PutUint64(b[14:], seq)
	for i := 22; i < n; i++ {
		b[i] = byte(seq*7 + uint64(i))
	}
	return b
}

// CheckFrame returns the sequence number of a test frame from src to dst,
// whether it is one, and an error when it is one but its length or bytes
// are not those MakeFrame wrote.
func CheckFrame(b []byte, dst, src net.HardwareAddr) (uint64, bool, error) {
	if len(b) < 22 || binary.BigEndian.Uint16(b[12:]) != TestType {
		return 0, false, nil
	}
	seq := binary.LittleEndian.Uint64(b[14:])
	if len(b) != FrameLen(seq) {
		return seq, true, fmt.Errorf("frame %d: %d bytes, want %d", seq, len(b), FrameLen(seq))
	}
	if string(b[0:6]) != string(dst) || string(b[6:12]) != string(src) {
		return seq, true, fmt.Errorf("frame %d: addresses %x", seq, b[:12])
	}
	for i := 22; i < len(b); i++ {
		if b[i] != byte(seq*7+uint64(i)) {
			return seq, true, fmt.Errorf("frame %d: byte %d is %#x", seq, i, b[i])
		}
	}
	return seq, true, nil
}

// Peer is a Linux AF_PACKET socket on an interface: the other end of the
// veth pair, made in the caller's network namespace.
type Peer struct {
	fd  int
	MAC net.HardwareAddr
	idx int
}

// NewPeer makes the peer on ifname in the calling thread's namespace.
func NewPeer(ifname string) (*Peer, error) {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 16<<20)
	// Straight to the driver: the veth queue is then the sending CPU's
	// (packet_pick_tx_queue records it), which the tests aim with.
	_ = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1)
	// Frames the peer sends are not read back: only those it receives.
	_ = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)
	tv := unix.Timeval{Sec: 1}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return &Peer{fd: fd, MAC: ifc.HardwareAddr, idx: ifc.Index}, nil
}

// Send sends one frame.
func (p *Peer) Send(b []byte) error {
	return unix.Sendto(p.fd, b, 0, &unix.SockaddrLinklayer{Ifindex: p.idx, Halen: 6})
}

// Recv reads one frame; a timeout (1 s) is (0, nil) reported as n == 0.
func (p *Peer) Recv(b []byte) (int, error) {
	n, _, err := unix.Recvfrom(p.fd, b, 0)
	if err == unix.EAGAIN || err == unix.EINTR {
		return 0, nil
	}
	return n, err
}

// Frames reads the next n frames of type etherType (others are skipped),
// failing t when one does not come within 10 s. idle, when not nil, runs
// whenever no frame is waiting (a sender's Flush, for queues that send
// in bounded batches).
func (p *Peer) Frames(t testing.TB, n int, etherType uint16, idle func()) [][]byte {
	t.Helper()
	out := make([][]byte, 0, n)
	b := make([]byte, 1<<16)
	for deadline := time.Now().Add(10 * time.Second); len(out) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("peer: %d of %d frames arrived", len(out), n)
		}
		pfd := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		if k, _ := unix.Poll(pfd, 1); k <= 0 {
			if idle != nil {
				idle()
			}
			continue
		}
		k, err := p.Recv(b)
		if err != nil {
			t.Fatalf("peer: %v", err)
		}
		if k >= 14 && binary.BigEndian.Uint16(b[12:]) == etherType {
			out = append(out, append([]byte(nil), b[:k]...))
		}
	}
	return out
}

// Close closes the socket.
func (p *Peer) Close() { unix.Close(p.fd) }

func htons(v uint16) uint16 { return v<<8 | v>>8 }
