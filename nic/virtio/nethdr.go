package virtio

// Checksum offloads through the virtio-net header (5.1.6): on transmit
// (VIRTIO_NET_F_CSUM) the driver sets NEEDS_CSUM with csum_start and
// csum_offset, and the device fills in the TCP or UDP checksum; on receive
// (VIRTIO_NET_F_GUEST_CSUM) the device says DATA_VALID (it checked the
// checksum) or NEEDS_CSUM (the frame's checksum was never computed: the
// sender left it to an offload on a virtual wire, and the field holds the
// pseudo-header sum). Both are offered by QEMU only on a backend that
// carries the header (tap), and are the nic API igb's offloads use
// (ChecksumVerified, SendL4Checksum), so that package netstack maps them
// to its checksum capabilities alike.

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
)

// Header flags and GSO types (struct virtio_net_hdr).
const (
	netHdrNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	netHdrDataValid = 2 // VIRTIO_NET_HDR_F_DATA_VALID
	netHdrGSONone   = 0 // VIRTIO_NET_HDR_GSO_NONE
)

// netHdr is struct virtio_net_hdr as VERSION_1 lays it out: 12 bytes,
// little-endian, num_buffers always present.
type netHdr struct {
	flags, gsoType                                     uint8
	hdrLen, gsoSize, csumStart, csumOffset, numBuffers uint16
}

// decodeNetHdr reads a header from b (at least netHdrLen bytes), each
// field once.
func decodeNetHdr(b []byte) netHdr {
	_ = b[netHdrLen-1]
	le := binary.LittleEndian
	return netHdr{flags: b[0], gsoType: b[1], hdrLen: le.Uint16(b[2:]), gsoSize: le.Uint16(b[4:]),
		csumStart: le.Uint16(b[6:]), csumOffset: le.Uint16(b[8:]), numBuffers: le.Uint16(b[10:])}
}

// encode writes h into b (at least netHdrLen bytes).
func (h netHdr) encode(b []byte) {
	_ = b[netHdrLen-1]
	le := binary.LittleEndian
	b[0], b[1] = h.flags, h.gsoType
	le.PutUint16(b[2:], h.hdrLen)
	le.PutUint16(b[4:], h.gsoSize)
	le.PutUint16(b[6:], h.csumStart)
	le.PutUint16(b[8:], h.csumOffset)
	le.PutUint16(b[10:], h.numBuffers)
}

// rxCsum is the checksum state of a received frame, from its header.
type rxCsum uint8

// Checksum states of a received frame.
const (
	rxCsumNone    rxCsum = iota // the device says nothing: whoever reads it checks it
	rxCsumValid                 // DATA_VALID: the device checked the TCP/UDP checksum
	rxCsumPartial               // NEEDS_CSUM: never computed (csum_start, csum_offset say where)
)

// rxMeta is what the read pass keeps of a received frame's header, per
// buffer, for ChecksumVerified and FillChecksum while the frame is lent.
type rxMeta struct {
	csum             rxCsum
	start, off, flen uint16 // csum_start, csum_offset, frame length
}

// Errors of a received header, as completion errors (provBadNetHdr).
var (
	errBadNetHdr = fmt.Errorf("%w: virtio-net header with flags, gso_type or csum_start/csum_offset the driver did not negotiate or that lie outside the frame",
		nic.ErrDeviceStatus)
)

// provBadNetHdr is the device status (a ProvErrno of 0 and up: the
// driver's own) of a frame whose virtio-net header is refused.
const provBadNetHdr cq.ProvErrno = 1

// checkRxHdr checks a received frame's header, read once (h), against
// what was negotiated (receive checksum offload only: no GUEST_TSO, UFO,
// USO or RSC) and the frame's length past the header, and returns what
// the frame's checksum state is. A NEEDS_CSUM frame's checksum field must
// lie after the Ethernet header and within the frame; NEEDS_CSUM wins
// over DATA_VALID.
func checkRxHdr(h netHdr, frameLen int) (rxMeta, error) {
	if h.flags&^(netHdrNeedsCsum|netHdrDataValid) != 0 || h.gsoType != netHdrGSONone {
		return rxMeta{}, errBadNetHdr
	}
	m := rxMeta{flen: uint16(frameLen)}
	switch {
	case h.flags&netHdrNeedsCsum != 0:
		if int(h.csumStart) < nic.MinFrame || int(h.csumStart)+int(h.csumOffset)+2 > frameLen {
			return rxMeta{}, errBadNetHdr
		}
		m.csum, m.start, m.off = rxCsumPartial, h.csumStart, h.csumOffset
	case h.flags&netHdrDataValid != 0:
		m.csum = rxCsumValid
	}
	return m, nil
}

