package virtio

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
)

func TestNetHdrRoundTrip(t *testing.T) {
	h := netHdr{flags: netHdrNeedsCsum, gsoType: 4, hdrLen: 0x1234, gsoSize: 1448, csumStart: 34, csumOffset: 16, numBuffers: 3}
	b := make([]byte, netHdrLen)
	h.encode(b)
	require.Equal(t, []byte{1, 4, 0x34, 0x12, 0xa8, 0x05, 34, 0, 16, 0, 3, 0}, b, "little-endian struct virtio_net_hdr")
	require.Equal(t, h, decodeNetHdr(b))
}

func TestCheckRxHdr(t *testing.T) {
	const flen = 74 // Ethernet, IPv4, TCP (20 bytes), no payload
	for _, c := range []struct {
		name string
		h    netHdr
		want rxCsum
		bad  bool
	}{
		{"none", netHdr{}, rxCsumNone, false},
		{"data-valid", netHdr{flags: netHdrDataValid}, rxCsumValid, false},
		{"needs-csum", netHdr{flags: netHdrNeedsCsum, csumStart: 34, csumOffset: 16}, rxCsumPartial, false},
		{"needs-csum-wins", netHdr{flags: netHdrNeedsCsum | netHdrDataValid, csumStart: 34, csumOffset: 16}, rxCsumPartial, false},
		{"field-ends-frame", netHdr{flags: netHdrNeedsCsum, csumStart: 34, csumOffset: flen - 34 - 2}, rxCsumPartial, false},
		{"field-past-frame", netHdr{flags: netHdrNeedsCsum, csumStart: 34, csumOffset: flen - 34 - 1}, 0, true},
		{"start-past-frame", netHdr{flags: netHdrNeedsCsum, csumStart: 0xffff, csumOffset: 0xffff}, 0, true},
		{"start-in-ethernet-header", netHdr{flags: netHdrNeedsCsum, csumStart: 13, csumOffset: 2}, 0, true},
		{"rsc-info", netHdr{flags: 4}, 0, true},
		{"unknown-flag", netHdr{flags: 0x80 | netHdrDataValid}, 0, true},
		{"gso-tcpv4", netHdr{gsoType: 1, gsoSize: 1448}, 0, true},
		{"gso-ecn", netHdr{gsoType: 0x80}, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := checkRxHdr(c.h, flen)
			if c.bad {
				require.ErrorIs(t, err, errBadNetHdr)
				require.ErrorIs(t, err, nic.ErrDeviceStatus)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, m.csum)
			require.Equal(t, uint16(flen), m.flen)
		})
	}
}

// Test frames: Ethernet (optionally one VLAN tag), IPv4 or IPv6, TCP or
// UDP, payload.
func testFrame(v6 bool, proto uint8, payload int, vlan bool) []byte {
	f := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1}
	if vlan {
		f = append(f, 0x81, 0x00, 0, 7)
	}
	l4 := 20
	if proto == ipProtoUDP {
		l4 = 8
	}
	seg := make([]byte, l4+payload)
	for i := range seg {
		seg[i] = byte(i*7 + 3)
	}
	if proto == ipProtoTCP {
		seg[12] = 5 << 4
	} else {
		binary.BigEndian.PutUint16(seg[4:], uint16(len(seg)))
	}
	if v6 {
		f = append(f, 0x86, 0xdd)
		ip := make([]byte, 40)
		ip[0] = 6 << 4
		binary.BigEndian.PutUint16(ip[4:], uint16(len(seg)))
		ip[6], ip[7] = proto, 64
		copy(ip[8:], []byte{0xfd, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
		copy(ip[24:], []byte{0xfd, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2})
		f = append(f, ip...)
	} else {
		f = append(f, 0x08, 0x00)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(seg)))
		ip[8], ip[9] = 64, proto
		copy(ip[12:], []byte{10, 0, 9, 1, 10, 0, 9, 2})
		binary.BigEndian.PutUint16(ip[10:], ^onesSum(ip, 0))
		f = append(f, ip...)
	}
	return append(f, seg...)
}

