package vfio

// Byte fixtures shaped like the kernel's INFO answers: a fixed part, then
// capabilities appended at 8-byte aligned offsets (as vfio_info_cap_add
// lays them out), each header's next pointing at the following one.

type capFix struct {
	id, ver uint16
	payload []byte // bytes after the 8-byte header
}

func le32(v uint32) []byte { b := make([]byte, 4); ne.PutUint32(b, v); return b }
func le64(v uint64) []byte { b := make([]byte, 8); ne.PutUint64(b, v); return b }

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// appendCaps lays caps out after buf and links them; it returns the buffer
// and the offset of the first capability (0 if none) and of each cap.
func appendCaps(buf []byte, caps []capFix) ([]byte, []int) {
	offs := make([]int, len(caps))
	for i, c := range caps {
		for len(buf)%8 != 0 {
			buf = append(buf, 0)
		}
		offs[i] = len(buf)
		hdr := make([]byte, 8)
		ne.PutUint16(hdr[0:], c.id)
		ne.PutUint16(hdr[2:], c.ver)
		buf = append(buf, hdr...)
		buf = append(buf, c.payload...)
	}
	for len(buf)%8 != 0 {
		buf = append(buf, 0)
	}
	for i := 0; i+1 < len(offs); i++ {
		ne.PutUint32(buf[offs[i]+4:], uint32(offs[i+1]))
	}
	return buf, offs
}

// iommuInfoFix builds a struct vfio_iommu_type1_info with caps.
func iommuInfoFix(pgsizes uint64, caps ...capFix) []byte {
	buf := make([]byte, sizeofIOMMUInfo)
	flags := uint32(IOMMUFlagPageSizes)
	buf, offs := appendCaps(buf, caps)
	if len(caps) > 0 {
		flags |= uint32(IOMMUFlagCaps)
		ne.PutUint32(buf[16:], uint32(offs[0]))
	}
	ne.PutUint32(buf[0:], uint32(len(buf)))
	ne.PutUint32(buf[4:], flags)
	ne.PutUint64(buf[8:], pgsizes)
	return buf
}

func iovaCap(rs ...IOVARange) capFix {
	p := cat(le32(uint32(len(rs))), le32(0))
	for _, r := range rs {
		p = cat(p, le64(r.Start), le64(r.End))
	}
	return capFix{id: iommuCapIOVARange, ver: 1, payload: p}
}

func dmaAvailCap(n uint32) capFix {
	return capFix{id: iommuCapDMAAvail, ver: 1, payload: le32(n)}
}

func migrationCap() capFix {
	return capFix{id: iommuCapMigration, ver: 1, payload: cat(le32(0), le32(0), le64(0x1000), le64(1<<26))}
}

// regionInfoFix builds a struct vfio_region_info with caps.
func regionInfoFix(index uint32, flags RegionFlags, size, offset uint64, caps ...capFix) []byte {
	buf := make([]byte, sizeofRegionInfo)
	buf, offs := appendCaps(buf, caps)
	if len(caps) > 0 {
		flags |= RegionFlagCaps
		ne.PutUint32(buf[12:], uint32(offs[0]))
	}
	ne.PutUint32(buf[0:], uint32(len(buf)))
	ne.PutUint32(buf[4:], uint32(flags))
	ne.PutUint32(buf[8:], index)
	ne.PutUint64(buf[16:], size)
	ne.PutUint64(buf[24:], offset)
	return buf
}

func sparseCap(areas ...SparseArea) capFix {
	p := cat(le32(uint32(len(areas))), le32(0))
	for _, a := range areas {
		p = cat(p, le64(a.Offset), le64(a.Size))
	}
	return capFix{id: regionCapSparseMmap, ver: 1, payload: p}
}

func msixMappableCap() capFix { return capFix{id: regionCapMSIXMappable, ver: 1} }

func typeCap(typ, sub uint32) capFix {
	return capFix{id: regionCapType, ver: 1, payload: cat(le32(typ), le32(sub))}
}

// QEMU guest with intel-iommu aw-bits=48: the MSI window splits the space.
var holeyRanges = []IOVARange{{0, 0xfedfffff}, {0xfef00000, 1<<48 - 1}}