// takeRxHdr is the read pass's step for a frame of an offloading queue
// (c.Buf the buffer, c.Len covering the header): the header read once,
// checked, and its checksum state kept for the buffer. A bad header
// makes c an error completion (provBadNetHdr): false.
func (q *RxQueue) takeRxHdr(c *cqring.Completion) bool {
	b := q.bufs.Of(c.Buf)
	m, err := checkRxHdr(decodeNetHdr(q.bufs.Buf(b)), c.Len-netHdrLen)
	if err != nil {
		c.Err, c.Prov = cq.EIO, provBadNetHdr
		return false
	}
	switch m.csum {
	case rxCsumValid:
		q.rxValid.Add(1)
	case rxCsumPartial:
		q.rxPartial.Add(1)
		if !q.keepPartial {
			// Completed here, so that a consumer that forwards or
			// records frames never passes a partial checksum on.
			fillPartial(q.bufs.Buf(b)[netHdrLen:netHdrLen+int(m.flen)], m)
			m.csum = rxCsumValid
		}
	}
	q.meta[b] = m
	return true
}

// KeepPartialChecksums says whether the queue's consumer takes frames the
// device delivers with NEEDS_CSUM as they come: their TCP or UDP checksum
// field then holds only the pseudo-header sum (Linux's CHECKSUM_PARTIAL),
// ChecksumVerified counts them as checked and FillChecksum completes one
// on demand. By default (false) the read pass completes each such frame
// before the consumer sees it, so that a program that forwards or records
// frames (vfnic fwd, capture) never passes a partial checksum on; a
// network stack that trusts the device's verdict (package netstack with
// receive checksum offload) asks to keep them and saves the sum.
func (q *RxQueue) KeepPartialChecksums(keep bool) {
	q.Mu.Lock()
	q.keepPartial = keep
	q.Mu.Unlock()
}

// setOffloads switches the queue's receive checksum offload on
// (GUEST_CSUM negotiated): the read pass then checks each header.
func (q *RxQueue) setOffloads(csum bool) {
	q.csum = csum
	if csum && q.meta == nil {
		q.meta = make([]rxMeta, q.bufs.Cap())
	}
}

// lentMeta returns the header state and bytes of the frame lent at buf.
// Called locked.
func (q *RxQueue) lentMeta(buf uintptr) (rxMeta, []byte, error) {
	if q.Closed {
		return rxMeta{}, nil, nic.ErrClosed
	}
	b, err := q.bufs.Lent(buf)
	if err != nil {
		return rxMeta{}, nil, err
	}
	if !q.csum {
		return rxMeta{}, nil, nil
	}
	m := q.meta[b]
	return m, q.bufs.Buf(b)[netHdrLen : netHdrLen+int(m.flen)], nil
}

// ChecksumVerified reports what the device said of the received frame at
// buf (a completion's Buf, while the frame is lent): checked is true when
// its TCP or UDP checksum needs no check by the receiver, either because
// the device verified it (DATA_VALID) or because it was never computed
// (NEEDS_CSUM: a sender on this virtual wire left it to an offload, and
// the field holds only the pseudo-header sum; FillChecksum computes it).
// For IPv4 the header checksum, which the device does not vouch for, is
// checked here too; valid is false when it is wrong. A frame the device
// said nothing of, or a queue without receive checksum offload, is
// checked false. It is the receive side of a network stack's checksum
// offload (package netstack) in basic types, as igb's is.
func (q *RxQueue) ChecksumVerified(buf uintptr) (checked, valid bool, err error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	m, f, err := q.lentMeta(buf)
	if err != nil || m.csum == rxCsumNone {
		return false, false, err
	}
	ok, isIPv4 := ipv4HeaderValid(f)
	return true, ok || !isIPv4, nil
}