// refChecksum is the TCP or UDP checksum of a test frame by RFC 793/768
// and RFC 8200's pseudo-header, computed the long way: the pseudo-header
// built as bytes and summed with the segment, its checksum field zero.
func refChecksum(t *testing.T, f []byte) (at int, sum uint16) {
	ipOff, et, ok := l3(f)
	require.True(t, ok)
	var pseudo, seg []byte
	var proto uint8
	if et == etherIPv4 {
		ip := f[ipOff:]
		hl := int(ip[0]&0xf) * 4
		proto, seg = ip[9], append([]byte(nil), ip[hl:]...)
		pseudo = append(append([]byte(nil), ip[12:20]...), 0, proto, byte(len(seg)>>8), byte(len(seg)))
	} else {
		ip := f[ipOff:]
		proto, seg = ip[6], append([]byte(nil), ip[40:]...)
		pseudo = append(append([]byte(nil), ip[8:40]...), 0, 0, byte(len(seg)>>8), byte(len(seg)), 0, 0, 0, proto)
	}
	off := 16
	if proto == ipProtoUDP {
		off = 6
	}
	seg[off], seg[off+1] = 0, 0
	at = len(f) - len(seg) + off
	return at, ^onesSum(append(pseudo, seg...), 0)
}

// deviceChecksum does what the specification says a device does with
// NEEDS_CSUM: the ones' complement checksum from csum_start to the end,
// stored at csum_start+csum_offset.
func deviceChecksum(f []byte, h netHdr) {
	binary.BigEndian.PutUint16(f[int(h.csumStart)+int(h.csumOffset):], ^onesSum(f[h.csumStart:], 0))
}

func TestL4Partial(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, proto := range []uint8{ipProtoTCP, ipProtoUDP} {
			for _, payload := range []int{0, 1, 1000, 1001} {
				for _, vlan := range []bool{false, true} {
					f := testFrame(v6, proto, payload, vlan)
					at, want := refChecksum(t, f)
					binary.BigEndian.PutUint16(f[at:], 0xdead) // what the caller left there does not matter
					start, off, ok := l4Partial(f, true)
					require.True(t, ok, "v6 %v proto %d payload %d vlan %v", v6, proto, payload, vlan)
					require.Equal(t, at, int(start)+int(off))
					deviceChecksum(f, netHdr{csumStart: start, csumOffset: off})
					require.Equal(t, want, binary.BigEndian.Uint16(f[at:]), "v6 %v proto %d payload %d vlan %v", v6, proto, payload, vlan)
				}
			}
		}
	}
	refuse := map[string][]byte{
		"icmp":          testFrame(false, 1, 20, false),
		"ipv6-ext":      testFrame(true, 0, 20, false), // hop-by-hop options first
		"trailing-byte": append(testFrame(false, ipProtoTCP, 10, false), 0),
		"truncated":     testFrame(false, ipProtoTCP, 10, false)[:40],
		"tcp-too-short": func() []byte { f := testFrame(false, ipProtoUDP, 4, false); f[23] = ipProtoTCP; return f }(),
		"arp":           frameFor(1, 60),
		"short":         make([]byte, 13),
	}
	frag := testFrame(false, ipProtoUDP, 100, false)
	frag[14+6] = 0x20 // MF
	refuse["fragment"] = frag
	for name, f := range refuse {
		before := append([]byte(nil), f...)
		_, _, ok := l4Partial(f, true)
		require.False(t, ok, name)
		require.Equal(t, before, f, "%s: a refused frame is not written", name)
	}
}

// txRig is a transmit queue on a rig whose device offers CSUM.
func txRig(t *testing.T, packed, csum bool) (*rig, *TxQueue) {
	r := newRig(t, 8, packed, true, 64<<10)
	q := r.txQueue(t, 1500)
	q.csum = csum
	return r, q
}

