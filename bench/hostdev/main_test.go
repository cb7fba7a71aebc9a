package main

import (
	"encoding/binary"
	"net"
	"testing"
)

// TestUDPFrame checks the one frame hostdev tx sends: testpmd txonly's
// addresses and ports, lengths that add up to the size, a valid IPv4
// header checksum.
func TestUDPFrame(t *testing.T) {
	dst, _ := net.ParseMAC("02:00:00:00:00:00")
	src, _ := net.ParseMAC("02:00:00:00:00:01")
	for _, size := range []int{60, 64, 1514} {
		f := udpFrame(size, dst, src)
		if len(f) != size {
			t.Fatalf("size %d: frame of %d bytes", size, len(f))
		}
		if string(f[0:6]) != string(dst) || string(f[6:12]) != string(src) || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
			t.Fatalf("size %d: Ethernet header % x", size, f[:14])
		}
		ip := f[14:34]
		var sum uint32
		for i := 0; i < 20; i += 2 {
			sum += uint32(binary.BigEndian.Uint16(ip[i:]))
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		if sum != 0xffff {
			t.Errorf("size %d: IPv4 header checksum does not verify (%#x)", size, sum)
		}
		if got := int(binary.BigEndian.Uint16(ip[2:])); got != size-14 {
			t.Errorf("size %d: IPv4 total length %d", size, got)
		}
		if !net.IP(ip[12:16]).Equal(net.IPv4(198, 18, 0, 1)) || !net.IP(ip[16:20]).Equal(net.IPv4(198, 18, 0, 2)) || ip[9] != 17 {
			t.Errorf("size %d: addresses %v -> %v, protocol %d", size, net.IP(ip[12:16]), net.IP(ip[16:20]), ip[9])
		}
		udp := f[34:42]
		if binary.BigEndian.Uint16(udp[0:]) != 9 || binary.BigEndian.Uint16(udp[2:]) != 9 || int(binary.BigEndian.Uint16(udp[4:])) != size-34 {
			t.Errorf("size %d: UDP header % x", size, udp)
		}
	}
}