// FillChecksum computes, in place, the checksum of a received frame that
// the device delivered with NEEDS_CSUM (see ChecksumVerified), from
// csum_start to the frame's end, into the field at csum_start+csum_offset
// that holds the pseudo-header sum: the frame is then what a wire without
// offloads would have carried. Other frames are left alone. It is for a
// receiver that checks every checksum itself (package netstack with
// receive checksum offload off).
func (q *RxQueue) FillChecksum(buf uintptr) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	m, f, err := q.lentMeta(buf)
	if err != nil || m.csum != rxCsumPartial {
		return err
	}
	fillPartial(f, m)
	q.meta[q.bufs.Of(buf)].csum = rxCsumValid // complete now: a second fill would sum the sum
	return nil
}

// fillPartial writes the checksum of a NEEDS_CSUM frame f, from csum_start
// to its end, into the field at csum_start+csum_offset that holds the
// pseudo-header sum. checkRxHdr bounded start+off+2 by the frame's length.
func fillPartial(f []byte, m rxMeta) {
	at := int(m.start) + int(m.off)
	binary.BigEndian.PutUint16(f[at:], ^onesSum(f[m.start:], 0))
}

// ipv4HeaderValid checks the header checksum of an IPv4 frame (isIPv4
// false for any other frame, or one too short to hold the header it
// claims).
func ipv4HeaderValid(f []byte) (ok, isIPv4 bool) {
	ipOff, et, ok := l3(f)
	if !ok || et != etherIPv4 {
		return false, false
	}
	ip := f[ipOff:]
	if len(ip) < 20 || ip[0]>>4 != 4 {
		return false, false
	}
	hl := int(ip[0]&0xf) * 4
	if hl < 20 || hl > len(ip) {
		return false, false
	}
	return onesSum(ip[:hl], 0) == 0xffff, true
}

// EtherTypes the offloads parse.
const (
	etherIPv4  = 0x0800
	etherIPv6  = 0x86dd
	etherVLAN  = 0x8100
	etherQinQ  = 0x88a8
	ipProtoTCP = 6
	ipProtoUDP = 17
)

// l3 finds the network header of a frame past up to two VLAN tags: its
// offset and EtherType.
func l3(f []byte) (off int, et uint16, ok bool) {
	off = 12
	for range 3 {
		if len(f) < off+2 {
			return 0, 0, false
		}
		et = binary.BigEndian.Uint16(f[off:])
		if et != etherVLAN && et != etherQinQ {
			return off + 2, et, true
		}
		off += 4
	}
	return 0, 0, false
}

// l4Partial prepares a whole (unfragmented) TCP or UDP frame over IPv4 or
// IPv6 (no extension headers) for the device to checksum: it writes the
// pseudo-header sum into the checksum field, as the specification asks,
// and returns csum_start and csum_offset. ok is false for anything else,
// and for a frame with bytes after its IP packet (the device would sum
// them too). With write false it only checks.
func l4Partial(f []byte, write bool) (start, off uint16, ok bool) {
	ipOff, et, ok := l3(f)
	if !ok {
		return 0, 0, false
	}
	ip := f[ipOff:]
	var proto uint8
	var sum uint32
	var l4 int // offset of the segment in f
	switch et {
	case etherIPv4:
		if len(ip) < 20 || ip[0]>>4 != 4 {
			return 0, 0, false
		}
		hl, tl := int(ip[0]&0xf)*4, int(binary.BigEndian.Uint16(ip[2:]))
		if hl < 20 || tl < hl || tl != len(ip) || binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 { // MF or an offset: a fragment
			return 0, 0, false
		}
		proto, l4 = ip[9], ipOff+hl
		sum = sum16(ip[12:20]) + uint32(proto) + uint32(tl-hl)
	case etherIPv6:
		if len(ip) < 40 || ip[0]>>4 != 6 || int(binary.BigEndian.Uint16(ip[4:]))+40 != len(ip) {
			return 0, 0, false
		}
		proto, l4 = ip[6], ipOff+40
		sum = sum16(ip[8:40]) + uint32(proto) + uint32(len(ip)-40)
	default:
		return 0, 0, false
	}
	seg := len(f) - l4
	switch {
	case proto == ipProtoTCP && seg >= 20:
		off = 16
	case proto == ipProtoUDP && seg >= 8:
		off = 6
	default:
		return 0, 0, false
	}
	if l4 > 0xffff {
		return 0, 0, false
	}
	if write {
		binary.BigEndian.PutUint16(f[l4+int(off):], fold(sum))
	}
	return uint16(l4), off, true
}

