package igb

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
)

// TxChecksum names the checksums SendChecksum has the device compute.
type TxChecksum uint8

// Transmit checksum offloads (POPTS of the advanced data descriptor).
const (
	// TxIPv4 has the device fill in the IPv4 header checksum (IXSM).
	TxIPv4 TxChecksum = 1 << iota
	// TxL4 has the device fill in the TCP or UDP checksum (TXSM), over
	// IPv4 or IPv6.
	TxL4
)

// Errors of SendChecksum, prepared once.
var (
	errOffloadFrame = fmt.Errorf("%w: igb: checksum offload needs Ethernet (one VLAN tag at most), "+
		"then IPv4 or IPv6 without extension headers, then TCP or UDP for TxL4", nic.ErrNotSupported)
	errOffloadKind = fmt.Errorf("%w: igb: checksum offload: unknown TxChecksum bits, or TxIPv4 on a frame that is not IPv4", nic.ErrInvalid)
)

// txContext is what a transmit context descriptor tells the device about
// the frames that name it: the header lengths and protocols its checksum
// engine needs.
type txContext struct {
	macLen, ipLen uint16
	ipv4, tcp     bool
}

// ctxSlot is the context posted in the operation table for a context
// descriptor, so that the queue knows that completion for its own.
var ctxSlot = new(byte)

// headers finds what the device needs to checksum frame: the context, the
// offset of the L4 checksum field (0 without TxL4) and the pseudo-header
// sum to seed it with.
func headers(frame []byte, cs TxChecksum) (c txContext, l4sum int, seed uint16, err error) {
	if cs == 0 || cs&^(TxIPv4|TxL4) != 0 {
		return c, 0, 0, errOffloadKind
	}
	off := 12
	et := binary.BigEndian.Uint16(frame[off:])
	if et == 0x8100 {
		off += 4
		if len(frame) < off+2 {
			return c, 0, 0, errOffloadFrame
		}
		et = binary.BigEndian.Uint16(frame[off:])
	}
	c.macLen = uint16(off + 2)
	ip := frame[c.macLen:]
	var proto byte
	var l4len int
	var sum uint32
	switch et {
	case 0x0800:
		if len(ip) < 20 || ip[0]>>4 != 4 {
			return c, 0, 0, errOffloadFrame
		}
		c.ipv4, c.ipLen = true, uint16(ip[0]&0xf)*4
		total := int(binary.BigEndian.Uint16(ip[2:]))
		if c.ipLen < 20 || total < int(c.ipLen) || total > len(ip) {
			return c, 0, 0, errOffloadFrame
		}
		proto, l4len = ip[9], total-int(c.ipLen)
		sum = sum16(ip[12:20])
	case 0x86DD:
		if len(ip) < 40 || ip[0]>>4 != 6 {
			return c, 0, 0, errOffloadFrame
		}
		c.ipLen = 40
		proto, l4len = ip[6], int(binary.BigEndian.Uint16(ip[4:]))
		if 40+l4len > len(ip) {
			return c, 0, 0, errOffloadFrame
		}
		sum = sum16(ip[8:40])
	default:
		return c, 0, 0, errOffloadFrame
	}
	if cs&TxIPv4 != 0 && !c.ipv4 {
		return c, 0, 0, errOffloadKind
	}
	if cs&TxL4 == 0 {
		return c, 0, 0, nil
	}
	var field int
	switch proto {
	case 6:
		c.tcp, field = true, 16
	case 17:
		field = 6
	default:
		return c, 0, 0, errOffloadFrame
	}
	if l4len < field+2 {
		return c, 0, 0, errOffloadFrame
	}
	// The device adds the L4 header and payload to what the field holds:
	// the pseudo-header sum, not complemented (as Linux's CHECKSUM_PARTIAL
	// and DPDK's rte_ipv4_phdr_cksum leave it for Intel NICs).
	sum += uint32(proto) + uint32(l4len)
	return c, int(c.macLen+c.ipLen) + field, fold(sum), nil
}

// sum16 adds b (even length) as big-endian 16-bit words.
func sum16(b []byte) uint32 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	return s
}

