package afxdp

import (
	cqring "github.com/vfnic/vfnic/cq/ring"
)

// Sizes of the rings' entries.
const (
	descSize = 16 // struct xdp_desc: u64 addr, u32 len, u32 options
	addrSize = 8  // fill and completion rings: u64 addr
)

// headroom is where the kernel puts a received frame in its chunk:
// XDP_PACKET_HEADROOM, with no UMEM headroom of our own.
const headroom = 256

// addrFields are the fields of a UMEM address as the ring reader decodes
// it for a UMEM of chunks of 1<<shift bytes: the chunk, which is the id of
// the buffer's posting (the table's slot), from bit shift up for 32 bits;
// Meta[0] the offset in the chunk; Meta[1] the bits above the 32 of the
// id, which must be zero. Every bit of the address is read, once.
func addrFields(shift int) cqring.Fields {
	return cqring.Fields{
		ID:   cqring.Field{Off: 0, Bits: 32, Shift: shift},
		Meta: [2]cqring.Field{{Off: 0, Bits: shift}, {Off: 0, Bits: 64 - 32 - shift, Shift: 32 + shift}},
	}
}

// RxLayout describes an AF_XDP receive ring of n descriptors in a UMEM of
// chunks of 1<<shift bytes: struct xdp_desc entries behind a free-running
// 32-bit producer index (RingRegs.Producer), whose address names the
// buffer (addrFields), len the frame's length and options (Status) must
// be 0: XDP_PKT_CONTD, a frame continued in the next buffer, is never
// asked for (no XDP_USE_SG).
func RxLayout(n, shift int) cqring.Layout {
	f := addrFields(shift)
	f.Len = cqring.Field{Off: 8, Bits: 32}
	f.Status = cqring.Field{Off: 12, Bits: 32}
	return cqring.Layout{Name: "xsk-rx", EntrySize: descSize, Entries: n,
		Convention: cqring.UsedIndex, IndexBits: 32, Doorbell: cqring.DoorbellCount, Fields: f}
}

// CompLayout describes an AF_XDP completion ring of n entries: the UMEM
// addresses of the sent buffers (addrFields) behind a free-running
// producer index. A completion carries no length: the posted one is
// reported.
func CompLayout(n, shift int) cqring.Layout {
	return cqring.Layout{Name: "xsk-completion", EntrySize: addrSize, Entries: n,
		Convention: cqring.UsedIndex, IndexBits: 32, Doorbell: cqring.DoorbellCount, Fields: addrFields(shift)}
}
