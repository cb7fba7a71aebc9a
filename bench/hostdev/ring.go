package main

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The receive rings of rx-v2 and rx-v3 both map 1 MiB, as DPDK's
// net_af_packet does by default (512 frames of 2048 bytes): TPACKET_V2 as
// that driver and vfnic's afpacket lay it out (a fixed slot per frame, two
// per 4 KiB block), TPACKET_V3 as 4 blocks of 256 KiB that the kernel
// fills with frames back to back and hands over whole (or when a block
// has waited retireTov with frames in it).
const (
	ringFrame  = 2048
	ringFrames = 512
	v3Block    = 256 << 10
	v3Blocks   = 4
	retireTov  = 1 // ms
)

// runRing is rx-v2 and rx-v3: frames read from a PACKET_RX_RING of that
// version, by the status word of each slot (V2) or block (V3), the slot or
// block handed back to the kernel as soon as its frames are counted.
// Nothing is copied; each frame's header is read (its length counted).
// It polls busily unless sleep (-sleep) has it wait in poll(2).
func runRing(version int, ifname string, sleep bool, dur, every time.Duration) error {
	ifi, stop, err := begin(ifname)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return fmt.Errorf("AF_PACKET socket: %w", err)
	}
	defer unix.Close(fd)
	v := unix.TPACKET_V2
	if version == 3 {
		v = unix.TPACKET_V3
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VERSION, v); err != nil {
		return fmt.Errorf("PACKET_VERSION %d: %w", version, err)
	}
	var size int
	if version == 3 {
		req := unix.TpacketReq3{Block_size: v3Block, Block_nr: v3Blocks, Frame_size: ringFrame,
			Frame_nr: v3Block / ringFrame * v3Blocks, Retire_blk_tov: retireTov}
		err = unix.SetsockoptTpacketReq3(fd, unix.SOL_PACKET, unix.PACKET_RX_RING, &req)
		size = v3Block * v3Blocks
	} else {
		req := unix.TpacketReq{Block_size: 4096, Block_nr: ringFrames * ringFrame / 4096, Frame_size: ringFrame, Frame_nr: ringFrames}
		err = unix.SetsockoptTpacketReq(fd, unix.SOL_PACKET, unix.PACKET_RX_RING, &req)
		size = ringFrames * ringFrame
	}
	if err != nil {
		return fmt.Errorf("PACKET_RX_RING: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_LOCKED)
	if err != nil {
		return fmt.Errorf("mmap the ring: %w", err)
	}
	defer unix.Munmap(mem)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
		return fmt.Errorf("bind to %s: %w", ifname, err)
	}
	base := unsafe.Pointer(&mem[0])
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	mode := fmt.Sprintf("rx-v%d", version)

	m := newMeter("rx", every, dur)
	var total, bytes, waits uint64
	cur := 0
	for !stop.Load() {
		got := false
		if version == 3 {
			bd := (*unix.TpacketHdrV1)(unsafe.Add(base, cur*v3Block+8)) // after the block descriptor's version and priv words
			if atomic.LoadUint32(&bd.Block_status)&unix.TP_STATUS_USER != 0 {
				n, off := bd.Num_pkts, bd.Offset_to_first_pkt
				for range n {
					h := (*unix.Tpacket3Hdr)(unsafe.Add(base, cur*v3Block+int(off)))
					bytes += uint64(h.Snaplen)
					off += h.Next_offset
				}
				total += uint64(n)
				atomic.StoreUint32(&bd.Block_status, unix.TP_STATUS_KERNEL)
				cur = (cur + 1) % v3Blocks
				got = true
			}
		} else {
			h := (*unix.Tpacket2Hdr)(unsafe.Add(base, cur*ringFrame))
			if atomic.LoadUint32(&h.Status)&unix.TP_STATUS_USER != 0 {
				bytes += uint64(h.Snaplen)
				total++
				atomic.StoreUint32(&h.Status, unix.TP_STATUS_KERNEL)
				cur = (cur + 1) % ringFrames
				got = true
			}
		}
		if !got {
			// Nothing ready: look again at once (busy polling, as
			// net_af_packet and vfnic's busy cores do; sleeping in poll(2)
			// would have the kernel wake this thread, on the sender's
			// CPU, for each frame a V2 ring takes), or, with -sleep,
			// sleep until the kernel says so.
			waits++
			if sleep {
				if _, err := unix.Poll(pfd, 100); err != nil && err != unix.EINTR {
					return fmt.Errorf("poll: %w", err)
				}
			} else if waits%1024 != 0 {
				continue // the clock is read once per 1024 empty looks
			}
		}
		if total%64 != 0 && got {
			continue // the clock is read once per 64 frames while busy
		}
		if m.tick(total) {
			break
		}
	}
	el := time.Since(m.start)
	drops := "?"
	if version == 3 {
		if s, err := unix.GetsockoptTpacketStatsV3(fd, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
			drops = fmt.Sprint(s.Drops)
		}
	} else if s, err := unix.GetsockoptTpacketStats(fd, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
		drops = fmt.Sprint(s.Drops)
	}
	fmt.Printf("hostdev %s: %.2fs, %d frames (%.0f pps), %.1f bytes each, %d empty looks, %s dropped by the kernel\n",
		mode, el.Seconds(), total, float64(total)/el.Seconds(), float64(bytes)/float64(max(total, 1)), waits, drops)
	return nil
}