// sum16 adds big-endian 16-bit words of b (even length).
func sum16(b []byte) uint32 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	return s
}

// fold folds a 32-bit sum into 16 bits of ones' complement.
func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// onesSum is the ones' complement sum of b (an odd last byte padded with
// zero) plus seed, folded.
func onesSum(b []byte, seed uint16) uint16 {
	s := uint64(seed)
	n := len(b) &^ 1
	for i := 0; i < n; i += 2 {
		s += uint64(b[i])<<8 | uint64(b[i+1])
	}
	if n < len(b) {
		s += uint64(b[n]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// errNoL4 is SendL4Checksum's refusal of a frame it cannot describe to
// the device (prepared: a stack falls back to its own checksum per frame).
var errNoL4 = fmt.Errorf("%w: virtio: not a whole TCP or UDP frame over IPv4 or IPv6 without extension headers", nic.ErrNotSupported)

// errNoCsum is SendL4Checksum's refusal on a queue without transmit
// checksum offload (CSUM not offered, or turned off).
var errNoCsum = fmt.Errorf("%w: virtio: transmit checksum offload (CSUM) not negotiated", nic.ErrNotSupported)

// SendL4Checksum is Send with the device filling in the frame's TCP or
// UDP checksum (VIRTIO_NET_F_CSUM): the header says NEEDS_CSUM with the
// segment's start and the checksum field's offset, and the checksum field
// of the queue's copy is set to the pseudo-header sum, as the
// specification asks (the caller's contents of the field do not matter;
// the IPv4 header checksum is the caller's). Frames it cannot describe
// (not TCP or UDP, fragments, IPv6 extension headers, bytes after the IP
// packet), and any frame on a queue without the offload, fail with an
// error matching nic.ErrNotSupported, as igb's do; nothing is posted
// then. It is the transmit side of a network stack's checksum offload
// (package netstack) in basic types.
func (q *TxQueue) SendL4Checksum(frame []byte, ctx any) error {
	if !q.csum {
		return errNoCsum
	}
	return q.send(len(frame), ctx, frame, nil, true)
}

// OffloadStats count what the checksum offloads did since Open.
type OffloadStats struct {
	// RxDataValid and RxNeedsCsum count frames received with
	// DATA_VALID (checked by the device) and with NEEDS_CSUM (checksum
	// never computed) in their header.
	RxDataValid, RxNeedsCsum uint64
	// TxNeedsCsum counts frames sent with NEEDS_CSUM (SendL4Checksum).
	TxNeedsCsum uint64
}

// OffloadStats sums the queues' offload counters.
func (d *Device) OffloadStats() OffloadStats {
	var s OffloadStats
	for _, q := range d.rx {
		s.RxDataValid += q.rxValid.Load()
		s.RxNeedsCsum += q.rxPartial.Load()
	}
	for _, q := range d.tx {
		s.TxNeedsCsum += q.txPartial.Load()
	}
	return s
}

// offloadCounters are a queue's offload counters: atomics, read by
// OffloadStats while the queue runs.
type offloadCounters struct {
	rxValid, rxPartial, txPartial atomic.Uint64
}

// ChecksumOffload reports whether the device checks received checksums
// (GUEST_CSUM negotiated): ChecksumVerified can then report frames
// checked.
func (q *RxQueue) ChecksumOffload() bool { return q.csum }

// ChecksumOffload reports whether the device fills in checksums (CSUM
// negotiated): SendL4Checksum works.
func (q *TxQueue) ChecksumOffload() bool { return q.csum }