// TestSendL4Checksum: SendL4Checksum posts the frame with NEEDS_CSUM,
// csum_start and csum_offset, and the pseudo-header sum in the field of
// the queue's copy, so that the device's checksum is the right one; a
// plain Send after it on the same buffer goes with a zero header; frames
// it cannot describe, and a queue without CSUM, are refused with
// nic.ErrNotSupported and post nothing.
func TestSendL4Checksum(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r, q := txRig(t, packed, true)
		require.True(t, q.ChecksumOffload())
		for i := range 20 { // past the ring's size: buffers are reused
			f := testFrame(i%2 == 0, []uint8{ipProtoTCP, ipProtoUDP}[i/2%2], 100+i, false)
			at, want := refChecksum(t, f)
			binary.BigEndian.PutUint16(f[at:], 0)
			caller := append([]byte(nil), f...)
			require.NoError(t, q.SendL4Checksum(f, i))
			require.NoError(t, q.Flush())
			require.Equal(t, caller, f, "the caller's frame is not written")
			tk, ok := r.dev.take()
			require.True(t, ok)
			b := tk.data(0)
			h := decodeNetHdr(b)
			require.Equal(t, uint8(netHdrNeedsCsum), h.flags)
			require.Equal(t, uint8(netHdrGSONone), h.gsoType)
			sent := b[netHdrLen:]
			require.Len(t, sent, len(f))
			deviceChecksum(sent, h)
			require.Equal(t, want, binary.BigEndian.Uint16(sent[at:]), "frame %d: the device's checksum", i)
			r.dev.complete(tk.id, 0, tk.ndesc)

			// The next frame on this buffer id, sent plainly: no offload.
			require.NoError(t, q.Send(f, i))
			require.NoError(t, q.Flush())
			tk, ok = r.dev.take()
			require.True(t, ok)
			require.Equal(t, netHdr{}, decodeNetHdr(tk.data(0)), "a plain send's header")
			r.dev.complete(tk.id, 0, tk.ndesc)
			var cs [4]nic.Completion
			require.Equal(t, 2, q.Poll(cs[:]))
		}
		require.Equal(t, uint64(20), q.txPartial.Load())

		err := q.SendL4Checksum(frameFor(1, 60), nil)
		require.ErrorIs(t, err, nic.ErrNotSupported)
		require.Zero(t, q.Outstanding(), "nothing posted for a refused frame")

		_, plain := txRig(t, packed, false)
		require.False(t, plain.ChecksumOffload())
		err = plain.SendL4Checksum(testFrame(false, ipProtoTCP, 10, false), nil)
		require.ErrorIs(t, err, nic.ErrNotSupported)
		require.Zero(t, plain.Outstanding())
	})
}

