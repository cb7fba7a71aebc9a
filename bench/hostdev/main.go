// Command hostdev is the plain-socket reference of the host-device
// benchmark (run.sh): Ethernet frames through an ordinary AF_PACKET
// socket, a batch per system call (sendmmsg, recvmmsg), no ring shared
// with the kernel, no XDP. It is also the fixed generator that feeds every
// receive run.
//
//	hostdev tx -i IF [-size 64] [-dst-mac M] [-batch 32] [-duration D]
//	hostdev rx -i IF [-batch 32] [-duration D]
//	hostdev rx-v2|rx-v3 -i IF [-sleep] [-duration D]
//
// tx builds one UDP frame (the headers of testpmd's txonly: 198.18.0.1 ->
// 198.18.0.2, port 9 -> 9, payload zero) and sends it -batch times per
// sendmmsg, with PACKET_QDISC_BYPASS as DPDK's net_af_packet and vfnic's
// afpacket use; the kernel copies each frame from that one buffer. rx
// binds an ETH_P_ALL socket to IF and reads up to -batch frames per
// recvmmsg (MSG_WAITFORONE: it returns once one is there, so a slow
// sender is not waited for), into buffers of 2048 bytes, with the socket's
// default receive buffer.
//
// rx-v2 and rx-v3 read a PACKET_RX_RING of TPACKET_V2 (a fixed slot per
// frame, vfnic's afpacket and DPDK's net_af_packet) or TPACKET_V3 (blocks
// of frames packed back to back), 1 MiB each, by status word, with no
// copy: the measure of which fits a receive ring better (ring.go).
//
// Every -progress interval it prints a line as vfnic's traffic commands
// do, "T.Ts  rx N pps ... tx N pps ... totals rx N tx N", which run.sh
// reads; it ends after -duration or on SIGINT/SIGTERM with a summary line.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "tx" && os.Args[1] != "rx" && os.Args[1] != "rx-v2" && os.Args[1] != "rx-v3") {
		fmt.Fprintln(os.Stderr, "usage: hostdev tx|rx|rx-v2|rx-v3 -i IF [flags]")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet("hostdev "+mode, flag.ExitOnError)
	ifname := fs.String("i", "", "interface")
	size := fs.Int("size", 64, "tx: frame size in bytes without FCS (60..9000)")
	dst := fs.String("dst-mac", "02:00:00:00:00:00", "tx: destination MAC (testpmd's default peer address)")
	batch := fs.Int("batch", 32, "frames per sendmmsg/recvmmsg (1..1024)")
	dur := fs.Duration("duration", 0, "stop after this long (0: until SIGINT/SIGTERM)")
	every := fs.Duration("progress", time.Second, "interval between progress lines (0: none)")
	sleep := fs.Bool("sleep", false, "rx-v2, rx-v3: sleep in poll(2) when the ring is empty (default: poll busily)")
	_ = fs.Parse(os.Args[2:])
	var err error
	if mode == "rx-v2" || mode == "rx-v3" {
		err = runRing(int(mode[4]-'0'), *ifname, *sleep, *dur, *every)
	} else {
		err = run(mode, *ifname, *size, *dst, *batch, *dur, *every)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hostdev %s: %v\n", mode, err)
		os.Exit(1)
	}
}

// begin finds the interface, gives the calling goroutine a thread of its
// own (one thread does the work, as one lcore does in testpmd) and
// returns the flag SIGINT or SIGTERM sets.
func begin(ifname string) (*net.Interface, *atomic.Bool, error) {
	if ifname == "" {
		return nil, nil, errors.New("-i IF is required")
	}
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, nil, err
	}
	runtime.LockOSThread()
	stop := new(atomic.Bool)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-sig; stop.Store(true) }()
	return ifi, stop, nil
}

// meter prints a progress line every `every` (none when 0) and tells when
// dur (none when 0) has passed since the start.
type meter struct {
	mode        string
	every, dur  time.Duration
	start, last time.Time
	lastN       uint64
}

func newMeter(mode string, every, dur time.Duration) *meter {
	now := time.Now()
	return &meter{mode: mode, every: every, dur: dur, start: now, last: now}
}