// fold folds a one's-complement sum to 16 bits.
func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// SendChecksum is Send with checksum offload: the device computes the
// checksums cs names (the IPv4 header's, the TCP or UDP one over IPv4 or
// IPv6) and writes them into the frame it sends; the caller's frame is
// not changed. The frame needs Ethernet with at most one VLAN tag, then
// IPv4 (options allowed) or IPv6 without extension headers; anything else
// is an error matching nic.ErrNotSupported, and the caller computes the
// checksum itself.
//
// The device learns the header lengths from a context descriptor, which
// takes a ring slot of its own: the queue keeps the device's two contexts
// (IDX 0 and 1) and writes a new one only when a frame's headers differ
// from both, as DPDK's igb PMD does. The device writes nothing back for a
// context descriptor; the queue counts it done once the descriptor after
// it (the frame's own) is, since the device works through the ring in
// order.
func (q *TxQueue) SendChecksum(frame []byte, ctx any, cs TxChecksum) error {
	if len(frame) < nic.MinFrame || len(frame) > q.maxFrame {
		return errFrameSize
	}
	c, l4sum, seed, err := headers(frame, cs)
	if err != nil {
		return err
	}
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.Usable(); err != nil {
		return err
	}
	idx := -1
	for i := range q.ctxs {
		if q.ctxs[i] == c { // an unwritten context is zero, and c.macLen is at least 14
			idx = i
		}
	}
	if idx < 0 {
		// A context descriptor and the frame's: two slots, one stays empty.
		if q.out+2 > int(q.n)-1 {
			return errNoDesc
		}
		idx = int(q.ctxNext)
		if err := q.postContext(c, idx); err != nil {
			return err
		}
		q.ctxs[idx], q.ctxNext = c, q.ctxNext^1
	} else if !q.room() {
		return errNoDesc
	}
	buf, err := q.take(len(frame), frame, nil, ctx)
	if err != nil {
		return err
	}
	olinfo := uint64(idx) << txdIdxSh
	if cs&TxIPv4 != 0 {
		olinfo |= txdPoptsIXSM
		binary.BigEndian.PutUint16(buf[c.macLen+10:], 0) // the device sums the header over a zero field
	}
	if cs&TxL4 != 0 {
		olinfo |= txdPoptsTXSM
		binary.BigEndian.PutUint16(buf[l4sum:], seed)
	}
	q.commit(len(buf), olinfo)
	return nil
}

// postContext writes a context descriptor for c into context idx at the
// tail. Called locked, with room for it and a data descriptor.
func (q *TxQueue) postContext(c txContext, idx int) error {
	if err := q.postTail(ctxSlot, 0, 0, qcore.Own); err != nil {
		return err
	}
	lens := uint64(c.ipLen) | uint64(c.macLen)<<txcMACLenSh
	cmd := uint64(txcDTypCtx | txdCmdDEXT)
	if c.ipv4 {
		cmd |= txcTUCmdIPv4
	}
	if c.tcp {
		cmd |= txcTUCmdL4TCP
	}
	// Word 0: vlan_macip_lens, seqnum_seed 0; word 1: type_tucmd_mlhl,
	// mss_l4len_idx (the index; no segmentation).
	q.writeDesc(q.tail, lens, cmd|uint64(idx)<<txcIdxSh<<32)
	q.silent[q.tail] = true
	q.ctxOut++
	q.advance()
	return nil
}

// settle completes the context descriptor at the head of the ring once
// the device has written back the descriptor after it (always the data
// descriptor posted with it): the device handles descriptors in ring
// order, so it has used the context by then. It writes DD into the slot,
// as the device would for a data descriptor, so that the ring reader takes
// it in order. It reports whether the head is anything but a context
// descriptor still in use. Called locked.
func (q *queue) settle() bool {
	if q.silent == nil {
		return true
	}
	h := q.r.src.Ring().Head()
	if !q.silent[h] {
		return true
	}
	next := unsafe.Pointer(&q.desc[uintptr((h+1)&(q.n-1))*descSize+12])
	if atomic.LoadUint32((*uint32)(next))&txdStatusDD == 0 {
		return false
	}
	q.silent[h] = false
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&q.desc[uintptr(h)*descSize+12])), txdStatusDD)
	return true
}