// TestRxChecksumHeaders: a queue with GUEST_CSUM reads each frame's header
// once in the read pass: DATA_VALID and NEEDS_CSUM frames are reported
// checked (the IPv4 header checksum verified here); a consumer that keeps
// NEEDS_CSUM frames gets the partial sum and FillChecksum completes it,
// any other gets it completed by the read pass; a frame without flags is
// not checked,
// and a header with what was not negotiated (GSO, RSC) or a checksum
// field outside the frame is an error completion (provBadNetHdr) whose
// buffer goes back to the pool. A queue without the offload ignores the
// header's flags.
func TestRxChecksumHeaders(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 16, packed, true, 128<<10)
		rx := r.rxQueue(t, 32, 2048, true)
		rx.setOffloads(true)
		rx.KeepPartialChecksums(true)
		require.True(t, rx.ChecksumOffload())
		for rx.PostRecv(nil) == nil {
		}
		require.NoError(t, rx.Flush())

		good := testFrame(false, ipProtoTCP, 300, false)
		at, want := refChecksum(t, good)
		binary.BigEndian.PutUint16(good[at:], want)
		partial := append([]byte(nil), good...)
		_, _, ok := l4Partial(partial, true) // as a sender leaves it
		require.True(t, ok)
		badIP := append([]byte(nil), good...)
		badIP[14+8]++ // TTL changed, header checksum not
		v6 := testFrame(true, ipProtoUDP, 50, false)
		send := func(f []byte, h netHdr) {
			tk, ok := r.dev.take()
			require.True(t, ok)
			b := tk.data(0)
			h.numBuffers = 1
			h.encode(b)
			copy(b[netHdrLen:], f)
			r.dev.complete(tk.id, uint32(netHdrLen+len(f)), tk.ndesc)
		}
		send(good, netHdr{flags: netHdrDataValid})
		send(partial, netHdr{flags: netHdrNeedsCsum, csumStart: uint16(at - 16), csumOffset: 16})
		send(badIP, netHdr{flags: netHdrDataValid})
		send(v6, netHdr{flags: netHdrDataValid})
		send(good, netHdr{})
		send(good, netHdr{gsoType: 1, gsoSize: 1448})
		send(good, netHdr{flags: netHdrNeedsCsum, csumStart: uint16(len(good) - 1)})

		var cs [16]nic.Completion
		n := 0
		for n < 7 {
			k := rx.Poll(cs[n:])
			require.NotZero(t, k, "completions read: %d", n)
			n += k
		}
		type verdict struct{ checked, valid bool }
		var got []verdict
		for i, c := range cs[:5] {
			require.NoError(t, c.Err, "frame %d", i)
			ch, va, err := rx.ChecksumVerified(c.Buf)
			require.NoError(t, err)
			got = append(got, verdict{ch, va})
		}
		require.Equal(t, []verdict{{true, true}, {true, true}, {true, false}, {true, true}, {false, false}}, got)

		// The NEEDS_CSUM frame, kept partial, then completed in place.
		require.Equal(t, partial, cs[1].Data)
		require.NoError(t, rx.FillChecksum(cs[1].Buf))
		require.Equal(t, want, binary.BigEndian.Uint16(cs[1].Data[at:]))
		require.Equal(t, good, cs[1].Data)
		before := append([]byte(nil), cs[0].Data...)
		require.NoError(t, rx.FillChecksum(cs[0].Buf), "a DATA_VALID frame is left alone")
		require.Equal(t, before, cs[0].Data)

		for _, c := range cs[5:7] {
			require.ErrorIs(t, c.Err, errBadNetHdr)
			require.Nil(t, c.Data)
		}
		st := OffloadStats{RxDataValid: rx.rxValid.Load(), RxNeedsCsum: rx.rxPartial.Load()}
		require.Equal(t, OffloadStats{RxDataValid: 3, RxNeedsCsum: 1}, st)
		for _, c := range cs[:5] {
			require.NoError(t, rx.Release(c.Buf))
		}
		_, _, err := rx.ChecksumVerified(cs[0].Buf)
		require.True(t, errors.Is(err, nic.ErrBadBuffer), "a released frame: %v", err)
		posted, lent := rx.bufs.Counts()
		require.Equal(t, 16-7, posted)
		require.Zero(t, lent)

		// By default the read pass completes a NEEDS_CSUM frame.
		rx.KeepPartialChecksums(false)
		send(partial, netHdr{flags: netHdrNeedsCsum, csumStart: uint16(at - 16), csumOffset: 16})
		require.Equal(t, 1, rx.Poll(cs[:1]))
		require.NoError(t, cs[0].Err)
		require.Equal(t, good, cs[0].Data, "completed before the consumer sees it")
		ch, va, err := rx.ChecksumVerified(cs[0].Buf)
		require.NoError(t, err)
		require.True(t, ch && va)
		require.NoError(t, rx.Release(cs[0].Buf))

		// Without the offload the flags are not looked at.
		rx.setOffloads(false)
		require.False(t, rx.ChecksumOffload())
		send(good, netHdr{gsoType: 1})
		require.Equal(t, 1, rx.Poll(cs[:1]))
		require.NoError(t, cs[0].Err)
		ch, _, err = rx.ChecksumVerified(cs[0].Buf)
		require.NoError(t, err)
		require.False(t, ch)
		require.NoError(t, rx.Release(cs[0].Buf))
	})
}