// tick looks at the clock with total frames counted so far, and reports
// whether the run is over.
func (m *meter) tick(total uint64) (done bool) {
	now := time.Now()
	if m.every > 0 && now.Sub(m.last) >= m.every {
		line(m.mode, now.Sub(m.start), float64(total-m.lastN)/now.Sub(m.last).Seconds(), total)
		m.last, m.lastN = now, total
	}
	return m.dur > 0 && now.Sub(m.start) >= m.dur
}

func run(mode, ifname string, size int, dst string, batch int, dur, every time.Duration) error {
	if batch < 1 || batch > 1024 {
		return fmt.Errorf("-batch %d is outside 1..1024", batch)
	}
	ifi, stop, err := begin(ifname)
	if err != nil {
		return err
	}

	var proto uint16
	if mode == "rx" {
		proto = unix.ETH_P_ALL
	} // tx binds protocol 0: the socket receives nothing
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(proto)))
	if err != nil {
		return fmt.Errorf("AF_PACKET socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: ifi.Index}); err != nil {
		return fmt.Errorf("bind to %s: %w", ifname, err)
	}

	bufSize := 2048
	var frame []byte
	if mode == "tx" {
		if size < 60 || size > 9000 {
			return fmt.Errorf("-size %d is outside 60..9000", size)
		}
		mac, err := net.ParseMAC(dst)
		if err != nil || len(mac) != 6 {
			return fmt.Errorf("-dst-mac %q: not an Ethernet address", dst)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
			return fmt.Errorf("PACKET_QDISC_BYPASS: %w", err)
		}
		frame = udpFrame(size, mac, ifi.HardwareAddr)
	} else {
		// A bounded block, so that SIGINT or -duration is seen while no
		// frame arrives.
		tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("SO_RCVTIMEO: %w", err)
		}
	}

	msgs := make([]unix.Mmsghdr, batch)
	iovs := make([]unix.Iovec, batch)
	bufs := make([]byte, batch*bufSize)
	for i := range msgs {
		if mode == "tx" {
			iovs[i].Base = &frame[0]
			iovs[i].SetLen(len(frame))
		} else {
			iovs[i].Base = &bufs[i*bufSize]
			iovs[i].SetLen(bufSize)
		}
		msgs[i].Hdr.Iov = &iovs[i]
		msgs[i].Hdr.SetIovlen(1)
	}
	nr := uintptr(unix.SYS_SENDMMSG)
	flags := uintptr(0)
	if mode == "rx" {
		nr, flags = unix.SYS_RECVMMSG, unix.MSG_WAITFORONE
	}

	m := newMeter(mode, every, dur)
	var total, errs uint64
	for !stop.Load() {
		n, _, e := unix.Syscall6(nr, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(batch), flags, 0, 0)
		switch e {
		case 0:
			total += uint64(n)
		case unix.EAGAIN, unix.EINTR, unix.ENOBUFS:
			// a receive timeout, a signal, a transmit the device dropped
			if e == unix.ENOBUFS {
				errs++
			}
		default:
			return fmt.Errorf("%s: %w", map[bool]string{true: "recvmmsg", false: "sendmmsg"}[mode == "rx"], e)
		}
		if m.tick(total) {
			break
		}
	}
	el := time.Since(m.start)
	fmt.Printf("hostdev %s: %.2fs, %d frames (%.0f pps), %d ENOBUFS\n", mode, el.Seconds(), total, float64(total)/el.Seconds(), errs)
	return nil
}

// line prints a progress line in the format of vfnic's traffic commands.
func line(mode string, t time.Duration, pps float64, total uint64) {
	var rp, tp float64
	var rt, tt uint64
	if mode == "rx" {
		rp, rt = pps, total
	} else {
		tp, tt = pps, total
	}
	fmt.Printf("%6.1fs  rx %8.0f pps  tx %8.0f pps  totals rx %d tx %d\n", t.Seconds(), rp, tp, rt, tt)
}

// udpFrame is an Ethernet/IPv4/UDP frame of size bytes with the headers
// testpmd's txonly mode writes and a zero payload.
func udpFrame(size int, dst, src net.HardwareAddr) []byte {
	f := make([]byte, size)
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(size-14))
	ip[8] = 64
	ip[9] = 17
	copy(ip[12:16], []byte{198, 18, 0, 1})
	copy(ip[16:20], []byte{198, 18, 0, 2})
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:], 9)
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], uint16(size-34))
	return f
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