// TestBadNetHdrText: a refused header reads as such through a CQ's
// StrError as well as the queue's error.
func TestBadNetHdrText(t *testing.T) {
	s, ok := vqRing{}.StrError(provBadNetHdr, nil)
	require.True(t, ok)
	require.Contains(t, s, "virtio-net header")
	_, ok = vqRing{}.StrError(cq.ProvBadLen, nil)
	require.False(t, ok)
}

// FuzzRxNetHdr: any header and frame length give a clear verdict, and
// for an accepted NEEDS_CSUM header FillChecksum's write stays inside the
// frame.
func FuzzRxNetHdr(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 0, 0, 34, 0, 16, 0, 1, 0}, uint16(74))
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}, uint16(60))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 0}, uint16(1514))
	f.Add([]byte{0, 1, 0, 0, 0xa8, 5, 0, 0, 0, 0, 1, 0}, uint16(1514))
	f.Fuzz(func(t *testing.T, hdr []byte, flen uint16) {
		if len(hdr) < netHdrLen || int(flen) < nic.MinFrame {
			return
		}
		h := decodeNetHdr(hdr)
		m, err := checkRxHdr(h, int(flen))
		if err != nil {
			require.ErrorIs(t, err, errBadNetHdr)
			return
		}
		if m.csum == rxCsumPartial {
			require.LessOrEqual(t, int(m.start)+int(m.off)+2, int(flen))
			require.GreaterOrEqual(t, int(m.start), nic.MinFrame)
		}
	})
}

// TestOffloadNoAllocations: checksum-offloaded sends (SendL4Checksum),
// receives whose headers the read pass checks, and the verdict and fill
// calls a stack makes per frame allocate nothing.
func TestOffloadNoAllocations(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r, tx := txRig(t, packed, true)
		rx := newRig(t, 64, packed, true, 512<<10)
		rq := rx.rxQueue(t, 128, 2048, true)
		rq.setOffloads(true)
		for range 64 {
			require.NoError(t, rq.PostRecv(nil))
		}
		require.NoError(t, rq.Flush())
		frame := testFrame(false, ipProtoTCP, 200, false)
		at, _ := refChecksum(t, frame)
		h := netHdr{flags: netHdrNeedsCsum, csumStart: uint16(at - 16), csumOffset: 16, numBuffers: 1}
		var comps [32]nic.Completion
		ctx := new(int)
		allocs := testing.AllocsPerRun(100, func() {
			for range 8 {
				if err := tx.SendL4Checksum(frame, ctx); err != nil {
					panic(err)
				}
			}
			_ = tx.Flush()
			r.dev.sendAll(tx, comps[:])
			for range 32 {
				tk, ok := rx.dev.take()
				if !ok {
					panic("no receive buffer")
				}
				b := tk.data(0)
				h.encode(b)
				copy(b[netHdrLen:], frame)
				rx.dev.complete(tk.id, uint32(netHdrLen+len(frame)), tk.ndesc)
			}
			for {
				n := rq.Poll(comps[:])
				if n == 0 {
					break
				}
				for _, c := range comps[:n] {
					if c.Err != nil {
						panic(c.Err)
					}
					if ch, _, err := rq.ChecksumVerified(c.Buf); err != nil || !ch {
						panic("not checked")
					}
					if err := rq.FillChecksum(c.Buf); err != nil {
						panic(err)
					}
					_ = rq.Repost(c.Buf, ctx)
				}
			}
			_ = rq.Flush()
		})
		require.Zero(t, allocs)
	})
}
